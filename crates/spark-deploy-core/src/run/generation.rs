//! Recording the generation a successful launch made serving (see
//! [`crate::lifecycle::generations`]): its config, fingerprint and, per node, an image tag kept
//! for a later rollback.

use crate::context::Context;
use crate::event::{Level, StepKind};
use crate::layout::NodeLayout;
use crate::lifecycle::generations::{self, Generation, GenerationState};
use crate::lifecycle::launch_record;

/// `<repository>:fp-<fingerprint>`: the tag that keeps a generation's image when a later build
/// takes the image's name.
#[must_use]
pub fn generation_tag(image: &str, fingerprint: &str) -> String {
    let repo = match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    };
    let short: String = fingerprint
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect();
    format!("{repo}:fp-{short}")
}

/// Records the launch just made as the serving generation. A history that cannot be written
/// costs only `history` and `rollback` their view of this launch: warned, not fatal.
pub(crate) async fn record_serving(ctx: &Context) {
    let c = ctx.config().config();
    let state_dir = std::path::Path::new(&c.deployment.state_dir);
    let warn = |what: String| {
        ctx.log(
            StepKind::Smoke,
            None,
            Level::Warn,
            format!("{what}: `history` and `rollback` will not know this launch"),
        );
    };
    let record = match launch_record::read(state_dir) {
        Ok(Some(r)) => r,
        Ok(None) => return warn("no launch record".into()),
        Err(e) => return warn(e.to_string()),
    };
    let mut images = Vec::with_capacity(c.nodes.len());
    for (i, node) in c.nodes.iter().enumerate() {
        let image = NodeLayout::of(ctx.config(), node).image;
        let tag = generation_tag(&image, &record.fingerprint);
        let tagged = match ctx.docker(i).await {
            Ok(d) => d.tag_image(&image, &tag).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = tagged {
            ctx.log(
                StepKind::Smoke,
                Some(&node.name),
                Level::Warn,
                format!(
                    "tagging {image} as {tag}: {e}; a rollback will start {image} as it is then"
                ),
            );
            images.push(image);
        } else {
            images.push(tag);
        }
    }
    let generation = Generation {
        id: 0,
        state: GenerationState::Serving,
        config: serde_json::to_value(c).unwrap_or_default(),
        config_sha256: record.config_sha256.clone(),
        fingerprint: record.fingerprint.clone(),
        model_commit: record.model_commit.clone(),
        images,
        served_from: record.at_unix,
        served_until: None,
        figures: None,
        note: None,
    };
    let mut history = match generations::read(state_dir) {
        Ok(h) => h,
        Err(e) => return warn(e.to_string()),
    };
    let id = history.serve(generation, record.at_unix);
    if let Err(e) = generations::write(state_dir, &history) {
        return warn(e.to_string());
    }
    ctx.log(
        StepKind::Smoke,
        None,
        Level::Info,
        format!("generation {id} serves (`spark-deploy history` lists them)"),
    );
}

#[cfg(test)]
mod tests {
    use super::generation_tag;

    #[test]
    fn the_tag_keeps_the_repository_and_names_the_fingerprint() {
        assert_eq!(
            generation_tag("spark-deploy/tensorfold-dsv41:local", "ab12-cd34ef"),
            "spark-deploy/tensorfold-dsv41:fp-ab12cd34ef"
        );
        assert_eq!(
            generation_tag("registry:5000/img", "ff"),
            "registry:5000/img:fp-ff"
        );
    }
}
