use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use serde::Serialize;

use crate::config::ValidatedConfig;
use crate::container::labels;
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail};
use crate::engine::Engine;
use crate::engine::image_context::ImageContext;
use crate::event::StepKind;
use crate::event::{Event, Level};
use crate::layout::NodeLayout;
use crate::ports::docker::DockerNode;
use crate::transfer::expand;

use super::engine_build;

/// One node's side of the image step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageNode {
    /// Node name.
    pub node: String,
    /// The image reference there (see [`NodeLayout::image`]).
    pub image: String,
    /// The engine binaries' directory there.
    pub engine_dir: String,
}

/// Builds the engine image on the head from a context the tool generates (`FROM` the qualified
/// base, the patch files, the engine commit), identified by its content label; makes the same
/// image present on every worker by streaming it (`docker save` on the head → `docker load`
/// through the worker's own Docker) when the worker's label differs; ships the engine binaries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildImage {
    /// The qualified base image (never pulled).
    pub base_image: String,
    /// Engine commit.
    pub commit: String,
    /// Patch files on the head.
    pub patches: Vec<String>,
    /// The engine's source (`engine.repo`); empty when the binaries are placed by hand.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub repo: String,
    /// The build command, when the binaries are built from `repo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_command: Option<Vec<String>>,
    /// Head first.
    pub nodes: Vec<ImageNode>,
    /// The engine's files in each node's engine directory.
    #[serde(skip)]
    pub binaries: Vec<String>,
}

impl BuildImage {
    /// The image step of `config`.
    #[must_use]
    pub fn new(engine: &dyn Engine, config: &ValidatedConfig) -> Self {
        let c = config.config();
        let build_command = if c.engine.repo.is_empty() {
            None
        } else {
            engine.build_recipe(config).map(|r| r.command)
        };
        Self {
            repo: c.engine.repo.clone(),
            build_command,
            binaries: engine.binaries(),
            base_image: c.engine.base_image.clone(),
            commit: c.engine.commit.clone(),
            patches: c.engine.patches.clone(),
            nodes: c
                .nodes
                .iter()
                .map(|n| {
                    let l = NodeLayout::of(config, n);
                    ImageNode {
                        node: n.name.clone(),
                        image: l.image,
                        engine_dir: l.engine_dir,
                    }
                })
                .collect(),
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let short: String = self.commit.chars().take(12).collect();
        let actions = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let how = if i == 0 {
                    let engine = match &self.build_command {
                        Some(cmd) => format!(
                            "build engine {short} from {} with {} patch file(s) applied in order (`{}` in a throwaway container of {}, cached by commit, patches, base image ID and command); ",
                            self.repo,
                            self.patches.len(),
                            cmd.join(" "),
                            self.base_image
                        ),
                        None => String::new(),
                    };
                    format!(
                        "{engine}build {} FROM {} (engine {short}, {} patch file(s), the binaries' sha256) unless its content label matches",
                        n.image,
                        self.base_image,
                        self.patches.len()
                    )
                } else {
                    format!(
                        "make {} present with the head's content label (docker save → load through {}'s Docker when it differs); ship the engine binaries",
                        n.image, n.node
                    )
                };
                Action::with(
                    &n.node,
                    how,
                    ActionDetail::Outputs {
                        files: self
                            .binaries
                            .iter()
                            .map(|b| format!("{}/{b}", n.engine_dir))
                            .collect(),
                    },
                )
            })
            .collect();
        (
            "the same image (by content label) and engine binaries on every node".to_owned(),
            actions,
        )
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The content label of `image` on `docker`, `None` when the image is absent or unlabelled.
async fn content_of(docker: &DockerNode, image: &str) -> Result<Option<String>, BoxError> {
    Ok(docker
        .inspect_image(image)
        .await?
        .and_then(|i| i.config)
        .and_then(|c| c.labels)
        .and_then(|l| l.get(labels::CONTENT).cloned()))
}

impl BuildImage {
    /// Builds (head) and ships (workers) the image when its content label differs, then ships the
    /// engine binaries.
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
        let fail =
            |e: BoxError, remedy: String| StepFailure::new(StepKind::BuildImage, e, Some(remedy));
        let head = &self.nodes[0];
        let c = ctx.config().config();
        let recipe = if self.repo.is_empty() {
            None
        } else {
            Some(engine.build_recipe(ctx.config()).ok_or_else(|| {
                fail(
                    format!(
                        "engine.repo is set, but the {} profile has no build",
                        engine.name()
                    )
                    .into(),
                    format!(
                        "clear engine.repo and put the binaries in {} on {}",
                        head.engine_dir, head.node
                    ),
                )
            })?)
        };
        if recipe.is_none() {
            for bin in &self.binaries {
                if !Path::new(&head.engine_dir).join(bin).is_file() {
                    return Err(fail(
                        format!("{}/{bin} is missing on {}", head.engine_dir, head.node).into(),
                        format!(
                            "set engine.repo to the engine's git URL or a local checkout so BuildImage builds engine {} (docs/engine-contract.md, \"Building the engine\"), or build it yourself into {}",
                            self.commit, head.engine_dir
                        ),
                    ));
                }
            }
        }
        let hd = ctx.docker(0).await.map_err(|e| {
            fail(
                Box::new(e),
                format!("Docker on {} must be reachable", head.node),
            )
        })?;
        let base_id = hd
            .inspect_image(&self.base_image)
            .await
            .map_err(|e| fail(Box::new(e), format!("Docker on {} must answer", head.node)))?
            .and_then(|i| i.id)
            .ok_or_else(|| {
                fail(
                    format!("the base image {} is not on {}", self.base_image, head.node).into(),
                    "load it there (`docker load -i <file>`, or pull it on a machine with registry access and ship it) — spark-deploy never pulls".into(),
                )
            })?;
        let mut work = Vec::new();
        let mut cached = None;
        if let Some(recipe) = &recipe {
            let build_dir = crate::layout::engine_build_dir(&c.nodes[0]);
            let inputs = engine_build::BuildInputs {
                repo: &self.repo,
                commit: &self.commit,
                patches: &self.patches,
                base_image: &self.base_image,
                base_id: &base_id,
                node: &head.node,
                build_dir: Path::new(&build_dir),
                engine_dir: Path::new(&head.engine_dir),
            };
            let built = engine_build::ensure(ctx, hd, &inputs, recipe)
                .await
                .map_err(|e| {
                    let remedy = e.remedy(&self.base_image);
                    fail(Box::new(e), remedy)
                })?;
            let key = &built.record.key[..16];
            if built.built {
                work.push(format!(
                    "engine built in {:.1} s (key {key})",
                    built.record.build_s
                ));
            } else {
                cached = Some(format!("engine build cached (key {key}): 0 s of build"));
            }
            if built.installed > 0 {
                work.push(format!(
                    "{} engine binar{} installed into {}",
                    built.installed,
                    if built.installed == 1 { "y" } else { "ies" },
                    head.engine_dir
                ));
            }
        }
        let mut hashes = Vec::new();
        for bin in &self.binaries {
            let path = Path::new(&head.engine_dir).join(bin);
            let sha = crate::digest::sha256_file(&path).map_err(|e| {
                fail(
                    format!("reading {}: {e}", path.display()).into(),
                    format!("{bin} must be readable on {}", head.node),
                )
            })?;
            hashes.push((bin.clone(), sha));
        }
        let context = ImageContext::new(
            &self.base_image,
            &base_id,
            &self.commit,
            &self.patches,
            &hashes,
        )
        .map_err(|e| {
            fail(
                Box::new(e),
                "every file in engine.patches must exist and be readable on the head".into(),
            )
        })?;
        let built = self
            .build_on_head(ctx, hd, &context)
            .await
            .map_err(|e| {
                fail(
                    e,
                    format!(
                        "the build runs FROM {} on {}'s Docker: fix what the build output names (a patch, the base), then run `spark-deploy up` again",
                        self.base_image, head.node
                    ),
                )
            })?;
        if built {
            work.push(format!("built {} on {}", head.image, head.node));
        }
        let mut bytes = 0;
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            let shipped = self
                .ship_image(ctx, i, hd, &context.content)
                .await
                .map_err(|e| fail(e, "a re-run ships the image again".into()))?;
            if shipped > 0 {
                work.push(format!("shipped {} to {}", n.image, n.node));
            }
            bytes += shipped;
            let mut jobs = Vec::new();
            for bin in &self.binaries {
                jobs.extend(
                    expand(
                        &Path::new(&head.engine_dir).join(bin),
                        &Path::new(&n.engine_dir).join(bin),
                    )
                    .map_err(|e| {
                        fail(
                            Box::new(e),
                            format!("{} must be readable on {}", bin, head.node),
                        )
                    })?,
                );
            }
            // Overlapped, the binaries travel alongside ConfigureWorkerStorage's copy (each
            // step records what it shipped in its own manifest on the worker).
            let stats = super::storage::ship(ctx, StepKind::BuildImage, i, &jobs)
                .await
                .map_err(|e| fail(e, "a re-run resumes".into()))?;
            bytes += stats.bytes_sent;
            if stats.sent > 0 {
                work.push(format!("{} engine file(s) to {}", stats.sent, n.node));
            }
        }
        // `nfs` mode: the worker's volume (ConfigureWorkerStorage creates it: overlapped, wait
        // for that step) is mounted from a container of this image.
        if super::storage::mounts_nfs(ctx, engine) {
            ctx.wait_for(StepKind::BuildImage, |c| c.stages().stored)
                .await?;
        }
        super::storage::verify_nfs_mounts(ctx, engine)
            .await
            .map_err(|e| {
                fail(
                    e,
                    "the worker must mount the head's export: check /etc/exports on the head (`exportfs -v`) and that the worker reaches the head's fabric address, or set deployment.worker_storage = \"copy\"".into(),
                )
            })?;
        let short: String = context.content.chars().take(12).collect();
        if work.is_empty() {
            let build = cached.map_or_else(String::new, |c| format!("{c}; "));
            return Ok(Outcome::Skipped {
                reason: format!(
                    "{build}image content {short} on every node, engine binaries present and verified"
                ),
            });
        }
        ctx.log(
            StepKind::BuildImage,
            None,
            Level::Info,
            format!("image content {short}: {}", work.join("; ")),
        );
        Ok(Outcome::Done { bytes: Some(bytes) })
    }

    /// Builds the head's image unless it already carries `context`'s label; whether it built.
    async fn build_on_head(
        &self,
        ctx: &Context,
        docker: &DockerNode,
        context: &ImageContext,
    ) -> Result<bool, BoxError> {
        let head = &self.nodes[0];
        if content_of(docker, &head.image).await?.as_deref() == Some(context.content.as_str()) {
            return Ok(false);
        }
        ctx.log(
            StepKind::BuildImage,
            Some(&head.node),
            Level::Info,
            format!(
                "building {} FROM {} (content {})",
                head.image,
                self.base_image,
                &context.content[..12]
            ),
        );
        let labels = HashMap::from([
            (labels::CONTENT.to_owned(), context.content.clone()),
            (labels::ENGINE_COMMIT.to_owned(), self.commit.clone()),
        ]);
        docker
            .build_image(&head.image, context.tar()?, &labels)
            .await?;
        Ok(true)
    }

    /// Streams the head's image to worker `index` unless the worker's image carries `content`;
    /// the bytes that went through the worker's Docker.
    async fn ship_image(
        &self,
        ctx: &Context,
        index: usize,
        head: &DockerNode,
        content: &str,
    ) -> Result<u64, BoxError> {
        let n = &self.nodes[index];
        let worker = ctx.docker(index).await?;
        if content_of(worker, &n.image).await?.as_deref() == Some(content) {
            return Ok(0);
        }
        let head_image = &self.nodes[0].image;
        let id = head
            .inspect_image(head_image)
            .await?
            .and_then(|i| i.id)
            .ok_or_else(|| format!("image {head_image} vanished from the head"))?;
        let sent = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&sent);
        let node = n.node.clone();
        let progress = ctx.sink();
        // Saved by ID, the archive carries no tag; the worker's tag is set through its own Docker.
        let stream = head.save_image(&id).map(move |r| {
            let chunk = r.map_err(std::io::Error::other)?;
            let len = chunk.len() as u64;
            let done = counter.fetch_add(len, Ordering::Relaxed) + len;
            // One event per 16 MiB crossed.
            if done >> 24 == (done - len) >> 24 {
                return Ok(chunk);
            }
            progress.emit(Event::Progress {
                source: StepKind::BuildImage.into(),
                node: Some(node.clone()),
                label: "image".to_owned(),
                bytes_done: done,
                bytes_total: None,
                rate_bps: None,
                eta_s: None,
                file: None,
            });
            Ok::<_, std::io::Error>(chunk)
        });
        worker.load_image(&n.image, stream).await?;
        worker.tag_image(&id, &n.image).await?;
        let got = content_of(worker, &n.image).await?;
        if got.as_deref() != Some(content) {
            return Err(format!(
                "after loading, {} on {} carries content {got:?}, not {content}",
                n.image, n.node
            )
            .into());
        }
        let bytes = sent.load(Ordering::Relaxed);
        ctx.log(
            StepKind::BuildImage,
            Some(&n.node),
            Level::Info,
            format!(
                "image {} shipped: {bytes} bytes streamed through {}'s Docker ({}), content {}",
                n.image,
                n.node,
                worker.via(),
                &content[..12]
            ),
        );
        Ok(bytes)
    }
}
