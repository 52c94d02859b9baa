use serde::Serialize;

use std::sync::Mutex;

use crate::commit::is_commit_id;
use crate::config::{PreparePolicy, ValidatedConfig};
use crate::context::{Context, Outcome, StepFailure};
use crate::describe::{Action, ActionDetail};
use crate::engine::Engine;
use crate::event::StepKind;
use crate::event::{Event, FileBytes, Level};
use crate::facts::Detected;
use crate::hub::{FetchEvent, FetchProgress, HfToken, Hub, HubConfig};
use crate::layout::hub_dir;

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

/// Downloads the kit, the checkpoint, the Engram shards, (with ABLIT) the overlay and the
/// `bias_vl` byte ranges into the head's HF cache, in that order: pinned, resumable, verified.
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
        // The kit first: it is small, and the token map and the kit's tables are built from it
        // (with the checkpoint's config and tokenizer, its first files) while the shards arrive.
        let mut repos = vec![
            RepoFetch {
                role: "kernel kit".into(),
                repo: m.kit_repo.clone(),
                revision: m.kit_revision.clone(),
                files: vec!["kit/** (verified against kit/MANIFEST)".into()],
                patterns: vec!["kit/**".into()],
                cache: c.hub.cache.clone(),
                gated: false,
            },
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

/// Turns the Hub port's progress into events (throttled per file).
struct ProgressEvents<'a> {
    ctx: &'a Context,
    node: String,
    last: Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl FetchProgress for ProgressEvents<'_> {
    fn wanted_first(&self) -> Option<Vec<String>> {
        self.ctx.wanted_first()
    }

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
                // At most every 200 ms per file (concurrent files each get their figures), and
                // always the last bytes of a file.
                let mut last = self
                    .last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let now = std::time::Instant::now();
                if file_done < file_total {
                    if last.get(file).is_some_and(|t| {
                        now.duration_since(*t) < std::time::Duration::from_millis(200)
                    }) {
                        return;
                    }
                    last.insert(file.clone(), now);
                } else {
                    last.remove(file);
                }
                drop(last);
                self.ctx.emit(Event::Progress {
                    source: StepKind::FetchCheckpoint.into(),
                    node: Some(self.node.clone()),
                    label: file.clone(),
                    bytes_done: *done,
                    bytes_total: Some(*total),
                    rate_bps: Some(*rate_bps),
                    eta_s: eta.map(|d| d.as_secs_f64()),
                    file: Some(FileBytes {
                        done: *file_done,
                        total: *file_total,
                    }),
                });
            }
            // The commit is known before any byte arrives: steps running alongside (the
            // overlapped `up`) use it to find each file the moment its snapshot link appears.
            FetchEvent::Started { repo, commit, .. } => {
                let is_model = *repo == self.ctx.config().config().model.id;
                self.ctx.update_facts(|f| {
                    if is_model {
                        f.model_commit = Detected::Known(commit.clone());
                    }
                    f.commits.insert(repo.clone(), commit.clone());
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

    /// Fetches every repository at its pinned revision; records the checkpoint's commit.
    pub(crate) async fn run(
        &self,
        ctx: &Context,
        engine: &dyn Engine,
    ) -> Result<Outcome, StepFailure> {
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
            last: Mutex::new(std::collections::HashMap::new()),
        };
        let mut transferred = 0;
        let mut summaries = Vec::new();
        let never = ctx.prepare_policy() == PreparePolicy::Never;
        if never {
            ctx.log(
                StepKind::FetchCheckpoint,
                Some(&self.node),
                Level::Info,
                "PREPARE=0: nothing is downloaded; the cached snapshots must be complete",
            );
        }
        for r in &self.repos {
            let mut cfg = HubConfig::new(endpoint.clone(), hub_dir(&r.cache));
            cfg.token.clone_from(&token);
            // PREPARE=0 downloads nothing: the fetch stands on the verified cache, as offline.
            cfg.offline = c.hub.offline || never;
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
                Err(e) if e.is_offline() => {
                    let remedy = if never {
                        Some(PreparePolicy::NOT_PREPARED_REMEDY.to_owned())
                    } else {
                        e.remedy()
                    };
                    return Err(StepFailure::new(StepKind::FetchCheckpoint, e, remedy));
                }
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
                    f.model_commit = Detected::Known(commit.clone());
                }
                f.commits.insert(repo, commit.clone());
            });
            ctx.log(
                StepKind::FetchCheckpoint,
                Some(&self.node),
                Level::Info,
                format!("{}@{commit}: {summary}", r.repo),
            );
            ctx.mark_repo_fetched(&r.repo);
            transferred += bytes;
            summaries.push(summary);
        }
        let bias = engine
            .fetch_extras(ctx, endpoint.clone(), token.clone())
            .await?;
        if let Some(b) = bias {
            transferred += b;
            summaries.push(format!("bias_vl: {b} bytes by range"));
        }
        ctx.mark_stage(|s| s.fetched = true);
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
