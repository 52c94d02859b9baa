//! One worker template for every follower: the followers' containers differ only by their rank
//! number, so the template is rank 1's container with the rank replaced by a reference to the
//! pod's index, which Kubernetes substitutes when it starts the container.
//!
//! How: every literal `$` of the argv and environment is escaped as `$$` (Kubernetes turns
//! `$$` back into `$` and never expands an escaped reference), then each position the engine
//! names as holding the rank ([`crate::engine::RankSlots`]) becomes `$(LWS_WORKER_INDEX)`:
//!
//! ```text
//! rank 1:   tf-dsv41-lanes /hf/…/snapshots/<commit> /cache/rank-cache 1 2 198.18.0.1 29500 /kit …
//! template: tf-dsv41-lanes /hf/…/snapshots/<commit> /cache/rank-cache $(LWS_WORKER_INDEX) 2 …
//! pod 3:    tf-dsv41-lanes /hf/…/snapshots/<commit> /cache/rank-cache 3 2 …   (LWS_WORKER_INDEX=3)
//! ```
//!
//! [`check_reproduces`] expands the template for every follower's index with Kubernetes'
//! rules ([`expand`]) and refuses the export unless it equals that follower's container exactly.

use std::collections::BTreeMap;

use super::ExportError;
use crate::container::ContainerSpec;
use crate::engine::RankSlots;

/// The environment variable LeaderWorkerSet sets to a pod's index in its group (0 = leader).
pub const INDEX_VAR: &str = "LWS_WORKER_INDEX";

/// The reference to the pod's index inside a container's command or environment.
#[must_use]
pub fn index_ref() -> String {
    format!("$({INDEX_VAR})")
}

/// A literal for a Kubernetes command, argument or environment value: `$` becomes `$$`.
#[must_use]
pub fn escape(s: &str) -> String {
    s.replace('$', "$$")
}

/// Kubernetes' expansion of a container's command, arguments and environment values:
/// `$(NAME)` becomes the value of `NAME` when `vars` defines it (else stays as written), `$$`
/// becomes `$`, and any other `$` stays.
#[must_use]
pub fn expand(s: &str, vars: &BTreeMap<String, String>) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut start = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            out.push_str(&s[start..i]);
            match b[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                }
                b'(' => match s[i + 2..].find(')') {
                    Some(close) => {
                        let name = &s[i + 2..i + 2 + close];
                        match vars.get(name) {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&s[i..i + 3 + close]),
                        }
                        i += 3 + close;
                    }
                    None => {
                        out.push_str("$(");
                        i += 2;
                    }
                },
                _ => {
                    out.push('$');
                    i += 1;
                }
            }
            start = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&s[start..]);
    out
}

/// A container's argv and environment as Kubernetes takes them (escaped), with the rank
/// slots replaced by the index reference.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerTemplate {
    /// The follower the template was derived from (its mounts, image, devices are shared).
    pub base: ContainerSpec,
    /// argv for Kubernetes.
    pub argv: Vec<String>,
    /// Environment for Kubernetes.
    pub env: BTreeMap<String, String>,
}

/// `spec`'s argv and environment escaped, without substitutions (the leader's).
#[must_use]
pub fn literal(spec: &ContainerSpec) -> (Vec<String>, BTreeMap<String, String>) {
    (
        spec.argv.iter().map(|a| escape(a)).collect(),
        spec.env
            .iter()
            .map(|(k, v)| (k.clone(), escape(v)))
            .collect(),
    )
}

/// The worker template derived from `base` (a follower) and the engine's rank `slots`; without
/// slots the template is `base` itself, which reproduces only `base`'s own rank.
///
/// # Errors
///
/// [`ExportError::FollowersDiffer`] when a slot does not hold `base`'s rank (the engine's
/// slots do not match its own containers).
pub fn derive(
    base: &ContainerSpec,
    slots: Option<&RankSlots>,
) -> Result<WorkerTemplate, ExportError> {
    let (mut argv, mut env) = literal(base);
    let rank = base.rank.to_string();
    let differ = |field: String, actual: &str| ExportError::FollowersDiffer {
        rank: base.rank,
        node: base.node.clone(),
        base: base.rank,
        field,
        template: rank.clone(),
        actual: actual.to_owned(),
    };
    if let Some(slots) = slots {
        for &p in &slots.argv {
            match base.argv.get(p) {
                Some(v) if *v == rank => argv[p] = index_ref(),
                other => {
                    return Err(differ(
                        format!("argv[{p}] (the engine's rank slot)"),
                        other.map_or("nothing", String::as_str),
                    ));
                }
            }
        }
        for name in &slots.env {
            match base.env.get(name) {
                Some(v) if *v == rank => {
                    env.insert(name.clone(), index_ref());
                }
                other => {
                    return Err(differ(
                        format!("env {name} (the engine's rank slot)"),
                        other.map_or("nothing", String::as_str),
                    ));
                }
            }
        }
    }
    Ok(WorkerTemplate {
        base: base.clone(),
        argv,
        env,
    })
}

impl WorkerTemplate {
    /// argv and environment a pod with index `index` runs, as Kubernetes expands them.
    #[must_use]
    pub fn expanded(&self, index: usize) -> (Vec<String>, BTreeMap<String, String>) {
        let vars = BTreeMap::from([(INDEX_VAR.to_owned(), index.to_string())]);
        (
            self.argv.iter().map(|a| expand(a, &vars)).collect(),
            self.env
                .iter()
                .map(|(k, v)| (k.clone(), expand(v, &vars)))
                .collect(),
        )
    }
}

fn show<T: std::fmt::Debug>(v: &T) -> String {
    format!("{v:?}")
}

/// Refuses unless the template, expanded for each follower's rank, is that follower's
/// container: argv, environment, image, mounts, devices, limits, capabilities, namespaces.
///
/// # Errors
///
/// [`ExportError::FollowersDiffer`] naming the first follower and field that differ.
pub fn check_reproduces(
    t: &WorkerTemplate,
    followers: &[ContainerSpec],
) -> Result<(), ExportError> {
    for f in followers {
        let (argv, env) = t.expanded(f.rank);
        let differ =
            |field: String, template: String, actual: String| ExportError::FollowersDiffer {
                rank: f.rank,
                node: f.node.clone(),
                base: t.base.rank,
                field,
                template,
                actual,
            };
        if argv.len() != f.argv.len() {
            return Err(differ(
                "argv length".into(),
                argv.len().to_string(),
                f.argv.len().to_string(),
            ));
        }
        if let Some((i, (a, b))) = argv
            .iter()
            .zip(&f.argv)
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            return Err(differ(format!("argv[{i}]"), a.clone(), b.clone()));
        }
        let names: std::collections::BTreeSet<&String> = env.keys().chain(f.env.keys()).collect();
        for name in names {
            let (a, b) = (env.get(name), f.env.get(name));
            if a != b {
                return Err(differ(format!("env {name}"), show(&a), show(&b)));
            }
        }
        let b = &t.base;
        let fields: [(&str, String, String); 8] = [
            ("image", b.image.clone(), f.image.clone()),
            ("mounts", show(&b.mounts), show(&f.mounts)),
            ("devices", show(&b.devices), show(&f.devices)),
            ("ulimits", show(&b.ulimits), show(&f.ulimits)),
            ("capabilities", show(&b.cap_add), show(&f.cap_add)),
            (
                "network mode",
                b.network_mode.clone(),
                f.network_mode.clone(),
            ),
            ("IPC mode", b.ipc_mode.clone(), f.ipc_mode.clone()),
            ("GPU request", b.gpus.clone(), f.gpus.clone()),
        ];
        if let Some((field, a, c)) = fields.into_iter().find(|(_, a, c)| a != c) {
            return Err(differ(field.to_owned(), a, c));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(i: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(INDEX_VAR.to_owned(), i.to_owned())])
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let v = vars("3");
        assert_eq!(expand("$(LWS_WORKER_INDEX)", &v), "3");
        assert_eq!(expand("r$(LWS_WORKER_INDEX)of4", &v), "r3of4");
        assert_eq!(expand("$$(LWS_WORKER_INDEX)", &v), "$(LWS_WORKER_INDEX)");
        assert_eq!(expand("$(UNDEFINED)", &v), "$(UNDEFINED)");
        assert_eq!(expand("a$b$", &v), "a$b$");
        assert_eq!(expand("$$$$", &v), "$$");
        assert_eq!(expand("$(unclosed", &v), "$(unclosed");
        for s in [
            "plain",
            "$HOME",
            "$(X)",
            "$$",
            "a$(LWS_WORKER_INDEX)b",
            "$",
            "x$",
        ] {
            assert_eq!(
                expand(&escape(s), &v),
                s,
                "escape then expand must give {s:?} back"
            );
        }
    }
}
