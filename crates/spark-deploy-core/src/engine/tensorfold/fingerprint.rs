//! The cross-rank fingerprint (docs/engine-contract.md, "What both ranks must agree on"): the engine never checks that both
//! ranks agree, so spark-deploy extracts every setting that must match from each rank's container
//! spec and input identities, compares them field by field, and refuses to launch on any difference.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::container::ContainerSpec;

/// Identities of the files a rank reads, measured on its node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct InputIdentity {
    /// sha256 of the kit's `MANIFEST`.
    pub kit_manifest_sha256: String,
    /// sha256 of the token map.
    pub token_map_sha256: String,
    /// The rank weight file's name (its hash names the index family).
    pub rank_file: String,
    /// The Engram tables: `(file name, size)` pairs.
    pub engram_files: Vec<(String, u64)>,
    /// The image's content label on the node (`io.spark-deploy.content`), never its ID.
    pub image_content: String,
    /// What the rank files were built from (checkpoint and `ABLIT` overlay, from their sidecars):
    /// the index holds no content hash, so a genuine and an overlaid file look alike otherwise.
    pub inputs_source: String,
}

/// The settings of one rank that must equal every other rank's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankSettings {
    /// Values by name, normalised across the two command-line shapes.
    pub values: BTreeMap<String, String>,
    /// This rank's own rank file (`rank{R}of{W}-<index hash>.bin`): it differs by rank, so it is
    /// not compared, but the fingerprint covers it.
    pub rank_file: String,
}

fn flag(argv: &[String], key: &str) -> Option<String> {
    argv.iter()
        .position(|a| a == key)
        .and_then(|i| argv.get(i + 1))
        .cloned()
}

/// The rank-1 file name's index family: `rank1of2-<hash>.bin` → `of2`.
fn world_of(name: &str) -> String {
    name.split_once("of")
        .and_then(|(_, r)| r.split('-').next())
        .unwrap_or("")
        .to_owned()
}

impl RankSettings {
    /// Extracts the comparable settings of `spec` (rank 0 or a follower) and its inputs.
    #[must_use]
    pub fn of(spec: &ContainerSpec, inputs: &InputIdentity) -> Self {
        let a = &spec.argv;
        let e = &spec.env;
        let mut v = BTreeMap::new();
        let mut put = |k: &str, val: Option<String>| {
            v.insert(k.to_owned(), val.unwrap_or_else(|| "<absent>".to_owned()));
        };
        if spec.rank == 0 {
            // The TP=4 branch's pool is `TF_DS_WINDOW`; `--context` then bounds one request.
            if let Some(window) = e.get("TF_DS_WINDOW") {
                put("pool", Some(window.clone()));
                put("context", flag(a, "--context"));
                put("round_rows", e.get("TF_DS_ROUND_ROWS").cloned());
                put("streams", e.get("TF_DS_STREAMS").cloned());
            } else {
                put("pool", flag(a, "--context"));
            }
            put("model_dir", a.get(2).cloned());
            put("rank_cache_dir", e.get("TF_DS_RANK_CACHE").cloned());
            put("kit_dir", e.get("TF_DS_KIT").cloned());
            put("engram_dir", e.get("TF_DS_ENGRAM").cloned());
            put("token_map", e.get("TF_DS_TOKEN_MAP").cloned());
            put(
                "drafts",
                Some(
                    if a.iter().any(|x| x == "--no-drafts") {
                        "0"
                    } else {
                        "1"
                    }
                    .to_owned(),
                ),
            );
            put(
                "rdma_device_count",
                Some(
                    e.get("TF_RDMA_DEVICES")
                        .map_or(0, |d| d.split(',').count())
                        .to_string(),
                ),
            );
            put("rdma_kernels", e.get("TF_DS_RDMA_KERNELS").cloned());
            put("graphs", e.get("TF_DS_GRAPHS").cloned());
            put("hc_side", e.get("TF_DS_HC_SIDE").cloned());
            put("l2_prefetch", e.get("TF_DS_L2_PREFETCH").cloned());
            put("engram_aio", e.get("TF_DS_ENGRAM_AIO").cloned());
            put("master", e.get("TF_TP_MASTER").cloned());
            put("port", e.get("TF_TP_PORT").cloned());
            put("world", e.get("TF_TP_WORLD").cloned());
        } else {
            put("model_dir", a.get(1).cloned());
            put("rank_cache_dir", a.get(2).cloned());
            put("world", a.get(4).cloned());
            put("master", a.get(5).cloned());
            put("port", a.get(6).cloned());
            put("kit_dir", a.get(7).cloned());
            put("engram_dir", flag(a, "--engram"));
            put("token_map", flag(a, "--token-map"));
            put("pool", flag(a, "--pool"));
            // TP=4 followers: a request's positions, rows per round and streams as flags (the
            // same values as rank 0's `--context`, `TF_DS_ROUND_ROWS` and `TF_DS_STREAMS`).
            if let Some(context) = flag(a, "--context") {
                put("context", Some(context));
                put("round_rows", flag(a, "--round-rows"));
                put("streams", flag(a, "--streams"));
            }
            put(
                "drafts",
                Some(flag(a, "--drafts").unwrap_or_else(|| "1".to_owned())),
            );
            put(
                "rdma_device_count",
                Some(
                    flag(a, "--rdma")
                        .map_or(0, |d| d.split(',').count())
                        .to_string(),
                ),
            );
            put("rdma_kernels", flag(a, "--rdma-kernels"));
            put("graphs", flag(a, "--graphs").or_else(|| Some("0".into())));
            put("hc_side", flag(a, "--side").or_else(|| Some("0".into())));
            put(
                "l2_prefetch",
                flag(a, "--prefetch").or_else(|| Some("0".into())),
            );
            put("engram_aio", flag(a, "--aio").or_else(|| Some("0".into())));
        }
        // Environment both ranks read identically: replay floor, round/stream knobs, opaque switches.
        for (k, val) in e {
            let per_node = matches!(
                k.as_str(),
                "NCCL_SOCKET_IFNAME"
                    | "NCCL_IB_HCA"
                    | "NCCL_IB_GID_INDEX"
                    | "TF_RDMA_GID_INDEX"
                    | "TF_RDMA_DEVICES"
            );
            let rank0_input = k.starts_with("TF_TP_")
                || matches!(
                    k.as_str(),
                    "TF_DS_RANK_CACHE"
                        | "TF_DS_KIT"
                        | "TENSORFOLD_CUDA_KERNELS"
                        | "TF_DS_ENGRAM"
                        | "TF_DS_TOKEN_MAP"
                        | "TF_DS_GRAPHS"
                        | "TF_DS_HC_SIDE"
                        | "TF_DS_L2_PREFETCH"
                        | "TF_DS_ENGRAM_AIO"
                        | "TF_DS_RDMA_KERNELS"
                );
            if !per_node && !rank0_input {
                v.insert(format!("env.{k}"), val.clone());
            }
        }
        // The reference may differ per node (a testbed worker's own tag); the content may not.
        v.insert("image_content".into(), inputs.image_content.clone());
        v.insert(
            "kit_manifest_sha256".into(),
            inputs.kit_manifest_sha256.clone(),
        );
        v.insert("token_map_sha256".into(), inputs.token_map_sha256.clone());
        v.insert("rank_file_world".into(), world_of(&inputs.rank_file));
        v.insert("inputs_source".into(), inputs.inputs_source.clone());
        v.insert(
            "engram_files".into(),
            inputs
                .engram_files
                .iter()
                .map(|(n, s)| format!("{n}:{s}"))
                .collect::<Vec<_>>()
                .join(","),
        );
        Self {
            values: v,
            rank_file: inputs.rank_file.clone(),
        }
    }
}

/// sha256 (hex) of the canonical JSON of every rank's settings and rank file, in rank order.
fn fingerprint_of(ranks: &[(usize, RankSettings)]) -> String {
    let mut sorted: Vec<&(usize, RankSettings)> = ranks.iter().collect();
    sorted.sort_by_key(|(r, _)| *r);
    let json = serde_json::to_string(&sorted).unwrap_or_default();
    hex::encode(Sha256::digest(json.as_bytes()))
}

/// A setting on which two ranks disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// Setting name.
    pub setting: String,
    /// Rank 0's value.
    pub rank0: String,
    /// The other rank's value.
    pub other: String,
    /// The other rank.
    pub rank: usize,
}

/// Compares every rank against rank 0; returns the fingerprint of all ranks or every mismatch.
///
/// # Errors
///
/// The list of mismatching settings (never empty).
pub fn compare(ranks: &[(usize, RankSettings)]) -> Result<String, Vec<Mismatch>> {
    let Some((_, first)) = ranks.iter().find(|(r, _)| *r == 0) else {
        return Err(vec![Mismatch {
            setting: "rank 0".into(),
            rank0: "<absent>".into(),
            other: String::new(),
            rank: 0,
        }]);
    };
    let mut out = Vec::new();
    for (rank, s) in ranks.iter().filter(|(r, _)| *r != 0) {
        let keys: std::collections::BTreeSet<&String> =
            first.values.keys().chain(s.values.keys()).collect();
        for k in keys {
            let (a, b) = (first.values.get(k), s.values.get(k));
            if a != b {
                let show = |x: Option<&String>| x.cloned().unwrap_or_else(|| "<absent>".into());
                out.push(Mismatch {
                    setting: k.clone(),
                    rank0: show(a),
                    other: show(b),
                    rank: *rank,
                });
            }
        }
    }
    if out.is_empty() {
        Ok(fingerprint_of(ranks))
    } else {
        Err(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentConfig, validate};
    use crate::engine::tensorfold::launch::rank_specs;
    use crate::facts::DeploymentFacts;

    fn specs(f: impl FnOnce(&mut DeploymentConfig)) -> Vec<ContainerSpec> {
        let mut c = DeploymentConfig::default();
        c.engine
            .switches
            .insert("TF_DS_IDX_SPLIT".into(), "2".into());
        f(&mut c);
        let v = validate(c, std::path::Path::new("/home/x")).unwrap();
        rank_specs(&v, &DeploymentFacts::placeholders(&v))
    }

    fn id(token_map: &str) -> InputIdentity {
        id_for(token_map, "rankXof2-abc.bin")
    }

    fn id_for(token_map: &str, rank_file: &str) -> InputIdentity {
        InputIdentity {
            kit_manifest_sha256: "k".into(),
            token_map_sha256: token_map.into(),
            rank_file: rank_file.into(),
            engram_files: vec![("a".into(), 1)],
            image_content: "c0ffee".into(),
            inputs_source: "o/m@c".into(),
        }
    }

    #[test]
    fn the_planned_pair_matches() {
        let s = specs(|_| {});
        let ranks: Vec<_> = s
            .iter()
            .map(|c| (c.rank, RankSettings::of(c, &id("t"))))
            .collect();
        let fp = compare(&ranks).unwrap();
        assert_eq!(fp.len(), 64);
    }

    #[test]
    fn any_difference_is_named() {
        let mut s = specs(|_| {});
        // rank 1 with a different pool, a missing switch and a different token map.
        let pool = s[0].argv.iter().position(|a| a == "--pool").unwrap();
        s[0].argv[pool + 1] = "4096".into();
        s[0].env.remove("TF_DS_IDX_SPLIT");
        let ranks = vec![
            (1, RankSettings::of(&s[0], &id("other"))),
            (0, RankSettings::of(&s[1], &id("t"))),
        ];
        let m = compare(&ranks).unwrap_err();
        let names: Vec<&str> = m.iter().map(|m| m.setting.as_str()).collect();
        assert_eq!(names, ["env.TF_DS_IDX_SPLIT", "pool", "token_map_sha256"]);
    }

    #[test]
    fn context_0_launches_both_ranks_with_the_pool_preflight_computed() {
        let mut c = DeploymentConfig::default();
        c.serving.context = 0;
        let v = validate(c, std::path::Path::new("/home/x")).unwrap();
        let value = |s: &ContainerSpec, flag: &str| {
            let i = s.argv.iter().position(|a| a == flag).unwrap();
            s.argv[i + 1].clone()
        };
        let mut facts = DeploymentFacts::placeholders(&v);
        // The plan before preflight says where the value comes from.
        let s = rank_specs(&v, &facts);
        assert_eq!(s[1].rank, 0);
        assert!(value(&s[1], "--context").contains("computed at preflight"));
        // ... and a launch refuses it as a pending fact.
        let pending = crate::facts::PendingFact::Context;
        assert!(facts.unresolved(&v).iter().any(|(_, p)| *p == pending));
        facts.context = Some(299_008);
        assert!(!facts.unresolved(&v).iter().any(|(_, p)| *p == pending));
        let s = rank_specs(&v, &facts);
        assert_eq!(value(&s[1], "--context"), "299008");
        assert_eq!(value(&s[0], "--pool"), "299008");
        // A configured CONTEXT wins over anything recorded.
        let v = validate(DeploymentConfig::default(), std::path::Path::new("/home/x")).unwrap();
        let s = rank_specs(&v, &facts);
        assert_eq!(
            value(&s[1], "--context"),
            v.config().serving.context.to_string()
        );
    }

    fn four_nodes(c: &mut DeploymentConfig) {
        c.deployment.engine = crate::config::EngineProfileName::TensorfoldDsv41Tp4;
        for i in 2..4 {
            let mut w = c.nodes[1].clone();
            w.name = format!("worker-{i}");
            w.ssh = format!("spark-{}", i + 1);
            c.nodes.push(w);
        }
    }

    #[test]
    fn four_ranks_match_and_the_fingerprint_covers_every_rank_file() {
        let s = specs(four_nodes);
        assert_eq!(
            s.iter().map(|c| c.rank).collect::<Vec<_>>(),
            [3, 2, 1, 0],
            "followers 3, 2, 1, then rank 0"
        );
        let ranks = |files: [&str; 4]| -> Vec<_> {
            s.iter()
                .map(|c| (c.rank, RankSettings::of(c, &id_for("t", files[c.rank]))))
                .collect()
        };
        let files = [
            "rank0of4-a.bin",
            "rank1of4-b.bin",
            "rank2of4-c.bin",
            "rank3of4-d.bin",
        ];
        let fp = compare(&ranks(files)).unwrap();
        // Another rank 2 file (another split) changes the fingerprint of the four.
        let mut other = files;
        other[2] = "rank2of4-e.bin";
        assert_ne!(compare(&ranks(other)).unwrap(), fp);
        // The TP=4 settings are compared: a follower with another --streams is refused by name.
        let mut s2 = s.clone();
        let i = s2[1].argv.iter().position(|a| a == "--streams").unwrap();
        s2[1].argv[i + 1] = "16".into();
        let ranks: Vec<_> = s2
            .iter()
            .map(|c| (c.rank, RankSettings::of(c, &id_for("t", files[c.rank]))))
            .collect();
        let m = compare(&ranks).unwrap_err();
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!((m[0].setting.as_str(), m[0].rank), ("streams", 2));
    }
}
