//! The testbed's engine: the stand-in binary installed as the engine binaries of the head and a
//! from-scratch runtime image imported into the daemon (no registry).

use std::path::Path;

use spark_deploy_core::config::DeploymentConfig;
use spark_deploy_core::layout::NodeLayout;
use spark_deploy_core::ports::docker::{DockerError, DockerNode};

use crate::cluster::labels;
use crate::standin;

/// The stand-in's runtime base, imported from a from-scratch rootfs (the testbed's
/// `engine.base_image`).
pub const BASE: &str = "spark-deploy-testbed/engine-base:standin";
/// The engine image BuildImage builds `FROM` [`BASE`] (the testbed's `engine.image`).
pub const IMAGE: &str = "spark-deploy-testbed/engine:standin";

/// Errors of preparing the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The stand-in binary is not built.
    #[error(
        "the tf-standin binary was not found next to this executable; remedy: `cargo build -p spark-deploy-testbed --bin tf-standin`"
    )]
    NoBinary,
    /// Building the rootfs or installing the binaries failed.
    #[error("preparing the stand-in engine in {path}: {source}")]
    Io {
        /// Where.
        path: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Importing the image failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
}

/// Imports the stand-in's runtime base image into the head's daemon (labelled, so `down` removes
/// it and every image built from it; BuildImage builds the engine image from it)
/// and installs the binary as `tensorfold-native` and `tf-dsv41-lanes` in the head's engine dir of
/// `config`. Sets `config.engine.image`.
///
/// # Errors
///
/// [`EngineError`].
pub async fn prepare(
    config: &mut DeploymentConfig,
    home: &Path,
    binary: Option<&Path>,
) -> Result<(), EngineError> {
    // `SPARK_DEPLOY_STANDIN` names the binary when this process is not a cargo-built executable
    // (e.g. Python); otherwise it is found next to the executable.
    let located = std::env::var_os("SPARK_DEPLOY_STANDIN")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(standin::locate_binary);
    let bin = binary
        .map(Path::to_path_buf)
        .or(located)
        .ok_or(EngineError::NoBinary)?;
    config.engine.image = IMAGE.to_owned();
    config.engine.base_image = BASE.to_owned();
    let v =
        spark_deploy_core::config::validate(config.clone(), home).map_err(|e| EngineError::Io {
            path: "config".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
    let engine_dir = NodeLayout::of(&v, &v.config().nodes[0]).engine_dir;
    standin::install_engine_dir(&bin, Path::new(&engine_dir)).map_err(|source| {
        EngineError::Io {
            path: engine_dir.clone(),
            source,
        }
    })?;
    let programs: Vec<&Path> = standin::SHELL_PROGRAMS.iter().map(Path::new).collect();
    let tar = standin::rootfs_tar_with(&bin, &programs).map_err(|source| EngineError::Io {
        path: bin.display().to_string(),
        source,
    })?;
    let docker = DockerNode::local(
        "head",
        Path::new(spark_deploy_core::ports::docker::DEFAULT_SOCKET),
    )?;
    let stream =
        futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(tar)) });
    docker
        .import_image(BASE, &[format!("LABEL {}=1", labels::LABEL)], stream)
        .await?;
    Ok(())
}
