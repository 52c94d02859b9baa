//! The image routing bias (`*.ffn.gate.bias_vl` tensors) read by byte range from the original
//! model when the kit does not publish `gate_bias_vl.safetensors`.

use super::inputs::bias_vl;
use crate::context::Context;
use crate::event::{Level, StepKind};
use crate::hub::{HfToken, Hub, HubConfig};
use crate::layout::{hub_dir, snapshot_dir};

/// When the fetched kit does not publish `vision/gate_bias_vl.safetensors`, reads the
/// `*.ffn.gate.bias_vl` tensors of the original model by byte range (shard headers, then only
/// those ranges — never whole shards) and writes the head's `bias_vl_file`. The tensor bytes
/// read (headers not counted), or `None` when nothing was needed.
pub(crate) async fn fetch_bias_vl(
    ctx: &Context,
    endpoint: Option<String>,
    token: Option<HfToken>,
) -> Result<Option<u64>, Box<dyn std::error::Error + Send + Sync>> {
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
    let index: serde_json::Value = serde_json::from_slice(&fs_err::read(&index_path)?)?;
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
    cfg.offline = c.hub.offline;
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
        Some(&c.nodes[0].name),
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
