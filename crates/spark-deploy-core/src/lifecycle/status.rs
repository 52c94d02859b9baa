//! `status`: both ranks' containers, the served model, memory available on every node.

use serde::Serialize;

use crate::container::labels;
use crate::container::rank_container_name;
use crate::context::Context;

/// One rank's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankStatus {
    /// Rank.
    pub rank: usize,
    /// Node.
    pub node: String,
    /// Container name.
    pub container: String,
    /// `running`, `exited`, `absent`, or an error.
    pub state: String,
    /// When it started (Docker's timestamp), if it exists.
    pub started_at: Option<String>,
    /// The launch fingerprint label.
    pub fingerprint: Option<String>,
    /// `MemAvailable` of the node in GiB, when readable.
    pub mem_available_gib: Option<f64>,
}

/// The deployment's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// One entry per rank.
    pub ranks: Vec<RankStatus>,
    /// Served model ids from `/v1/models`, or why they could not be read.
    pub served: Result<Vec<String>, String>,
    /// `running` when every rank runs and the API answers; else `down` or `degraded`.
    pub overall: String,
    /// The supervisor (`spark-deploy watch`): its state, the stop marker, the pause lease.
    pub watch: crate::supervise::WatchStatus,
}

/// Reads the state of every rank and the API.
pub async fn status(ctx: &Context) -> Status {
    let c = ctx.config().config();
    let mut ranks = Vec::new();
    for (rank, node) in c.nodes.iter().enumerate() {
        let container = rank_container_name(&c.deployment.name, rank);
        let (mut state, mut started_at, mut fingerprint) = ("absent".to_owned(), None, None);
        match ctx.docker(rank).await {
            Ok(d) => match d.container_state(&container).await {
                Ok(st) if st.exists => {
                    state = if st.running { "running" } else { "exited" }.into();
                    started_at = st.started_at;
                    fingerprint = st.labels.get(labels::FINGERPRINT).cloned();
                }
                Ok(_) => {}
                Err(e) => state = format!("unknown: {e}"),
            },
            Err(e) => state = format!("unreachable: {e}"),
        }
        let mem_available_gib = match ctx.exec(rank).await {
            Ok(e) => e
                .read_file(&node.meminfo_path())
                .await
                .ok()
                .and_then(|b| {
                    crate::preflight::meminfo::mem_available(&String::from_utf8_lossy(&b))
                })
                .map(|b| b as f64 / f64::from(1u32 << 30)),
            Err(_) => None,
        };
        ranks.push(RankStatus {
            rank,
            node: node.name.clone(),
            container,
            state,
            started_at,
            fingerprint,
            mem_available_gib,
        });
    }
    let served = match super::api_key::client_key(&c.serving) {
        Err(e) => Err(e.to_string()),
        Ok(key) => {
            let host = if c.serving.host == "0.0.0.0" {
                "127.0.0.1"
            } else {
                c.serving.host.as_str()
            };
            let url = format!("http://{host}:{}/v1/models", c.serving.port);
            match super::api_key::authorize(reqwest::Client::new().get(&url), key.as_ref())
                .timeout(std::time::Duration::from_secs(5))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => r
                    .json::<serde_json::Value>()
                    .await
                    .map(|v| {
                        v["data"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                                    .collect()
                            })
                            .unwrap_or_default()
                    })
                    .map_err(|e| e.to_string()),
                Ok(r) => Err(format!("{url}: HTTP {}", r.status())),
                Err(e) => Err(format!("{url}: {e}")),
            }
        }
    };
    let all_running = ranks.iter().all(|r| r.state == "running");
    let none_running = ranks.iter().all(|r| r.state != "running");
    let overall = if all_running && served.is_ok() {
        "running"
    } else if none_running {
        "down"
    } else {
        "degraded"
    }
    .to_owned();
    Status {
        ranks,
        served,
        overall,
        watch: crate::supervise::status(std::path::Path::new(&c.deployment.state_dir)),
    }
}
