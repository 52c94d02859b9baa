use serde::Serialize;

use std::path::PathBuf;
use std::sync::Mutex;

use crate::commit::is_commit_id;
use crate::config::ValidatedConfig;
use crate::event::{Event, Level};
use crate::hub::{FetchEvent, FetchProgress, HfToken, Hub, HubConfig};
use crate::plan::StepKind;
use crate::plan::describe::{Action, ActionDetail};
use crate::run::{Context, Outcome, StepFailure};

/// One repository to fetch at a pinned revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepoFetch {
    /// What it is for.
    pub role: String,
    /// `owner/name`.
    pub repo: String,
    /// Pinned revision.
    pub revision: String,
    /// File names or patterns resolved against the Hub's file list (as shown by `plan`).
    pub files: Vec<String>,
    /// The globs actually fetched.
    pub patterns: Vec<String>,
    /// Cache root.
    pub cache: String,
    /// Needs a token.
    pub gated: bool,
}

/// Downloads the checkpoint, the Engram shards, the `bias_vl` byte ranges, the kit and (with
/// ABLIT) the overlay into the head's HF cache: pinned, resumable, verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FetchCheckpoint {
    /// Node that downloads (the head).
    pub node: String,
    /// Repositories in order.
    pub repos: Vec<RepoFetch>,
    /// Check the cache only, with no network (air-gapped nodes).
    pub verify_only: bool,
}

impl FetchCheckpoint {
    /// The fetch of `config`.
    #[must_use]
    pub fn new(config: &ValidatedConfig) -> Self {
        let c = config.config();
        let m = &c.model;
        let mut repos = vec![
            RepoFetch {
                role: "EXL3 checkpoint".into(),
                repo: m.id.clone(),
                revision: m.revision.clone(),
                files: [
                    "config.json",
                    "generation_config.json",
                    "tokenizer.json",
                    "tokenizer_config.json",
                    "model.safetensors.index.json",
                    "every shard the index lists (*.safetensors), the vision shard included",
                ]
                .map(str::to_owned)
                .to_vec(),
                patterns: [
                    "config.json",
                    "generation_config.json",
                    "tokenizer.json",
                    "tokenizer_config.json",
                    "model.safetensors.index.json",
                    "*.safetensors",
                ]
                .map(str::to_owned)
                .to_vec(),
                cache: c.hub.cache.clone(),
                gated: false,
            },
            RepoFetch {
                role: "Engram tables and image routing bias (original model)".into(),
                repo: m.engram_repo.clone(),
                revision: m.engram_revision.clone(),
                files: [
                    "config.json".to_owned(),
                    "model.safetensors.index.json".to_owned(),
                ]
                .into_iter()
                .chain(m.engram_files.iter().cloned())
                .chain([
                    "*.ffn.gate.bias_vl tensors: byte ranges only, read through the shard headers"
                        .to_owned(),
                ])
                .collect(),
                patterns: [
                    "config.json".to_owned(),
                    "model.safetensors.index.json".to_owned(),
                ]
                .into_iter()
                .chain(m.engram_files.iter().cloned())
                .collect(),
                cache: c.hub.cache.clone(),
                gated: false,
            },
            RepoFetch {
                role: "kernel kit".into(),
                repo: m.kit_repo.clone(),
                revision: m.kit_revision.clone(),
                files: vec!["kit/** (verified against kit/MANIFEST)".into()],
                patterns: vec!["kit/**".into()],
                cache: c.hub.cache.clone(),
                gated: false,
            },
        ];
        if m.ablit {
            repos.push(RepoFetch {
                role: "abliterated overlay (ABLIT=1)".into(),
                repo: m.ablit_id.clone(),
                revision: m.ablit_revision.clone(),
                files: vec!["*.safetensors".into(), "*.json".into()],
                patterns: vec!["*.safetensors".into(), "*.json".into()],
                cache: c.hub.ablit_cache.clone(),
                gated: true,
            });
        }
        Self {
            node: c.nodes[0].name.clone(),
            repos,
            verify_only: false,
        }
    }

    pub(crate) fn describe(&self) -> (String, Vec<Action>) {
        let actions = self
            .repos
            .iter()
            .map(|r| {
                Action::with(
                    &self.node,
                    format!("fetch the {}", r.role),
                    ActionDetail::Fetch {
                        repo: r.repo.clone(),
                        revision: r.revision.clone(),
                        files: r.files.clone(),
                        cache: r.cache.clone(),
                        gated: r.gated,
                    },
                )
            })
            .collect();
        (
            "download pinned, resumable and verified into the standard HF cache".to_owned(),
            actions,
        )
    }
}

/// The hub cache directory (`<HF_HOME>/hub`) of a cache root as the config names it.
#[must_use]
pub fn hub_dir(cache_root: &str) -> PathBuf {
    PathBuf::from(cache_root).join("hub")
}

/// The snapshot directory of `repo` at `commit` under a cache root.
#[must_use]
pub fn snapshot_dir(cache_root: &str, repo: &str, commit: &str) -> PathBuf {
    hub_dir(cache_root)
        .join(crate::layout::repo_folder(repo))
        .join("snapshots")
        .join(commit)
}

/// Turns the Hub port's progress into events (throttled per file).
struct ProgressEvents<'a> {
    ctx: &'a Context,
    node: String,
    last: Mutex<std::time::Instant>,
}

impl FetchProgress for ProgressEvents<'_> {
    fn on_event(&self, event: &FetchEvent) {
        match event {
            FetchEvent::Progress {
                file,
                done,
                total,
                rate_bps,
                eta,
                file_done,
                file_total,
            } => {
                let mut last = self
                    .last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if last.elapsed() < std::time::Duration::from_millis(200) && file_done < file_total
                {
                    return;
                }
                *last = std::time::Instant::now();
                self.ctx.emit(Event::Progress {
                    step: StepKind::FetchCheckpoint,
                    node: Some(self.node.clone()),
                    label: file.clone(),
                    bytes_done: *done,
                    bytes_total: Some(*total),
                    rate_bps: Some(*rate_bps),
                    eta_s: eta.map(|d| d.as_secs_f64()),
                });
            }
            FetchEvent::Retrying { .. } => self.ctx.log(
                StepKind::FetchCheckpoint,
                Some(&self.node),
                Level::Warn,
                event.to_string(),
            ),
            _ => {}
        }
    }
}

/// `--verify-only` found problems in the cache.
#[derive(Debug, thiserror::Error)]
#[error("{repo}@{revision}: {problems}")]
pub struct CacheProblems {
    /// Repository.
    pub repo: String,
    /// Revision checked.
    pub revision: String,
    /// One line per missing or bad file.
    pub problems: String,
}

impl FetchCheckpoint {
    /// The same fetch, checking the cache only (no network).
    #[must_use]
    pub fn verify_only(mut self) -> Self {
        self.verify_only = true;
        self
    }

    fn check_cache(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        let mut total = 0;
        for r in &self.repos {
            let hub = Hub::new(HubConfig::new(None, hub_dir(&r.cache)))
                .map_err(|e| StepFailure::new(StepKind::FetchCheckpoint, e, None))?;
            let report = hub.verify_only(&r.repo, &r.revision, None).map_err(|e| {
                StepFailure::new(
                    StepKind::FetchCheckpoint,
                    e,
                    Some(format!(
                        "run `spark-deploy fetch` where the Hub is reachable, then copy {}",
                        r.cache
                    )),
                )
            })?;
            if !report.is_ok() {
                let problems = report
                    .problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(StepFailure::new(
                    StepKind::FetchCheckpoint,
                    CacheProblems {
                        repo: r.repo.clone(),
                        revision: r.revision.clone(),
                        problems,
                    },
                    Some("a normal `spark-deploy fetch` re-fetches exactly the bad files".into()),
                ));
            }
            ctx.log(
                StepKind::FetchCheckpoint,
                Some(&self.node),
                Level::Info,
                format!(
                    "{}@{}: all {} files present and verified (no network)",
                    r.repo,
                    report.commit,
                    report.verified.len()
                ),
            );
            total += report.verified.len();
        }
        Ok(Outcome::Skipped {
            reason: format!("verify-only: all {total} files present and verified"),
        })
    }

    /// When the fetched kit does not publish `vision/gate_bias_vl.safetensors`, reads the
    /// `*.ffn.gate.bias_vl` tensors of the original model by byte range (shard headers, then only
    /// those ranges — never whole shards) and writes the head's `bias_vl_file`. The tensor bytes
    /// read (headers not counted), or `None` when nothing was needed.
    async fn fetch_bias_vl(
        &self,
        ctx: &Context,
        endpoint: Option<String>,
        token: Option<HfToken>,
    ) -> Result<Option<u64>, Box<dyn std::error::Error + Send + Sync>> {
        use crate::engine::tensorfold::inputs::bias_vl;
        let c = ctx.config().config();
        let out = std::path::PathBuf::from(
            crate::layout::NodeLayout::of(ctx.config(), &c.nodes[0]).bias_vl_file,
        );
        let commit_of = |repo: &str| ctx.facts().commits.get(repo).cloned();
        let (Some(kit_commit), Some(orig_commit)) = (
            commit_of(&c.model.kit_repo),
            commit_of(&c.model.engram_repo),
        ) else {
            return Ok(None);
        };
        let kit = snapshot_dir(&c.hub.cache, &c.model.kit_repo, &kit_commit)
            .join("kit/vision/gate_bias_vl.safetensors");
        if kit.exists() || out.exists() {
            return Ok(None);
        }
        let index_path = snapshot_dir(&c.hub.cache, &c.model.engram_repo, &orig_commit)
            .join("model.safetensors.index.json");
        let index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path)?)?;
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_value(index["weight_map"].clone())?;
        let names = bias_vl::bias_names(&map);
        if names.is_empty() {
            return Err(format!(
                "{}: no *.ffn.gate.bias_vl tensor in the index",
                index_path.display()
            )
            .into());
        }
        let mut cfg = HubConfig::new(endpoint, hub_dir(&c.hub.cache));
        cfg.token = token;
        let hub = Hub::new(cfg)?;
        let resolved = hub.resolve(&c.model.engram_repo, &orig_commit).await?;
        let mut by_shard: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        for (name, shard) in &names {
            by_shard
                .entry(shard.as_str())
                .or_default()
                .push(name.as_str());
        }
        let mut tensors = Vec::new();
        let mut read = 0u64;
        for (shard, wanted) in by_shard {
            for t in hub.read_tensors(&resolved, shard, &wanted).await? {
                read += t.data.len() as u64;
                tensors.push(bias_vl::BiasTensor {
                    name: t.name,
                    shape: t.entry.shape,
                    data: t.data.to_vec(),
                });
            }
        }
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        let report = bias_vl::write_tensors(&tensors, &out)?;
        ctx.log(
            StepKind::FetchCheckpoint,
            Some(&self.node),
            Level::Info,
            format!(
                "the kit has no gate_bias_vl.safetensors: {} bias_vl tensors read by byte range from {} ({} shard(s)), {} bytes, written to {}",
                report.tensors,
                c.model.engram_repo,
                names.iter().map(|(_, s)| s).collect::<std::collections::BTreeSet<_>>().len(),
                report.bytes,
                out.display()
            ),
        );
        Ok(Some(read))
    }

    /// Fetches every repository at its pinned revision; records the checkpoint's commit.
    pub(crate) async fn run(&self, ctx: &Context) -> Result<Outcome, StepFailure> {
        if self.verify_only {
            return self.check_cache(ctx);
        }
        let c = ctx.config().config();
        let token = c
            .hub
            .token
            .as_ref()
            .map(|t| HfToken::new(t.expose()))
            .or_else(|| HfToken::from_file(std::path::Path::new(&c.hub.token_file)));
        let endpoint = (!c.hub.endpoint.is_empty()).then(|| c.hub.endpoint.clone());
        let progress = ProgressEvents {
            ctx,
            node: self.node.clone(),
            last: Mutex::new(std::time::Instant::now()),
        };
        let mut transferred = 0;
        let mut summaries = Vec::new();
        for r in &self.repos {
            let mut cfg = HubConfig::new(endpoint.clone(), hub_dir(&r.cache));
            cfg.token.clone_from(&token);
            // On cancellation the transfers put what they received on disk before the step ends.
            cfg.cancel = Some(ctx.cancel_signal());
            let fail = |e: Box<dyn std::error::Error + Send + Sync>| {
                StepFailure::new(
                    StepKind::FetchCheckpoint,
                    e,
                    Some(format!(
                        "{} at {}: check the endpoint, the revision and (gated repos) HF_TOKEN",
                        r.repo, r.revision
                    )),
                )
            };
            let hub = Hub::new(cfg).map_err(|e| fail(Box::new(e)))?;
            let (commit, summary, bytes) = match hub
                .fetch_repo(&r.repo, &r.revision, &r.patterns, &progress)
                .await
            {
                Ok(report) => (
                    report.repo.commit.clone(),
                    report.summary(),
                    report.transferred,
                ),
                Err(e) if e.is_unreachable() && is_commit_id(&r.revision) => {
                    // A Hub outage (or an air-gapped re-run) does not stop a deployment whose
                    // pinned snapshot our last fetch completed and that still verifies.
                    let unreachable = crate::preflight::decide::error_chain(&e);
                    let v = hub
                        .verify_only(&r.repo, &r.revision, None)
                        .ok()
                        .filter(|v| v.is_ok() && !v.verified.is_empty())
                        .ok_or_else(|| fail(Box::new(e)))?;
                    ctx.log(
                            StepKind::FetchCheckpoint,
                            Some(&self.node),
                            Level::Warn,
                            format!("{}: the Hub is unreachable ({unreachable}); using the cached snapshot, all {} files present and verified", r.repo, v.verified.len()),
                        );
                    (
                        v.commit,
                        format!(
                            "Hub unreachable, all {} cached files verified",
                            v.verified.len()
                        ),
                        0,
                    )
                }
                Err(e) => return Err(fail(Box::new(e))),
            };
            let (repo, is_model) = (r.repo.clone(), r.repo == c.model.id);
            ctx.update_facts(|f| {
                if is_model {
                    f.model_commit.clone_from(&commit);
                }
                f.commits.insert(repo, commit.clone());
            });
            ctx.log(
                StepKind::FetchCheckpoint,
                Some(&self.node),
                Level::Info,
                format!("{}@{commit}: {summary}", r.repo),
            );
            transferred += bytes;
            summaries.push(summary);
        }
        let bias = self
            .fetch_bias_vl(ctx, endpoint.clone(), token.clone())
            .await
            .map_err(|e| {
                StepFailure::new(
                    StepKind::FetchCheckpoint,
                    e,
                    Some(format!(
                        "{} must hold the *.ffn.gate.bias_vl tensors (or the kit must publish vision/gate_bias_vl.safetensors)",
                        c.model.engram_repo
                    )),
                )
            })?;
        if let Some(b) = bias {
            transferred += b;
            summaries.push(format!("bias_vl: {b} bytes by range"));
        }
        if transferred == 0 {
            return Ok(Outcome::Skipped {
                reason: format!("nothing to download: {}", summaries.join("; ")),
            });
        }
        Ok(Outcome::Done {
            bytes: Some(transferred),
        })
    }
}
