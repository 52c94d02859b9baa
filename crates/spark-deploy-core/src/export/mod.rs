//! Exports of the validated plan for people who outgrow the pair: one Kubernetes
//! `LeaderWorkerSet` for the whole group ([`lws`]) and, for bare-metal owners, one compose file
//! per node ([`compose`]).
//!
//! Both are rendered from the engine's own rank containers ([`crate::engine::Engine::rank_containers`])
//! with facts from the last launch or given explicitly ([`facts_input`]); nothing is templated
//! from text. A fact still at its placeholder refuses the export, naming the node and the fact.

pub mod compose;
pub mod facts_input;
pub mod lws;
mod pod;
pub mod worker;
mod yaml;

pub use compose::{ComposeFile, compose_files};
pub use facts_input::{FactOverrides, facts_for_export, image_content};
pub use lws::{LwsOptions, leader_worker_set, lws_yaml};

use crate::facts::PendingFact;

/// Why an export could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Facts only preflight or fetch can know are still placeholders.
    #[error(
        "the export needs facts that are not known yet: {}; remedy: run `spark-deploy preflight` and `spark-deploy up` once (the launch records them), or give each one: {}",
        .pending.iter().map(|(n, f)| format!("{n}: {}", f.describe())).collect::<Vec<_>>().join("; "),
        .pending.iter().map(|(n, f)| override_hint(n, *f)).collect::<Vec<_>>().join(" ")
    )]
    UnresolvedFacts {
        /// `(node, fact)` pairs still pending.
        pending: Vec<(String, PendingFact)>,
    },
    /// An explicit fact names a node the config does not have.
    #[error(
        "{what} is given for node {node:?}, which is not in the config; remedy: use one of {known}"
    )]
    UnknownNode {
        /// Which fact.
        what: &'static str,
        /// The name given.
        node: String,
        /// The config's node names.
        known: String,
    },
    /// An explicit fact does not parse.
    #[error("{what} {value:?} is not valid: {why}")]
    BadFact {
        /// Which fact (`--fabric-addr head`).
        what: String,
        /// The value given.
        value: String,
        /// What is expected.
        why: String,
    },
    /// The launch record exists but cannot be read.
    #[error(transparent)]
    Record(#[from] crate::lifecycle::launch_record::LaunchRecordError),
    /// The engine image's content label could not be read on the head.
    #[error(
        "the content label ({label}) of image {image} on {node} is unknown: {why}; remedy: run `spark-deploy up` (BuildImage builds and labels it), or give it with --image-content"
    )]
    ImageContent {
        /// Head node.
        node: String,
        /// Image reference.
        image: String,
        /// The label key.
        label: &'static str,
        /// What failed.
        why: String,
    },
    /// A rank's container uses something a pod template cannot express.
    #[error("rank {rank} on {node}: {what} cannot be expressed in Kubernetes; remedy: {remedy}")]
    Unsupported {
        /// Rank.
        rank: usize,
        /// Node.
        node: String,
        /// What.
        what: String,
        /// What to do.
        remedy: String,
    },
    /// The followers' containers differ by more than their rank number, so one worker template
    /// cannot reproduce them all.
    #[error(
        "rank {rank} on {node}: its {field} differs from the worker template derived from rank {base} ({template} vs {actual}); one LeaderWorkerSet worker template serves every follower; remedy: give the worker nodes the same {field} (e.g. the same data_dir, image tag, netdev and RoCE devices)"
    )]
    FollowersDiffer {
        /// The follower that differs.
        rank: usize,
        /// Its node.
        node: String,
        /// The rank the template was derived from.
        base: usize,
        /// Which field (`argv[3]`, `env NCCL_SOCKET_IFNAME`, `mounts`).
        field: String,
        /// The template's value after substituting the rank.
        template: String,
        /// The follower's value.
        actual: String,
    },
    /// The engine profile gave no way to verify a rank's inputs inside the cluster.
    #[error(
        "engine {engine} has no input check for an init container; remedy: export compose instead, or add `verify_inputs_command` to the profile"
    )]
    NoInputCheck {
        /// Engine name.
        engine: String,
    },
    /// Writing YAML failed.
    #[error("serializing the {what}: {source}")]
    Yaml {
        /// What was serialized.
        what: &'static str,
        /// Underlying error.
        #[source]
        source: serde_norway::Error,
    },
    /// An export file could not be written.
    #[error("writing {path}: {source}; remedy: check that the directory exists and is writable")]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// How a pending fact is given explicitly (the CLI's flags; Python takes the same names as
/// keyword arguments with `_`).
fn override_hint(node: &str, fact: PendingFact) -> String {
    match fact {
        PendingFact::ModelCommit => "--model-commit <40-hex commit>".to_owned(),
        PendingFact::FabricAddr => format!("--fabric-addr {node}=<IPv4>"),
        PendingFact::Netdev => format!("--netdev {node}=<ifname>"),
        PendingFact::RdmaDevices => format!("--rdma-devices {node}=<dev[,dev]|none>"),
        PendingFact::GidIndex => format!("--gid-index {node}=<n|none>"),
        PendingFact::Context => "CONTEXT=<pool> (serving.context)".to_owned(),
    }
}

/// Writes `text` to `path` through a temporary file and a rename, so no half-written export
/// is ever left under its final name.
///
/// # Errors
///
/// [`ExportError::Write`].
pub fn write_file(path: &std::path::Path, text: &str) -> Result<(), ExportError> {
    let io = |source| ExportError::Write {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .map_or_else(|| "export".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.partial"));
    crate::safe_fs::write_exclusive(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests;
