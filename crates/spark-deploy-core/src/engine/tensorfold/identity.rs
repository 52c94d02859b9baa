//! The cross-rank fingerprint: every setting and input identity both ranks must share, read from
//! the rank containers' specs and from each node's files, compared against rank 0.

use std::path::{Path, PathBuf};

use super::fingerprint::{InputIdentity, RankSettings, compare};
use super::rank_inputs::source::{self, InputsSource};
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
        return Err(FingerprintError::Prepared {
            rank: spec.rank,
            node: spec.node.clone(),
            dir: layout.inputs_dir.clone(),
            detail: format!("no rank{}of{world}-*.bin in rank-cache/", spec.rank),
            remedy: "prepare the inputs first: `spark-deploy prepare` (or `spark-deploy up`) with the same settings".into(),
        });
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
    let prepared = prepared_source(ctx, specs)?;
    let mut ranks = Vec::new();
    for s in specs {
        let mut id = identity(ctx, s).await?;
        id.inputs_source.clone_from(&prepared);
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

/// The regular file `rank{rank}of{world}-*.bin` in `dir`, if any.
fn rank_file_in(dir: &Path, rank: usize, world: usize) -> Option<PathBuf> {
    let prefix = format!("rank{rank}of{world}-");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".bin"))
        })
}

/// The other inputs directories of the same checkpoint revision on the head (the other `ABLIT`
/// value, another overlay revision) that hold a rank file for `rank`.
fn prepared_elsewhere(inputs_dir: &Path, rank: usize, world: usize) -> Vec<PathBuf> {
    let (Some(parent), Some(name)) = (
        inputs_dir.parent(),
        inputs_dir.file_name().and_then(|n| n.to_str()),
    ) else {
        return Vec::new();
    };
    let base = name.split_once("+ablit@").map_or(name, |(b, _)| b);
    let mut out: Vec<PathBuf> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n != name && (n == base || n.starts_with(&format!("{base}+ablit@")))
        })
        .map(|e| e.path())
        .filter(|d| rank_file_in(&d.join("rank-cache"), rank, world).is_some())
        .collect();
    out.sort();
    out
}

/// The source every rank file on the head was built from (recorded in its sidecar by
/// BuildRankCache), checked against what this start serves: another `ABLIT` value, overlay or
/// checkpoint is refused here, naming the setting and the command that prepares it. The head
/// builds every rank's file (rank 1's is shipped from it), so the head's sidecars speak for all.
fn prepared_source(ctx: &Context, specs: &[ContainerSpec]) -> Result<String, FingerprintError> {
    let c = ctx.config().config();
    let world = c.nodes.len();
    let head = NodeLayout::of(ctx.config(), &c.nodes[0]);
    let wanted = InputsSource::of(ctx.config(), &ctx.facts());
    let setting = wanted.ablit_setting();
    let remedy = format!(
        "run `spark-deploy prepare` (or `spark-deploy up`) with {setting}, which builds the rank files for it; or start with the setting the inputs were prepared with"
    );
    let dir = PathBuf::from(&head.inputs_dir);
    let mut label = String::new();
    for s in specs {
        let refuse = |detail: String| FingerprintError::Prepared {
            rank: s.rank,
            node: c.nodes[0].name.clone(),
            dir: head.inputs_dir.clone(),
            detail,
            remedy: remedy.clone(),
        };
        let Some(file) = rank_file_in(&dir.join("rank-cache"), s.rank, world) else {
            let other = prepared_elsewhere(&dir, s.rank, world);
            if let Some(o) = other.first() {
                let how = rank_file_in(&o.join("rank-cache"), s.rank, world)
                    .and_then(|f| source::recorded(&f))
                    .and_then(|r| wanted.differs_from(&r))
                    .unwrap_or_else(|| format!("they differ from this start's {setting}"));
                return Err(refuse(format!(
                    "it holds no rank{}of{world}-*.bin; rank files were prepared in {} instead: {how}",
                    s.rank,
                    o.display()
                )));
            }
            // Nothing prepared anywhere: the node's own check below names the missing file.
            continue;
        };
        let name = file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let Some(recorded) = source::recorded(&file) else {
            return Err(refuse(format!(
                "{name} has no readable sidecar recording what it was built from, so the weights it holds are unknown"
            )));
        };
        if let Some(d) = wanted.differs_from(&recorded) {
            return Err(refuse(format!("{name}: {d}")));
        }
        label = recorded;
    }
    Ok(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(dir: &Path, name: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), b"x").unwrap();
    }

    #[test]
    fn the_other_ablit_directory_is_found_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let genuine = d.path().join("o--m@main");
        let ablit = d.path().join("o--m@main+ablit@main");
        let other_rev = d.path().join("o--m@v2");
        touch(&genuine.join("rank-cache"), "rank0of2-abc.bin");
        touch(&other_rev.join("rank-cache"), "rank0of2-abc.bin");
        touch(&ablit.join("rank-cache"), "rank1of2-abc.bin");
        // Another checkpoint revision is not the same inputs with another ABLIT value.
        assert_eq!(prepared_elsewhere(&ablit, 0, 2), vec![genuine.clone()]);
        assert_eq!(prepared_elsewhere(&genuine, 1, 2), vec![ablit.clone()]);
        assert!(prepared_elsewhere(&genuine, 0, 2).is_empty());
        assert!(rank_file_in(&ablit.join("rank-cache"), 0, 2).is_none());
        // A symlink is no rank file (the engine does not see it).
        std::os::unix::fs::symlink(
            genuine.join("rank-cache/rank0of2-abc.bin"),
            ablit.join("rank-cache/rank0of2-abc.bin"),
        )
        .unwrap();
        assert!(rank_file_in(&ablit.join("rank-cache"), 0, 2).is_none());
    }
}
