//! Image operations of a [`DockerNode`] beyond inspect and import: building from a context the
//! tool generates, streaming an image out of one daemon (`docker save`) and into another
//! (`docker load`) — for a worker through its SSH-forwarded socket — and tagging.

use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::{
    BuildImageOptionsBuilder, ImportImageOptionsBuilder, TagImageOptionsBuilder,
};
use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::{DockerError, DockerNode, split_reference};

impl DockerNode {
    /// Builds `tag` from a tar `context` holding a `Dockerfile`, never pulling (no registry is
    /// assumed: the base must be present), with `labels` on the image; returns the image id.
    ///
    /// # Errors
    ///
    /// [`DockerError::BuildImage`] with the builder's message.
    pub async fn build_image(
        &self,
        tag: &str,
        context: Vec<u8>,
        labels: &HashMap<String, String>,
    ) -> Result<String, DockerError> {
        let opts = BuildImageOptionsBuilder::default()
            .dockerfile("Dockerfile")
            .t(tag)
            .rm(true)
            .forcerm(true)
            .pull("false")
            .labels(labels)
            .build();
        let docker = self.docker_with_timeout(Duration::from_secs(3600));
        let mut stream =
            docker.build_image(opts, None, Some(bollard::body_full(Bytes::from(context))));
        let fail = |detail: String| DockerError::BuildImage {
            node: self.node.clone(),
            image: tag.to_owned(),
            detail,
        };
        let mut tail = Vec::new();
        while let Some(item) = stream.next().await {
            let info = match item {
                Ok(i) => i,
                Err(e) => return Err(self.classify(fail(e.to_string())).await),
            };
            if let Some(d) = info.error_detail.and_then(|d| d.message) {
                return Err(fail(d));
            }
            if let Some(s) = info.stream {
                tail.push(s.trim_end().to_owned());
            }
        }
        self.inspect_image(tag)
            .await?
            .and_then(|i| i.id)
            .ok_or_else(|| {
                fail(format!(
                    "no image {tag} after the build: {}",
                    tail.join(" | ")
                ))
            })
    }

    /// `docker save` of one image as a byte stream.
    pub fn save_image(
        &self,
        image: &str,
    ) -> impl Stream<Item = Result<Bytes, DockerError>> + Send + 'static {
        let docker = self.docker_with_timeout(Duration::from_secs(3600));
        let (node, name) = (self.node.clone(), image.to_owned());
        docker.export_image(image).map(move |r| {
            r.map_err(|e| DockerError::ImageTransfer {
                node: node.clone(),
                op: "save",
                image: name.clone(),
                source: Box::new(e),
            })
        })
    }

    /// `docker load` of a byte stream (a `docker save` tar).
    ///
    /// # Errors
    ///
    /// [`DockerError::ImageTransfer`] (or [`DockerError::TunnelDown`]).
    pub async fn load_image<S>(&self, image: &str, tar: S) -> Result<(), DockerError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let docker = self.docker_with_timeout(Duration::from_secs(3600));
        let opts = ImportImageOptionsBuilder::default().quiet(true).build();
        let mut stream = docker.import_image_stream(opts, tar, None);
        while let Some(item) = stream.next().await {
            let info = self
                .op(item, |source| DockerError::ImageTransfer {
                    node: self.node.clone(),
                    op: "load",
                    image: image.to_owned(),
                    source,
                })
                .await?;
            if let Some(d) = info.error_detail.and_then(|d| d.message) {
                return Err(DockerError::BuildImage {
                    node: self.node.clone(),
                    image: image.to_owned(),
                    detail: format!("docker load: {d}"),
                });
            }
        }
        Ok(())
    }

    /// Tags `source` (a name or an id) as `reference`.
    ///
    /// # Errors
    ///
    /// [`DockerError::ImageTransfer`].
    pub async fn tag_image(&self, source: &str, reference: &str) -> Result<(), DockerError> {
        let (repo, tag) = split_reference(reference);
        let opts = TagImageOptionsBuilder::default()
            .repo(repo)
            .tag(tag)
            .build();
        let r = self.docker.tag_image(source, Some(opts)).await;
        self.op(r, |e| DockerError::ImageTransfer {
            node: self.node.clone(),
            op: "tag",
            image: reference.to_owned(),
            source: e,
        })
        .await
    }
}
