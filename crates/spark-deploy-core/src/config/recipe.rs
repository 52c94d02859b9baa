//! Import of a bash recipe's `scripts/local.sh` and `.env`: plain `KEY=value` lines only.
//!
//! Nothing is executed or expanded. Lines that are not assignments, values that would need a
//! shell (`$`, backticks, `$(...)`), and variables spark-deploy does not know are reported so the
//! user can move them by hand. Precedence follows the recipe: `local.sh` over `.env`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ConfigError;
use super::env::{self, apply_env};
use super::schema::DeploymentConfig;

/// A line that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// File.
    pub file: PathBuf,
    /// 1-based line number.
    pub line: usize,
    /// Why it was not imported.
    pub reason: String,
}

/// The outcome of an import.
#[derive(Debug, Clone, Serialize)]
pub struct RecipeImport {
    /// The resulting config (defaults + imported values).
    #[serde(skip)]
    pub config: DeploymentConfig,
    /// Variables imported, with the file they came from.
    pub imported: Vec<(String, PathBuf)>,
    /// Lines not imported.
    pub skipped: Vec<Skipped>,
}

/// Parses one `KEY=value` line like the recipe's `.env` reader; `None` for blanks and comments,
/// `Err(reason)` for anything else that is not a plain assignment.
fn parse_line(raw: &str) -> Option<Result<(String, String), String>> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let body = line.strip_prefix("export ").map_or(line, str::trim_start);
    let Some((name, rest)) = body.split_once('=') else {
        return Some(Err("not a KEY=value line (never executed)".to_owned()));
    };
    if name.is_empty()
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || name.as_bytes()[0].is_ascii_digit()
    {
        return Some(Err(format!("{name:?} is not a variable name")));
    }
    let value = if let Some(q) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let inner = &rest[1..];
        let Some(end) = inner.find(q) else {
            return Some(Err("unterminated quote".to_owned()));
        };
        let after = inner[end + 1..].trim();
        if !(after.is_empty() || after.starts_with('#')) {
            return Some(Err("text after the closing quote".to_owned()));
        }
        if q == '"' && (inner[..end].contains('$') || inner[..end].contains('`')) {
            return Some(Err(
                "needs shell expansion ($ or `); set it by hand".to_owned()
            ));
        }
        inner[..end].to_owned()
    } else {
        let v = rest.split('#').next().unwrap_or("").trim_end();
        if v.contains('$') || v.contains('`') || v.contains(';') || v.contains('(') {
            return Some(Err(
                "needs a shell ($, `, ; or parentheses); set it by hand".to_owned(),
            ));
        }
        v.to_owned()
    };
    Some(Ok((name.to_owned(), value)))
}

/// Imports `DIR/scripts/local.sh` and `DIR/.env` (either may be missing) over the defaults.
///
/// Secrets found (e.g. `HF_TOKEN`) are applied to the in-memory config but are never written by
/// `init`; the report says where to put them instead.
///
/// # Errors
///
/// [`ConfigError::Read`] when a present file cannot be read, [`ConfigError::Env`] when an imported
/// value is out of form (the message names the variable).
pub fn import_recipe(dir: &Path) -> Result<RecipeImport, ConfigError> {
    let mut values: Vec<(String, String, PathBuf)> = Vec::new();
    let mut skipped = Vec::new();
    // Lowest precedence first: later files override earlier ones.
    for file in [dir.join(".env"), dir.join("scripts/local.sh")] {
        if !file.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Read {
            path: file.clone(),
            source,
        })?;
        for (i, raw) in text.lines().enumerate() {
            match parse_line(raw) {
                None => {}
                Some(Err(reason)) => skipped.push(Skipped {
                    file: file.clone(),
                    line: i + 1,
                    reason,
                }),
                Some(Ok((k, v))) => {
                    if env::find(&k).is_none() {
                        skipped.push(Skipped {
                            file: file.clone(),
                            line: i + 1,
                            reason: format!("{k} has no spark-deploy equivalent"),
                        });
                    } else {
                        values.retain(|(name, _, _)| name != &k);
                        values.push((k, v, file.clone()));
                    }
                }
            }
        }
    }
    let mut config = DeploymentConfig::default();
    let lookup = |k: &str| {
        values
            .iter()
            .find(|(name, _, _)| name == k)
            .map(|(_, v, _)| v.clone())
    };
    apply_env(&mut config, &lookup)?;
    let imported = values
        .iter()
        .map(|(k, _, f)| (k.clone(), f.clone()))
        .collect();
    Ok(RecipeImport {
        config,
        imported,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_plain_assignments_and_reports_the_rest() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("scripts")).unwrap();
        std::fs::write(
            d.path().join(".env"),
            "CONTEXT=262144\nPARALLEL=2 # fewer\nFOO=bar\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("scripts/local.sh"),
            "# comment\nexport WORKER=\"ops@192.0.2.2\"\nCONTEXT=524288\nHF_TOKEN='hf_abc'\nrm -rf /\nMODEL_ID=\"$HOME/x\"\n",
        )
        .unwrap();
        let r = import_recipe(d.path()).unwrap();
        assert_eq!(r.config.serving.context, 524_288, "local.sh wins over .env");
        assert_eq!(r.config.serving.parallel, 2);
        assert_eq!(r.config.nodes[1].ssh, "ops@192.0.2.2");
        assert!(r.config.hub.token.is_some());
        let reasons: Vec<_> = r
            .skipped
            .iter()
            .map(|s| (s.line, s.reason.as_str()))
            .collect();
        assert!(
            reasons.iter().any(|(_, r)| r.contains("FOO")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|(l, r)| *l == 5 && r.contains("never executed")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|(l, r)| *l == 6 && r.contains("expansion")),
            "{reasons:?}"
        );
    }
}
