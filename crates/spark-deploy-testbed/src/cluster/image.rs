//! The node image, built with no registry: a minimal root filesystem of the machine's own
//! Debian release made by `mmdebstrap` from the machine's own apt sources, imported with
//! `docker import` semantics (`create_image` with `fromSrc=-`).
//!
//! Caching: the image is tagged and labelled with a hash of its recipe (release, packages,
//! architecture, the apt sources file's contents). `up` reuses an image with the same recipe
//! label; the rootfs tar is also kept in a cache directory, so after `down` (which removes the
//! image) the next `up` only re-imports it. Both can always be rebuilt.

use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use spark_deploy_core::ports::docker::{DockerError, DockerNode};

use super::labels;

/// Bumped when the recipe changes in a way its inputs do not show.
const RECIPE_VERSION: &str = "1";
/// Packages of the node image. `tcc` and `libc6-dev` make it the engine build's base too
/// (`engine_build::BUILD_BASE` compiles the testbed's C engine with them). `python3` is what a
/// Spark's OS has and the copy's receiver prefers (the core's transfer falls back to
/// `curl | tee | openssl` without it; its tests cover both).
pub const PACKAGES: &[&str] = &[
    "openssh-server",
    "iproute2",
    "procps",
    "curl",
    "rsync",
    "openssl",
    "python3",
    "tcc",
    "libc6-dev",
];
/// The candidate apt sources files, in order of preference.
pub const APT_SOURCES: &[&str] = &[
    "/etc/apt/sources.list.d/debian.sources",
    "/etc/apt/sources.list.d/ubuntu.sources",
    "/etc/apt/sources.list",
];
/// Removes the host keys the openssh-server package generated: every testbed generates its own.
const CUSTOMIZE_HOOK: &str = "rm -f \"$1\"/etc/ssh/ssh_host_*";

/// Errors of building the node image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The release could not be determined.
    #[error(
        "cannot determine the Debian release from /etc/os-release: {reason} \
         (remedy: set `suite` in the testbed options)"
    )]
    Release {
        /// Why.
        reason: String,
    },
    /// No usable apt sources file.
    #[error(
        "no apt sources file found (looked for {}) \
         (remedy: set `apt_sources` in the testbed options to this machine's sources file)",
        APT_SOURCES.join(", ")
    )]
    NoSources,
    /// A file could not be read or written.
    #[error("cannot {op} {path}: {source}")]
    File {
        /// `read`, `create`, `rename`.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// mmdebstrap is not installed.
    #[error(
        "mmdebstrap is not installed \
         (remedy: `apt-get install -y mmdebstrap`, or set `install_tools` in the testbed options)"
    )]
    MmdebstrapMissing,
    /// Installing mmdebstrap failed.
    #[error("`{command}` failed: {stderr} (remedy: install mmdebstrap by hand)")]
    Install {
        /// The command.
        command: String,
        /// The tail of its output.
        stderr: String,
    },
    /// A tool could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// mmdebstrap failed.
    #[error(
        "mmdebstrap failed ({status}): {stderr} \
         (remedy: check that the apt sources in {sources} are reachable and that this runs as root)"
    )]
    Mmdebstrap {
        /// Exit status.
        status: std::process::ExitStatus,
        /// The tail of its stderr.
        stderr: String,
        /// The sources file used.
        sources: PathBuf,
    },
    /// A Docker call failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
}

/// What the node image is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// Debian suite (codename), e.g. `bookworm`.
    pub suite: String,
    /// The apt sources file given to mmdebstrap as its mirror argument.
    pub sources: PathBuf,
    /// The contents of that file (part of the hash).
    pub sources_text: String,
    /// Packages added to the `apt` variant.
    pub packages: Vec<String>,
}

impl Recipe {
    /// The recipe for this machine: its release and its apt sources.
    ///
    /// # Errors
    ///
    /// [`ImageError::Release`], [`ImageError::NoSources`] or [`ImageError::File`].
    pub fn for_this_machine(
        suite: Option<&str>,
        sources: Option<&Path>,
    ) -> Result<Self, ImageError> {
        let suite = match suite {
            Some(s) => s.to_owned(),
            None => os_codename()?,
        };
        let sources = match sources {
            Some(p) => p.to_owned(),
            None => APT_SOURCES
                .iter()
                .map(PathBuf::from)
                .find(|p| {
                    std::fs::read_to_string(p).is_ok_and(|t| {
                        t.lines().any(|l| {
                            let l = l.trim_start();
                            l.starts_with("deb ") || l.starts_with("Types:")
                        })
                    })
                })
                .ok_or(ImageError::NoSources)?,
        };
        let sources_text =
            std::fs::read_to_string(&sources).map_err(|source| ImageError::File {
                op: "read",
                path: sources.clone(),
                source,
            })?;
        Ok(Self {
            suite,
            sources,
            sources_text,
            packages: PACKAGES.iter().map(|s| (*s).to_owned()).collect(),
        })
    }

    /// Hex SHA-256 of everything that determines the image.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            RECIPE_VERSION,
            &self.suite,
            std::env::consts::ARCH,
            &self.packages.join(","),
            CUSTOMIZE_HOOK,
            &self.sources_text,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        hex::encode(h.finalize())
    }

    /// The image reference: `spark-deploy-testbed/node:<first 12 hex of the hash>`.
    pub fn reference(&self) -> String {
        format!("{}:{}", labels::NODE_IMAGE_REPO, &self.hash()[..12])
    }
}

fn os_codename() -> Result<String, ImageError> {
    let text = std::fs::read_to_string("/etc/os-release").map_err(|e| ImageError::Release {
        reason: e.to_string(),
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ImageError::Release {
            reason: "no VERSION_CODENAME".to_owned(),
        })
}

/// How the image was obtained, for reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageSource {
    /// An image with the same recipe label was already present.
    Reused,
    /// Imported from the cached rootfs tar.
    ImportedFromCache,
    /// Built with mmdebstrap, then imported.
    Built,
}

/// Makes sure the node image for `recipe` exists; returns its reference and how it was got.
///
/// # Errors
///
/// [`ImageError`] from mmdebstrap, the cache directory or the import.
pub async fn ensure(
    docker: &DockerNode,
    recipe: &Recipe,
    cache_dir: &Path,
    install_tools: bool,
) -> Result<(String, ImageSource), ImageError> {
    let reference = recipe.reference();
    let hash = recipe.hash();
    let wanted = format!("{}={hash}", labels::LABEL_RECIPE);
    if docker
        .list_images_by_label(&wanted)
        .await?
        .iter()
        .any(|i| i.repo_tags.contains(&reference))
    {
        return Ok((reference, ImageSource::Reused));
    }
    std::fs::create_dir_all(cache_dir).map_err(|source| ImageError::File {
        op: "create",
        path: cache_dir.to_owned(),
        source,
    })?;
    let tar = cache_dir.join(format!("rootfs-{}.tar", &hash[..16]));
    let source = if tar.is_file() {
        ImageSource::ImportedFromCache
    } else {
        build_rootfs(recipe, &tar, install_tools).await?;
        ImageSource::Built
    };
    let changes = vec![
        format!("LABEL {}={}", labels::LABEL, labels::LABEL_VALUE),
        format!("LABEL {}=node-image", labels::LABEL_ROLE),
        format!("LABEL {}={hash}", labels::LABEL_RECIPE),
        "CMD [\"/bin/bash\"]".to_owned(),
    ];
    docker.import_image_file(&reference, &changes, &tar).await?;
    Ok((reference, source))
}

/// Runs mmdebstrap into `out` (written under a temporary name, renamed when complete).
///
/// # Errors
///
/// [`ImageError::MmdebstrapMissing`], [`ImageError::Install`], [`ImageError::Mmdebstrap`].
pub async fn build_rootfs(
    recipe: &Recipe,
    out: &Path,
    install_tools: bool,
) -> Result<(), ImageError> {
    ensure_mmdebstrap(install_tools).await?;
    // mmdebstrap picks the output format from the extension, so the temporary name ends in .tar.
    let partial = out.with_extension("partial.tar");
    let _ = std::fs::remove_file(&partial);
    let output = tokio::process::Command::new("mmdebstrap")
        .arg("--quiet")
        .arg("--variant=apt")
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg(format!("--customize-hook={CUSTOMIZE_HOOK}"))
        .arg(&recipe.suite)
        .arg(&partial)
        .arg(&recipe.sources)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| ImageError::Spawn {
            program: "mmdebstrap".to_owned(),
            source,
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(ImageError::Mmdebstrap {
            status: output.status,
            stderr: tail(&output.stderr),
            sources: recipe.sources.clone(),
        });
    }
    std::fs::rename(&partial, out).map_err(|source| ImageError::File {
        op: "rename",
        path: partial.clone(),
        source,
    })?;
    Ok(())
}

async fn ensure_mmdebstrap(install: bool) -> Result<(), ImageError> {
    if which("mmdebstrap") {
        return Ok(());
    }
    if !install {
        return Err(ImageError::MmdebstrapMissing);
    }
    let run = |args: &'static [&'static str]| async move {
        let out = tokio::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|source| ImageError::Spawn {
                program: "apt-get".to_owned(),
                source,
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(ImageError::Install {
                command: format!("apt-get {}", args.join(" ")),
                stderr: tail(&out.stderr),
            })
        }
    };
    if run(&["install", "-y", "mmdebstrap"]).await.is_err() {
        run(&["update"]).await?;
        run(&["install", "-y", "mmdebstrap"]).await?;
    }
    if which("mmdebstrap") {
        Ok(())
    } else {
        Err(ImageError::MmdebstrapMissing)
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

fn tail(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    let start = s.len().saturating_sub(1500);
    let start = (start..=s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    s[start..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(text: &str) -> Recipe {
        Recipe {
            suite: "bookworm".into(),
            sources: "/etc/apt/sources.list.d/debian.sources".into(),
            sources_text: text.into(),
            packages: PACKAGES.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn hash_follows_the_inputs() {
        let a = recipe("Types: deb\n");
        assert_eq!(a.hash(), recipe("Types: deb\n").hash());
        assert_ne!(a.hash(), recipe("Types: deb deb-src\n").hash());
        assert!(a.reference().starts_with("spark-deploy-testbed/node:"));
        assert_eq!(a.reference().len(), "spark-deploy-testbed/node:".len() + 12);
    }

    #[test]
    fn this_machine_has_a_recipe() {
        // Every machine that runs the testbed is a Debian-family machine with apt sources.
        if std::path::Path::new("/etc/apt").is_dir() {
            let r = Recipe::for_this_machine(None, None).unwrap();
            assert!(!r.suite.is_empty());
        }
    }
}
