//! The config reference, generated from the commented template and the environment table, so the
//! README's table cannot drift from the schema (tests compare all three).

use super::env::ENV_OVERRIDES;
use super::template::TEMPLATE;

/// One documented key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDoc {
    /// Dotted path (`serving.context`, `nodes[].ssh`).
    pub path: String,
    /// Default as written in the template (`unset` for commented-out keys).
    pub default: String,
    /// Comment lines above the key.
    pub description: String,
}

/// Every key of the template with its description, in template order.
#[must_use]
pub fn fields() -> Vec<FieldDoc> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut comment: Vec<String> = Vec::new();
    let mut carry = String::new();
    for raw in TEMPLATE.lines() {
        let line = raw.trim();
        if line.is_empty() {
            comment.clear();
            continue;
        }
        if let Some(h) = line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
            section = format!("{h}[]");
            comment.clear();
            continue;
        }
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = h.to_owned();
            if section.starts_with("engine.") {
                out.push(FieldDoc {
                    path: section.clone(),
                    default: "{}".into(),
                    description: comment.join(" "),
                });
            }
            comment.clear();
            continue;
        }
        let (commented, body) = match line.strip_prefix('#') {
            Some(rest) => (true, rest.trim()),
            None => (false, line),
        };
        let key_value = body
            .split_once(" = ")
            .filter(|(k, _)| k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        match key_value {
            Some((k, v)) if !section.starts_with("engine.") => {
                let path = format!("{section}.{k}");
                if out.iter().any(|f: &FieldDoc| f.path == path) {
                    comment.clear();
                    continue;
                }
                let mut description = comment.join(" ");
                if description.is_empty() {
                    description.clone_from(&carry);
                }
                carry.clone_from(&description);
                let default = if commented {
                    "unset".to_owned()
                } else {
                    v.to_owned()
                };
                out.push(FieldDoc {
                    path,
                    default,
                    description,
                });
                comment.clear();
            }
            Some(_) => comment.clear(),
            None if commented => comment.push(body.to_owned()),
            None => comment.clear(),
        }
    }
    out
}

/// The reference as a Markdown table with the environment variable of each key.
#[must_use]
pub fn markdown() -> String {
    let mut s = String::from("| Key | Default | Env | Meaning |\n|---|---|---|---|\n");
    for f in fields() {
        let lookup = f.path.replace("[]", "[1]");
        let envs: Vec<&str> = ENV_OVERRIDES
            .iter()
            .filter(|o| o.field == lookup || o.field.starts_with(&format!("{lookup}.")))
            .map(|o| o.var)
            .collect();
        let env = if envs.is_empty() {
            String::new()
        } else {
            format!("`{}`", envs.join("`, `"))
        };
        let desc = f.description.replace('|', "\\|");
        s.push_str(&format!(
            "| `{}` | `{}` | {env} | {desc} |\n",
            f.path,
            f.default.replace('|', "\\|")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentConfig, NodeConfig};

    fn leaf_paths(prefix: &str, v: &toml::Value, out: &mut Vec<String>) {
        match v {
            toml::Value::Table(t)
                if !prefix.starts_with("engine.") || prefix.matches('.').count() < 1 =>
            {
                for (k, v) in t {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    leaf_paths(&p, v, out);
                }
            }
            toml::Value::Array(a) if a.first().is_some_and(toml::Value::is_table) => {
                for v in a {
                    leaf_paths(&format!("{prefix}[]"), v, out);
                }
            }
            _ => out.push(prefix.to_owned()),
        }
    }

    #[test]
    fn every_schema_key_is_documented_and_nothing_else() {
        let mut full = DeploymentConfig::default();
        let mut node = NodeConfig::worker("w", "h");
        node.ssh_port = Some(22);
        node.identity_file = "x".into();
        node.known_hosts = "x".into();
        node.fabric_addr = Some(std::net::Ipv4Addr::new(198, 18, 0, 2));
        node.hf_cache = "x".into();
        node.image = "x".into();
        node.path = vec!["/x".into()];
        full.nodes.push(node);
        full.engine
            .switches
            .insert("TF_DS_IDX_SPLIT".into(), "1".into());
        full.engine.env.insert("NCCL_DEBUG".into(), "INFO".into());
        let value = toml::Value::try_from(&full).unwrap();
        let mut schema = Vec::new();
        leaf_paths("", &value, &mut schema);
        schema.sort();
        schema.dedup();
        let mut documented: Vec<String> = fields().into_iter().map(|f| f.path).collect();
        documented.sort();
        assert_eq!(schema, documented);
        assert!(
            fields().iter().all(|f| !f.description.is_empty()),
            "{:#?}",
            fields()
        );
    }

    #[test]
    fn every_env_override_targets_a_documented_key() {
        let documented: Vec<String> = fields()
            .into_iter()
            .map(|f| f.path.replace("[]", "[1]"))
            .collect();
        for o in ENV_OVERRIDES {
            let secret = o.field == "hub.token" || o.field == "serving.api_key";
            assert!(
                secret
                    || documented
                        .iter()
                        .any(|d| o.field == d || o.field.starts_with(&format!("{d}."))),
                "{} -> {}",
                o.var,
                o.field
            );
        }
    }
}

#[cfg(test)]
mod readme {
    /// The README's reference table is exactly [`super::markdown`]; regenerate it with
    /// `SPARK_DEPLOY_BLESS=1 cargo test -p spark-deploy-core readme`.
    #[test]
    fn readme_reference_is_in_sync() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let (start, end) = (
            "<!-- config-reference:start -->\n",
            "<!-- config-reference:end -->",
        );
        let a = readme.find(start).expect("start marker") + start.len();
        let b = readme.find(end).expect("end marker");
        let table = super::markdown();
        if std::env::var_os("SPARK_DEPLOY_BLESS").is_some() {
            std::fs::write(&path, format!("{}{table}{}", &readme[..a], &readme[b..])).unwrap();
        } else {
            assert_eq!(
                readme[a..b],
                table,
                "README config reference is stale: rerun with SPARK_DEPLOY_BLESS=1"
            );
        }
    }
}
