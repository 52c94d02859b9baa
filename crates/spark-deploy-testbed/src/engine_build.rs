//! The engine built from source on the testbed (BuildImage with `engine.repo`): a local git
//! repository holding a small C engine and its patch series, and the base image it is compiled in.
//!
//! The C engine is what the stand-in allows to be real here: `tensorfold-native` and
//! `tf-dsv41-lanes` compiled by `tcc` from `src/engine.c`, each of which execs the stand-in under
//! its own name (the stand-in dispatches on `argv[0]`), so a deployed pair built this way serves
//! exactly as the prebuilt one does. A build mark string in the source lets a test see which
//! patches went into a binary.
//!
//! The build base ([`BUILD_BASE`]) is the node image (Debian, with `tcc` and `libc6-dev` among its
//! packages) plus the stand-in at [`STANDIN_PATH`] and a `zig` front end standing in for the Zig
//! toolchain: it accepts only the profile's build command (so the argv BuildImage runs is
//! checked), then runs the checkout's `build.sh` with the `--prefix` directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use spark_deploy_core::engine::BuildRecipe;
use spark_deploy_core::ports::docker::{DockerError, DockerNode};

use crate::cluster::labels;
use crate::standin::rootfs::TarBuilder;

/// The build base image: the node image, the stand-in and the `zig` front end.
pub const BUILD_BASE: &str = "spark-deploy-testbed/engine-build-base:standin";
/// Where the stand-in lives in [`BUILD_BASE`] (and so in the engine image built from it).
pub const STANDIN_PATH: &str = "/usr/local/libexec/spark-deploy/tf-standin";
/// The engine's source file in the repository.
pub const SOURCE_FILE: &str = "src/engine.c";

/// Errors of preparing the build.
#[derive(Debug, thiserror::Error)]
pub enum EngineBuildError {
    /// A git command failed.
    #[error("`git {args}` in {dir} failed: {stderr}")]
    Git {
        /// Arguments.
        args: String,
        /// Where.
        dir: PathBuf,
        /// Its error output.
        stderr: String,
    },
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The recipe has no `--prefix`.
    #[error("the build recipe {0:?} names no --prefix")]
    Recipe(Vec<String>),
    /// Building the image failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EngineBuildError {
    let path = path.to_path_buf();
    move |source| EngineBuildError::Io { path, source }
}

/// The C engine with `mark` as its build mark.
#[must_use]
pub fn engine_source(mark: &str) -> String {
    format!(
        r#"/* The testbed's engine: execs the stand-in under this binary's own name. */
#include <stdio.h>
#include <unistd.h>

#define STANDIN "{STANDIN_PATH}"
#define BUILD_MARK "spark-deploy-testbed engine build: {mark}"

static const char mark[] = BUILD_MARK;

int main(int argc, char **argv)
{{
    if (argc < 0)
        puts(mark);
    execv(STANDIN, argv);
    perror(STANDIN);
    return 127;
}}
"#
    )
}

/// The bytes a binary built with `mark` carries.
#[must_use]
pub fn mark_bytes(mark: &str) -> String {
    format!("spark-deploy-testbed engine build: {mark}")
}

const BUILD_SH: &str = r#"#!/bin/sh
# Compiles both engine binaries into "$1/bin".
set -eu
out="$1/bin"
mkdir -p "$out"
for name in tensorfold-native tf-dsv41-lanes; do
    echo "tcc: src/engine.c -> $out/$name"
    tcc -Wall -Werror -o "$out/$name" src/engine.c
done
"#;

/// A local repository holding the C engine at [`EngineRepo::commit`].
#[derive(Debug, Clone)]
pub struct EngineRepo {
    /// The repository.
    pub dir: PathBuf,
    /// The commit the engine is built at (`engine.commit`).
    pub commit: String,
}

fn git(dir: &Path, args: &[&str]) -> Result<String, EngineBuildError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=spark-deploy testbed",
            "-c",
            "user.email=testbed@spark-deploy.invalid",
        ])
        .args(args)
        .output()
        .map_err(io(dir))?;
    if !out.status.success() {
        return Err(EngineBuildError::Git {
            args: args.join(" "),
            dir: dir.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl EngineRepo {
    /// Creates the repository in `dir` (replacing what is there) with one commit: the engine with
    /// the mark `base`, and its `build.sh`.
    ///
    /// # Errors
    ///
    /// [`EngineBuildError`].
    pub fn create(dir: &Path) -> Result<Self, EngineBuildError> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(io(dir))?;
        }
        std::fs::create_dir_all(dir.join("src")).map_err(io(dir))?;
        git(dir, &["init", "-q"])?;
        let src = dir.join(SOURCE_FILE);
        std::fs::write(&src, engine_source("base")).map_err(io(&src))?;
        let sh = dir.join("build.sh");
        std::fs::write(&sh, BUILD_SH).map_err(io(&sh))?;
        git(dir, &["add", "."])?;
        git(dir, &["commit", "-q", "-m", "The testbed's C engine"])?;
        let commit = git(dir, &["rev-parse", "HEAD"])?.trim().to_owned();
        Ok(Self {
            dir: dir.to_owned(),
            commit,
        })
    }

    /// The patch (as `git diff` writes it) that turns [`SOURCE_FILE`] from `before` into `after`.
    ///
    /// # Errors
    ///
    /// [`EngineBuildError`].
    pub fn diff(&self, before: &str, after: &str) -> Result<String, EngineBuildError> {
        let src = self.dir.join(SOURCE_FILE);
        std::fs::write(&src, before).map_err(io(&src))?;
        git(&self.dir, &["add", SOURCE_FILE])?;
        std::fs::write(&src, after).map_err(io(&src))?;
        let patch = git(&self.dir, &["diff", "--", SOURCE_FILE]);
        git(&self.dir, &["reset", "-q", "--hard"])?;
        patch
    }

    /// Writes [`EngineRepo::diff`] to `path`.
    ///
    /// # Errors
    ///
    /// [`EngineBuildError`].
    pub fn write_patch(
        &self,
        path: &Path,
        before: &str,
        after: &str,
    ) -> Result<PathBuf, EngineBuildError> {
        let text = self.diff(before, after)?;
        std::fs::write(path, text).map_err(io(path))?;
        Ok(path.to_owned())
    }
}

/// The `zig` front end of the build base: only `recipe`'s command passes.
///
/// # Errors
///
/// [`EngineBuildError::Recipe`] when the command has no `--prefix`.
pub fn zig_front_end(recipe: &BuildRecipe) -> Result<String, EngineBuildError> {
    let args = recipe.command.get(1..).unwrap_or(&[]);
    let prefix = args
        .iter()
        .position(|a| a == "--prefix")
        .and_then(|i| args.get(i + 1))
        .ok_or_else(|| EngineBuildError::Recipe(recipe.command.clone()))?;
    Ok(format!(
        r#"#!/bin/sh
# zig as the testbed's build base has it: accepts only the engine profile's build command, then
# compiles the checkout's C engine (build.sh, with tcc) into the --prefix directory.
set -eu
want='{}'
if [ "$*" != "$want" ]; then
    echo "zig (testbed): called with: $*" >&2
    echo "zig (testbed): the profile's build command is: zig $want" >&2
    exit 64
fi
echo "zig (testbed): building in $(pwd) for {prefix}"
exec sh ./build.sh '{prefix}'
"#,
        args.join(" ")
    ))
}

/// Builds [`BUILD_BASE`] `FROM node_image` with the stand-in `standin` and the `zig` front end of
/// `recipe`, labelled so `testbed down` removes it. Returns the image ID.
///
/// # Errors
///
/// [`EngineBuildError`].
pub async fn build_base(
    docker: &DockerNode,
    node_image: &str,
    standin: &Path,
    recipe: &BuildRecipe,
) -> Result<String, EngineBuildError> {
    let bin = std::fs::read(standin).map_err(io(standin))?;
    let zig = zig_front_end(recipe)?;
    let dockerfile = format!(
        "FROM {node_image}\n\
         ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         COPY zig /usr/local/bin/zig\n\
         COPY tf-standin {STANDIN_PATH}\n"
    );
    let mut t = TarBuilder::default();
    let io_err = |e: std::io::Error| EngineBuildError::Io {
        path: PathBuf::from("build context"),
        source: e,
    };
    t.file("Dockerfile", 0o644, dockerfile.as_bytes())
        .map_err(io_err)?;
    t.file("zig", 0o755, zig.as_bytes()).map_err(io_err)?;
    t.file("tf-standin", 0o755, &bin).map_err(io_err)?;
    let labels = HashMap::from([
        (labels::LABEL.to_owned(), labels::LABEL_VALUE.to_owned()),
        (
            labels::LABEL_ROLE.to_owned(),
            "engine-build-base".to_owned(),
        ),
    ]);
    Ok(docker.build_image(BUILD_BASE, t.finish(), &labels).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_front_end_accepts_the_recipe_only() {
        let recipe = BuildRecipe {
            command: ["zig", "build", "install", "--prefix", "/out"]
                .map(str::to_owned)
                .to_vec(),
            env: vec![],
            outputs: vec![],
        };
        let sh = zig_front_end(&recipe).unwrap();
        assert!(sh.contains("want='build install --prefix /out'"), "{sh}");
        assert!(sh.contains("exec sh ./build.sh '/out'"), "{sh}");
        let none = BuildRecipe {
            command: vec!["zig".into(), "build".into()],
            ..recipe
        };
        assert!(zig_front_end(&none).is_err());
    }
}
