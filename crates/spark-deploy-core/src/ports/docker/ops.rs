//! Docker operations of a [`DockerNode`]: images, containers, networks, volumes.
//!
//! Longer than most modules on purpose: it is the Docker port's whole surface, one small method
//! per daemon call, each mapping bollard's error into the port's [`DockerError`] with the node and
//! object named. Splitting it by object kind would scatter that one mapping.

use std::io;
use std::path::Path;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerSummary, EndpointIpamConfig,
    EndpointSettings, ImageInspect, ImageSummary, Network, NetworkConnectRequest,
    NetworkCreateRequest, NetworkInspect, SystemInfo, SystemVersion, Volume,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ListContainersOptionsBuilder,
    ListImagesOptionsBuilder, ListNetworksOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder, RemoveVolumeOptionsBuilder,
};
use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::{
    DockerError, DockerNode, Removed, file_stream, is_not_found, label_filter, split_reference,
};

impl DockerNode {
    /// `GET /_ping`.
    ///
    /// # Errors
    ///
    /// [`DockerError::Ping`], or [`DockerError::TunnelDown`] when the worker's SSH is gone.
    pub async fn ping(&self) -> Result<(), DockerError> {
        let r = self.docker.ping().await.map(|_| ());
        self.op(r, |source| DockerError::Ping {
            node: self.node.clone(),
            via: self.via.clone(),
            source,
        })
        .await
    }

    /// `GET /version`.
    ///
    /// # Errors
    ///
    /// [`DockerError::Version`] (or [`DockerError::TunnelDown`]).
    pub async fn version(&self) -> Result<SystemVersion, DockerError> {
        let r = self.docker.version().await;
        self.op(r, |source| DockerError::Version {
            node: self.node.clone(),
            source,
        })
        .await
    }

    /// `GET /info`: runtimes, CDI spec directories, resources.
    ///
    /// # Errors
    ///
    /// [`DockerError::Info`] (or [`DockerError::TunnelDown`]).
    pub async fn info(&self) -> Result<SystemInfo, DockerError> {
        let r = self.docker.info().await;
        self.op(r, |source| DockerError::Info {
            node: self.node.clone(),
            source,
        })
        .await
    }

    /// Running containers that requested a GPU (a device request with the `gpu` capability or the
    /// `nvidia` driver), inspected one by one: `(name, labels)` of each.
    ///
    /// # Errors
    ///
    /// [`DockerError::List`] or [`DockerError::Inspect`].
    pub async fn gpu_containers(
        &self,
    ) -> Result<Vec<(String, std::collections::HashMap<String, String>)>, DockerError> {
        let opts = ListContainersOptionsBuilder::default().all(false).build();
        let r = self.docker.list_containers(Some(opts)).await;
        let running = self
            .op(r, |e| self.list_err("containers", "running", e))
            .await?;
        let mut out = Vec::new();
        for c in running {
            let Some(id) = c.id else { continue };
            let Some(info) = self.inspect_container(&id).await? else {
                continue;
            };
            let gpu = info
                .host_config
                .as_ref()
                .and_then(|h| h.device_requests.as_ref())
                .is_some_and(|reqs| {
                    reqs.iter().any(|d| {
                        d.driver.as_deref() == Some("nvidia")
                            || d.capabilities
                                .iter()
                                .flatten()
                                .flatten()
                                .any(|c| c == "gpu")
                    })
                });
            if gpu {
                let name = info
                    .name
                    .map_or(id, |n| n.trim_start_matches('/').to_owned());
                let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
                out.push((name, labels));
            }
        }
        Ok(out)
    }

    /// Imports a root filesystem tar as image `reference` (`docker import`: `create_image` with
    /// `fromSrc=-` and the tar as body). `changes` are Dockerfile instructions applied to the
    /// image config (`LABEL k=v`, `CMD [...]`, `ENV K=V`, ...). Returns the image id.
    ///
    /// # Errors
    ///
    /// [`DockerError::ImportImage`] (or [`DockerError::TunnelDown`]).
    pub async fn import_image<S>(
        &self,
        reference: &str,
        changes: &[String],
        tar: S,
    ) -> Result<String, DockerError>
    where
        S: Stream<Item = Result<Bytes, io::Error>> + Send + 'static,
    {
        let (repo, tag) = split_reference(reference);
        let opts = CreateImageOptionsBuilder::default()
            .from_src("-")
            .repo(repo)
            .tag(tag)
            .changes(changes.to_vec())
            .build();
        let docker = self.docker_with_timeout(Duration::from_secs(3600));
        let mut stream = docker.create_image(Some(opts), Some(bollard::body_try_stream(tar)), None);
        let mut last_status = None;
        while let Some(item) = stream.next().await {
            let info = self
                .op(item, |source| DockerError::ImportImage {
                    node: self.node.clone(),
                    image: reference.to_owned(),
                    source,
                })
                .await?;
            if let Some(s) = info.status {
                last_status = Some(s);
            }
        }
        // The id arrives as the final status ("sha256:..."); inspect to be sure it landed.
        match self.inspect_image(reference).await? {
            Some(img) => Ok(img.id.or(last_status).unwrap_or_default()),
            None => Err(DockerError::ImportImage {
                node: self.node.clone(),
                image: reference.to_owned(),
                source: Box::new(BollardError::DockerStreamError {
                    error: format!(
                        "import finished but the image is absent (last status: {})",
                        last_status.unwrap_or_default()
                    ),
                }),
            }),
        }
    }

    /// [`DockerNode::import_image`] from a tar file on this machine, streamed in 1 MiB chunks.
    ///
    /// # Errors
    ///
    /// [`DockerError::ReadArchive`] when the file cannot be opened; otherwise as
    /// [`DockerNode::import_image`].
    pub async fn import_image_file(
        &self,
        reference: &str,
        changes: &[String],
        tar: &Path,
    ) -> Result<String, DockerError> {
        let file = tokio::fs::File::open(tar)
            .await
            .map_err(|source| DockerError::ReadArchive {
                node: self.node.clone(),
                path: tar.to_owned(),
                source,
            })?;
        self.import_image(reference, changes, file_stream(file))
            .await
    }

    /// Inspects an image; `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn inspect_image(&self, name: &str) -> Result<Option<ImageInspect>, DockerError> {
        match self.docker.inspect_image(name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(self.inspect_err("image", name, e)).await),
        }
    }

    /// Inspects a container; `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn inspect_container(
        &self,
        name: &str,
    ) -> Result<Option<ContainerInspectResponse>, DockerError> {
        match self.docker.inspect_container(name, None).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(self.inspect_err("container", name, e)).await),
        }
    }

    /// The state of container `name`: the one "is it running" query every caller uses. A
    /// container that does not exist is reported as such (not running, no exit code); a daemon
    /// that does not answer is an error, never "not running".
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn container_state(&self, name: &str) -> Result<super::ContainerState, DockerError> {
        let info = self.inspect_container(name).await?;
        let state = info.as_ref().and_then(|c| c.state.as_ref());
        Ok(super::ContainerState {
            exists: info.is_some(),
            running: state.and_then(|s| s.running).unwrap_or(false),
            exit_code: state.and_then(|s| s.exit_code),
            restart_count: info.as_ref().and_then(|c| c.restart_count),
            id: info.as_ref().and_then(|c| c.id.clone()),
            started_at: state.and_then(|s| s.started_at.clone()),
            labels: info
                .and_then(|c| c.config)
                .and_then(|c| c.labels)
                .unwrap_or_default(),
        })
    }

    /// Inspects a network; `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn inspect_network(&self, name: &str) -> Result<Option<NetworkInspect>, DockerError> {
        match self.docker.inspect_network(name, None).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(self.inspect_err("network", name, e)).await),
        }
    }

    fn inspect_err(&self, kind: &'static str, name: &str, source: BollardError) -> DockerError {
        DockerError::Inspect {
            node: self.node.clone(),
            kind,
            name: name.to_owned(),
            source: Box::new(source),
        }
    }

    fn list_err(&self, kind: &'static str, label: &str, source: Box<BollardError>) -> DockerError {
        DockerError::List {
            node: self.node.clone(),
            kind,
            filter: format!("label={label}"),
            source,
        }
    }

    /// All containers (running or not) carrying `label` (`key` or `key=value`).
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_containers_by_label(
        &self,
        label: &str,
    ) -> Result<Vec<ContainerSummary>, DockerError> {
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_containers(Some(opts)).await;
        self.op(r, |e| self.list_err("containers", label, e)).await
    }

    /// All images carrying `label`.
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_images_by_label(
        &self,
        label: &str,
    ) -> Result<Vec<ImageSummary>, DockerError> {
        let opts = ListImagesOptionsBuilder::default()
            .all(true)
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_images(Some(opts)).await;
        self.op(r, |e| self.list_err("images", label, e)).await
    }

    /// All networks carrying `label`.
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_networks_by_label(&self, label: &str) -> Result<Vec<Network>, DockerError> {
        let opts = ListNetworksOptionsBuilder::default()
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_networks(Some(opts)).await;
        self.op(r, |e| self.list_err("networks", label, e)).await
    }

    /// All volumes carrying `label`.
    ///
    /// # Errors
    ///
    /// [`DockerError::List`].
    pub async fn list_volumes_by_label(&self, label: &str) -> Result<Vec<Volume>, DockerError> {
        let opts = ListVolumesOptionsBuilder::default()
            .filters(&label_filter(label))
            .build();
        let r = self.docker.list_volumes(Some(opts)).await;
        self.op(r, |e| self.list_err("volumes", label, e))
            .await
            .map(|v| v.volumes.unwrap_or_default())
    }

    /// Creates a network; returns its id.
    ///
    /// # Errors
    ///
    /// [`DockerError::CreateNetwork`].
    pub async fn create_network(&self, req: NetworkCreateRequest) -> Result<String, DockerError> {
        let name = req.name.clone();
        let r = self.docker.create_network(req).await;
        self.op(r, |source| DockerError::CreateNetwork {
            node: self.node.clone(),
            name,
            source,
        })
        .await
        .map(|r| r.id)
    }

    /// Connects a (created, not necessarily started) container to a network, optionally with a
    /// fixed IPv4 address.
    ///
    /// # Errors
    ///
    /// [`DockerError::ConnectNetwork`].
    pub async fn connect_network(
        &self,
        network: &str,
        container: &str,
        ipv4: Option<&str>,
    ) -> Result<(), DockerError> {
        let req = NetworkConnectRequest {
            container: container.to_owned(),
            endpoint_config: Some(EndpointSettings {
                ipam_config: ipv4.map(|ip| EndpointIpamConfig {
                    ipv4_address: Some(ip.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let r = self.docker.connect_network(network, req).await;
        self.op(r, |source| DockerError::ConnectNetwork {
            node: self.node.clone(),
            network: network.to_owned(),
            container: container.to_owned(),
            source,
        })
        .await
    }

    /// Creates a container named `name`; returns its id.
    ///
    /// # Errors
    ///
    /// [`DockerError::CreateContainer`].
    pub async fn create_container(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> Result<String, DockerError> {
        let opts = CreateContainerOptionsBuilder::default().name(name).build();
        let r = self.docker.create_container(Some(opts), body).await;
        self.op(r, |source| DockerError::CreateContainer {
            node: self.node.clone(),
            name: name.to_owned(),
            source,
        })
        .await
        .map(|r| r.id)
    }

    /// Creates a volume with `driver` and its options, labelled; returns its name.
    ///
    /// # Errors
    ///
    /// [`DockerError::CreateVolume`].
    pub async fn create_volume(
        &self,
        name: &str,
        driver: &str,
        options: &std::collections::BTreeMap<String, String>,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<String, DockerError> {
        let req = bollard::models::VolumeCreateRequest {
            name: Some(name.to_owned()),
            driver: Some(driver.to_owned()),
            driver_opts: Some(options.clone().into_iter().collect()),
            labels: Some(labels.clone().into_iter().collect()),
            ..Default::default()
        };
        let r = self.docker.create_volume(req).await;
        self.op(r, |source| DockerError::CreateVolume {
            node: self.node.clone(),
            name: name.to_owned(),
            source,
        })
        .await
        .map(|v| v.name)
    }

    /// Inspects a volume; `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Inspect`] for failures other than 404.
    pub async fn inspect_volume(&self, name: &str) -> Result<Option<Volume>, DockerError> {
        match self.docker.inspect_volume(name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(self.inspect_err("volume", name, e)).await),
        }
    }

    /// Waits until a started container exits; its exit code.
    ///
    /// # Errors
    ///
    /// [`DockerError::Wait`].
    pub async fn wait_container(&self, name: &str) -> Result<i64, DockerError> {
        let mut s = self.docker.wait_container(name, None);
        let mut code = 0;
        while let Some(r) = s.next().await {
            match r {
                Ok(w) => code = w.status_code,
                // A non-zero exit arrives as an error carrying the code.
                Err(BollardError::DockerContainerWaitError { code: c, .. }) => code = c,
                Err(e) => {
                    return Err(self
                        .classify(DockerError::Wait {
                            node: self.node.clone(),
                            name: name.to_owned(),
                            source: Box::new(e),
                        })
                        .await);
                }
            }
        }
        Ok(code)
    }

    /// Starts a container.
    ///
    /// # Errors
    ///
    /// [`DockerError::StartContainer`].
    pub async fn start_container(&self, name: &str) -> Result<(), DockerError> {
        let r = self.docker.start_container(name, None).await;
        self.op(r, |source| DockerError::StartContainer {
            node: self.node.clone(),
            name: name.to_owned(),
            source,
        })
        .await
    }

    /// Force-removes a container and its anonymous volumes; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_container(&self, name: &str) -> Result<bool, DockerError> {
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(name, Some(opts)).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("container", name, e)).await),
        }
    }

    /// Stops a container, giving it `grace_s` seconds before SIGKILL; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::StopContainer`].
    pub async fn stop_container(&self, name: &str, grace_s: i32) -> Result<bool, DockerError> {
        let opts = bollard::query_parameters::StopContainerOptionsBuilder::default()
            .t(grace_s)
            .build();
        match self.docker.stop_container(name, Some(opts)).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(BollardError::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(true),
            Err(e) => Err(self
                .classify(DockerError::StopContainer {
                    node: self.node.clone(),
                    name: name.to_owned(),
                    source: Box::new(e),
                })
                .await),
        }
    }

    /// A container's log (stdout and stderr interleaved), optionally with timestamps and only
    /// the last `tail` lines.
    ///
    /// # Errors
    ///
    /// [`DockerError::Logs`].
    pub async fn logs(
        &self,
        name: &str,
        timestamps: bool,
        tail: Option<usize>,
    ) -> Result<Vec<u8>, DockerError> {
        let tail = tail.map_or_else(|| "all".to_owned(), |n| n.to_string());
        let opts = bollard::query_parameters::LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .timestamps(timestamps)
            .tail(&tail)
            .build();
        let mut stream = self.docker.logs(name, Some(opts));
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => out.extend_from_slice(&c.into_bytes()),
                Err(e) => {
                    return Err(self
                        .classify(DockerError::Logs {
                            node: self.node.clone(),
                            name: name.to_owned(),
                            source: Box::new(e),
                        })
                        .await);
                }
            }
        }
        Ok(out)
    }

    /// Removes a network; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_network(&self, name: &str) -> Result<bool, DockerError> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("network", name, e)).await),
        }
    }

    /// Force-removes an image; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_image(&self, name: &str) -> Result<bool, DockerError> {
        let opts = RemoveImageOptionsBuilder::default().force(true).build();
        match self.docker.remove_image(name, Some(opts), None).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("image", name, e)).await),
        }
    }

    /// Removes a volume; `false` when it did not exist.
    ///
    /// # Errors
    ///
    /// [`DockerError::Remove`].
    pub async fn remove_volume(&self, name: &str) -> Result<bool, DockerError> {
        let opts = RemoveVolumeOptionsBuilder::default().force(true).build();
        match self.docker.remove_volume(name, Some(opts)).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.classify(self.remove_err("volume", name, e)).await),
        }
    }

    fn remove_err(&self, kind: &'static str, name: &str, source: BollardError) -> DockerError {
        DockerError::Remove {
            node: self.node.clone(),
            kind,
            name: name.to_owned(),
            source: Box::new(source),
        }
    }

    /// Removes every container, then network, volume and image carrying `label`, and nothing
    /// else. Idempotent.
    ///
    /// # Errors
    ///
    /// The first [`DockerError::List`] or [`DockerError::Remove`]; objects removed before it
    /// stay removed.
    pub async fn remove_by_label(&self, label: &str) -> Result<Removed, DockerError> {
        let mut removed = Removed::default();
        for c in self.list_containers_by_label(label).await? {
            let Some(id) = c.id else { continue };
            let name = c
                .names
                .and_then(|n| n.into_iter().next())
                .map_or_else(|| id.clone(), |n| n.trim_start_matches('/').to_owned());
            if self.remove_container(&id).await? {
                removed.containers.push(name);
            }
        }
        for n in self.list_networks_by_label(label).await? {
            let Some(id) = n.id else { continue };
            if self.remove_network(&id).await? {
                removed.networks.push(n.name.unwrap_or(id));
            }
        }
        for v in self.list_volumes_by_label(label).await? {
            if self.remove_volume(&v.name).await? {
                removed.volumes.push(v.name);
            }
        }
        for i in self.list_images_by_label(label).await? {
            if self.remove_image(&i.id).await? {
                removed.images.push(i.id);
            }
        }
        Ok(removed)
    }
}
