//! The cross-rank fingerprint: every setting and input identity both ranks must share, read from
//! the rank containers' specs and from each node's files, compared against rank 0.

use super::fingerprint::{InputIdentity, RankSettings, compare};
use crate::container::ContainerSpec;
use crate::context::Context;
use crate::engine::FingerprintError;
use crate::layout::NodeLayout;
use crate::ports::exec::Cmd;

/// The kit's MANIFEST hash, the token map's hash, the rank file's name and the Engram tables'
/// names and sizes on one node, one line each.
const IDENTITY_SCRIPT: &str = r#"kit="$1"; inputs="$2"; engram="$3"; prefix="$4"
if [ -f "$kit/MANIFEST" ]; then echo "kit $(sha256sum "$kit/MANIFEST" | cut -d' ' -f1)"; else echo "kit missing"; fi
if [ -f "$inputs/dsv41_token_map.json" ]; then echo "tokenmap $(sha256sum "$inputs/dsv41_token_map.json" | cut -d' ' -f1)"; else echo "tokenmap missing"; fi
for f in "$inputs/rank-cache/$prefix"*.bin; do [ -f "$f" ] && [ ! -L "$f" ] && echo "rank $(basename "$f")"; done
for f in "$engram"/*.safetensors; do [ -e "$f" ] && echo "engram $(basename "$f") $(stat -L -c %s "$f")"; done
true"#;

async fn identity(ctx: &Context, spec: &ContainerSpec) -> Result<InputIdentity, FingerprintError> {
    let err = |e: Box<dyn std::error::Error + Send + Sync>| FingerprintError::Inputs {
        rank: spec.rank,
        node: spec.node.clone(),
        detail: e.to_string(),
    };
    let i = ctx.node_index(&spec.node);
    let c = ctx.config().config();
    let layout = NodeLayout::of(ctx.config(), &c.nodes[i]);
    let world = c.nodes.len();
    let out = ctx
        .exec(i)
        .await
        .map_err(|e| err(Box::new(e)))?
        .run(&Cmd::shell(IDENTITY_SCRIPT).args([
            "sh",
            &layout.kit_dir,
            &layout.inputs_dir,
            &layout.engram_dir,
            &format!("rank{}of{world}-", spec.rank),
        ]))
        .await
        .map_err(|e| err(Box::new(e)))?;
    let mut id = InputIdentity::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("kit"), Some(v), _) => id.kit_manifest_sha256 = v.to_owned(),
            (Some("tokenmap"), Some(v), _) => id.token_map_sha256 = v.to_owned(),
            (Some("rank"), Some(v), _) => {
                if !id.rank_file.is_empty() {
                    return Err(err(format!(
                        "two rank files for rank {} in {}/rank-cache: {} and {v}",
                        spec.rank, layout.inputs_dir, id.rank_file
                    )
                    .into()));
                }
                id.rank_file = v.to_owned();
            }
            (Some("engram"), Some(n), Some(s)) => {
                id.engram_files.push((n.to_owned(), s.parse().unwrap_or(0)))
            }
            _ => {}
        }
    }
    if id.rank_file.is_empty() {
        return Err(err(format!(
            "no rank{}of{world}-*.bin in {}/rank-cache",
            spec.rank, layout.inputs_dir
        )
        .into()));
    }
    let docker = ctx.docker(i).await.map_err(|e| err(Box::new(e)))?;
    let image = docker
        .inspect_image(&spec.image)
        .await
        .map_err(|e| err(Box::new(e)))?
        .ok_or_else(|| {
            err(format!("image {} is not present on {}", spec.image, spec.node).into())
        })?;
    // Images are the same when their content labels are, whatever their IDs.
    id.image_content = image
        .config
        .and_then(|c| c.labels)
        .and_then(|l| l.get(crate::container::labels::CONTENT).cloned())
        .ok_or_else(|| {
            err(format!(
                "image {} on {} has no {} label: it was not built by BuildImage (`spark-deploy up` builds and ships it)",
                spec.image,
                spec.node,
                crate::container::labels::CONTENT
            )
            .into())
        })?;
    Ok(id)
}

/// The fingerprint of `specs` with the inputs each node holds now.
///
/// # Errors
///
/// [`FingerprintError`]: an unreadable node, or every setting that differs.
pub(crate) async fn fingerprint(
    ctx: &Context,
    specs: &[ContainerSpec],
) -> Result<String, FingerprintError> {
    let mut ranks = Vec::new();
    for s in specs {
        let id = identity(ctx, s).await?;
        ranks.push((s.rank, RankSettings::of(s, &id)));
    }
    compare(&ranks).map_err(|m| {
        FingerprintError::Mismatch(
            m.iter()
                .map(|m| {
                    format!(
                        "{} (rank 0: {}, rank {}: {})",
                        m.setting, m.rank0, m.rank, m.other
                    )
                })
                .collect(),
        )
    })
}
