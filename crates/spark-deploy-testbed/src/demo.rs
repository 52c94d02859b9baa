//! Everything a deployment onto the testbed needs besides the cluster: the generated test-scale
//! checkpoint served by the HF-compatible hub, the stand-in engine, and the config that ties them
//! together. Used by `spark-deploy demo`, the Python module and the end-to-end tests.

use std::path::Path;

use spark_deploy_core::config::DeploymentConfig;

use crate::checkpoint::{CheckpointSpec, generate, generate_overlay};
use crate::cluster::TestbedInfo;
use crate::hub_server::{HubOptions, HubServer};

/// The checkpoint repo on the testbed hub.
pub const MODEL: &str = "testbed/dsv41-exl3";
/// The "original model" repo (Engram tables, `bias_vl`).
pub const ORIGINAL: &str = "testbed/dsv41-original";
/// The kit repo (folder `kit/`).
pub const KIT: &str = "testbed/dsv41-kit";
/// The gated `ABLIT` overlay repo ([`crate::checkpoint::OVERLAY_FILE`] and a `config.json`).
pub const ABLIT: &str = "testbed/dsv41-ablit";
/// The token the testbed hub accepts for [`ABLIT`] (gated like the real overlay). A test value,
/// not a secret: the demo config never carries it; set `HF_TOKEN` to it for `ABLIT=1`.
pub const ABLIT_TOKEN: &str = "hf_testbed_ablit_access";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Generates the small checkpoint (seed `seed`) as three hub repos below `root`, once.
///
/// # Errors
///
/// Generation or file-system errors.
pub fn hub_tree(root: &Path, seed: u64) -> Result<(), BoxError> {
    hub_tree_of(root, &CheckpointSpec::small(seed))
}

/// Generates the `ABLIT` overlay of the small checkpoint (seed `seed`) as the repo [`ABLIT`] below
/// `root`, once (written aside, then moved in whole).
///
/// # Errors
///
/// Generation or file-system errors.
pub fn ablit_tree(root: &Path, seed: u64) -> Result<(), BoxError> {
    let to = root.join(ABLIT);
    if to.join(crate::checkpoint::OVERLAY_FILE).exists() {
        return Ok(());
    }
    let scratch = root.join(".gen-ablit");
    let _ = fs_err::remove_dir_all(&scratch);
    generate_overlay(&CheckpointSpec::small(seed), &scratch)?;
    fs_err::create_dir_all(to.parent().ok_or("repo path")?)?;
    let _ = fs_err::remove_dir_all(&to);
    fs_err::rename(&scratch, &to)?;
    Ok(())
}

/// Generates the checkpoint of `spec` as the three hub repos [`MODEL`], [`ORIGINAL`] and [`KIT`]
/// below `root`, once: a complete tree (the model's `config.json` and the kit, which is moved in
/// last) is left as it is, whatever spec made it.
///
/// # Errors
///
/// Generation or file-system errors.
pub fn hub_tree_of(root: &Path, spec: &CheckpointSpec) -> Result<(), BoxError> {
    if root.join(MODEL).join("config.json").exists() && root.join(KIT).join("kit").is_dir() {
        return Ok(());
    }
    let scratch = root.join(".gen");
    let _ = fs_err::remove_dir_all(&scratch);
    let g = generate(spec, &scratch)?;
    for (dir, repo) in [(&g.model_dir, MODEL), (&g.original_dir, ORIGINAL)] {
        let to = root.join(repo);
        fs_err::create_dir_all(to.parent().ok_or("repo path")?)?;
        let _ = fs_err::remove_dir_all(&to);
        fs_err::rename(dir, &to)?;
    }
    fs_err::create_dir_all(root.join(KIT))?;
    let _ = fs_err::remove_dir_all(root.join(KIT).join("kit"));
    fs_err::rename(&g.kit_dir, root.join(KIT).join("kit"))?;
    fs_err::remove_dir_all(&scratch)?;
    Ok(())
}

/// Starts the hub on loopback over the generated repos and returns it with a deployment config
/// for `info` that fetches from it and runs the stand-in engine (image imported, binaries
/// installed in the head's engine dir).
///
/// # Errors
///
/// Generation, hub or engine preparation errors.
pub async fn prepare(
    info: &TestbedInfo,
    home: &Path,
) -> Result<(HubServer, DeploymentConfig), BoxError> {
    prepare_with_engine(info, home, None).await
}

/// [`prepare`] with the stand-in executable given: `standin` is installed as the engine binaries
/// (a multi-call binary that runs the stand-in when invoked as `tensorfold-native` or
/// `tf-dsv41-lanes`, such as the `spark-deploy` CLI itself); `None` finds `tf-standin` as
/// [`crate::engine::prepare`] does.
///
/// # Errors
///
/// Generation, hub or engine preparation errors.
pub async fn prepare_with_engine(
    info: &TestbedInfo,
    home: &Path,
    standin: Option<&Path>,
) -> Result<(HubServer, DeploymentConfig), BoxError> {
    prepare_served(info, home, standin, None).await
}

/// [`prepare`] with the hub's link limited so that fetching the checkpoint's three repos takes
/// about `fetch_time`, all transfers together, so that what overlaps the fetch can be seen in the
/// events (the small checkpoint otherwise lands in a fraction of a second).
///
/// # Errors
///
/// Generation, hub or engine preparation errors.
pub async fn prepare_paced(
    info: &TestbedInfo,
    home: &Path,
    fetch_time: std::time::Duration,
) -> Result<(HubServer, DeploymentConfig), BoxError> {
    let repos = info.state_dir.join("hub-repos");
    let r = repos.clone();
    let total = tokio::task::spawn_blocking(move || -> Result<u64, BoxError> {
        hub_tree(&r, 5)?;
        [MODEL, ORIGINAL, KIT]
            .iter()
            .map(|repo| tree_bytes(&r.join(repo)))
            .sum()
    })
    .await??;
    let per_s = (u128::from(total) * 1000 / fetch_time.as_millis().max(1)).max(1);
    let link_rate = std::num::NonZeroU64::new(u64::try_from(per_s)?).ok_or("link rate")?;
    prepare_served(info, home, None, Some(link_rate)).await
}

/// The bytes of every file below `dir`.
fn tree_bytes(dir: &Path) -> Result<u64, BoxError> {
    let mut total = 0;
    for entry in fs_err::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        total += if kind.is_dir() {
            tree_bytes(&entry.path())?
        } else {
            entry.metadata()?.len()
        };
    }
    Ok(total)
}

/// The small checkpoint and its overlay generated once below the testbed's state dir, served
/// with the overlay gated and the link limited to `link_rate` (if any).
async fn prepare_served(
    info: &TestbedInfo,
    home: &Path,
    standin: Option<&Path>,
    link_rate: Option<std::num::NonZeroU64>,
) -> Result<(HubServer, DeploymentConfig), BoxError> {
    let repos = info.state_dir.join("hub-repos");
    let r = repos.clone();
    tokio::task::spawn_blocking(move || hub_tree(&r, 5).and_then(|()| ablit_tree(&r, 5))).await??;
    let options = HubOptions {
        gated: std::collections::HashMap::from([(ABLIT.to_owned(), ABLIT_TOKEN.to_owned())]),
        link_rate,
        ..HubOptions::default()
    };
    prepare_on(info, home, standin, &repos, options).await
}

/// [`prepare_with_engine`] over the hub repositories already generated below `repos` (see
/// [`hub_tree_of`]; the `ABLIT` overlay repo is optional), served with `options` (a link rate,
/// for a benchmark).
///
/// # Errors
///
/// Hub or engine preparation errors.
pub async fn prepare_on(
    info: &TestbedInfo,
    home: &Path,
    standin: Option<&Path>,
    repos: &Path,
    options: HubOptions,
) -> Result<(HubServer, DeploymentConfig), BoxError> {
    let base = crate::deployment::deployment_config(info);
    prepare_config(base, home, standin, repos, options).await
}

/// [`prepare_with_engine`] serving the checkpoint of `spec` from the hub repos below `repos`
/// (generated once, as [`hub_tree_of`] does; the `ABLIT` overlay is the small checkpoint's, seed
/// 5, whatever `spec`), with `base` as the config to complete (its directories and nodes kept; the
/// engine is installed in its head's engine dir). `bench-up-stopped` uses it for the large
/// checkpoint.
///
/// # Errors
///
/// Generation, hub or engine preparation errors.
pub async fn prepare_checkpoint(
    home: &Path,
    standin: Option<&Path>,
    repos: &Path,
    spec: CheckpointSpec,
    base: DeploymentConfig,
) -> Result<(HubServer, DeploymentConfig), BoxError> {
    let r = repos.to_path_buf();
    tokio::task::spawn_blocking(move || hub_tree_of(&r, &spec).and_then(|()| ablit_tree(&r, 5)))
        .await??;
    let options = HubOptions {
        gated: std::collections::HashMap::from([(ABLIT.to_owned(), ABLIT_TOKEN.to_owned())]),
        ..HubOptions::default()
    };
    prepare_config(base, home, standin, repos, options).await
}

/// [`prepare_on`] completing `base` (its directories and nodes kept).
async fn prepare_config(
    base: DeploymentConfig,
    home: &Path,
    standin: Option<&Path>,
    repos: &Path,
    options: HubOptions,
) -> Result<(HubServer, DeploymentConfig), BoxError> {
    let hub = HubServer::start(repos, "127.0.0.1:0".parse()?, options)?;
    let mut config = base;
    config.hub.endpoint = hub.endpoint();
    config.model.id = MODEL.into();
    config.model.revision = hub.commit(MODEL).ok_or("model commit")?;
    config.model.engram_repo = ORIGINAL.into();
    config.model.engram_revision = hub.commit(ORIGINAL).ok_or("original commit")?;
    config.model.engram_files = vec!["*.safetensors".into()];
    config.model.kit_repo = KIT.into();
    config.model.kit_revision = hub.commit(KIT).ok_or("kit commit")?;
    // ABLIT stays off; `ABLIT=1` (with HF_TOKEN = ABLIT_TOKEN) serves the gated overlay.
    config.model.ablit_id = ABLIT.into();
    if let Some(commit) = hub.commit(ABLIT) {
        config.model.ablit_revision = commit;
    }
    crate::engine::prepare(&mut config, home, standin).await?;
    Ok((hub, config))
}
