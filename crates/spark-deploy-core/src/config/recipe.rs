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

/// Where an imported value came from: the file and the 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    file: PathBuf,
    line: usize,
}

/// The recipe's files, lowest precedence first: later files override earlier ones.
#[must_use]
pub fn recipe_files(dir: &Path) -> [PathBuf; 2] {
    [dir.join(".env"), dir.join("scripts/local.sh")]
}

/// Imports `DIR/scripts/local.sh` and `DIR/.env` (one may be missing, not both) over the
/// defaults, then validates the result as `config check` does (`~` expanded with `home` for the
/// check only: the config returned keeps `~` as written).
///
/// Secrets found (e.g. `HF_TOKEN`) are applied to the in-memory config but are never written by
/// `init`; the report says where to put them instead.
///
/// # Errors
///
/// [`ConfigError::NoRecipe`] when `dir` holds neither file; [`ConfigError::RecipeRead`] when a present
/// file cannot be read (a FIFO, a device or a directory is refused without blocking);
/// [`ConfigError::Recipe`] naming the file, the line and the variable of a value that is out of
/// form or refused by validation.
pub fn import_recipe(dir: &Path, home: &Path) -> Result<RecipeImport, ConfigError> {
    let mut values: Vec<(String, String, Origin)> = Vec::new();
    let mut skipped = Vec::new();
    let mut found = 0;
    for file in recipe_files(dir) {
        let text = match crate::safe_fs::read_to_string_capped(&file, crate::safe_fs::TEXT_CAP) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => {
                return Err(ConfigError::RecipeRead {
                    path: file.clone(),
                    error,
                });
            }
        };
        found += 1;
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
                        values.push((
                            k,
                            v,
                            Origin {
                                file: file.clone(),
                                line: i + 1,
                            },
                        ));
                    }
                }
            }
        }
    }
    if found == 0 {
        return Err(ConfigError::NoRecipe {
            dir: dir.to_owned(),
        });
    }
    let origin_of = |var: &str| values.iter().find(|(name, _, _)| name == var);
    let blame = |var: &str, field: String, value: String, expected: String| {
        let (file, line) = origin_of(var)
            .map(|(_, _, o)| (o.file.clone(), o.line))
            .unwrap_or_default();
        ConfigError::Recipe(Box::new(super::RecipeProblem {
            file,
            line,
            var: var.to_owned(),
            field,
            value,
            expected,
        }))
    };
    let mut config = DeploymentConfig::default();
    let lookup = |k: &str| origin_of(k).map(|(_, v, _)| v.clone());
    let applied = match apply_env(&mut config, &lookup) {
        Ok(a) => a,
        Err(ConfigError::Env {
            var,
            field,
            value,
            expected,
        }) => return Err(blame(var, field.to_owned(), value, expected)),
        Err(e) => return Err(e),
    };
    if let Err(ConfigError::Invalid { problems }) = super::validate::validate(config.clone(), home)
    {
        // Blame the first problem a recipe line caused: the variable that set the field (or,
        // for a per-node field such as `nodes[1].ssh`, its key without the index).
        let caused = problems.iter().find_map(|p| {
            applied
                .iter()
                .find(|a| a.shadowed_by.is_none() && field_matches(a.key, &p.field))
                .map(|a| (a, p))
        });
        return Err(match caused {
            Some((a, p)) => blame(a.var, p.field.clone(), a.value.clone(), p.allowed.clone()),
            None => ConfigError::Invalid { problems },
        });
    }
    let imported = values
        .iter()
        .map(|(k, _, o)| (k.clone(), o.file.clone()))
        .collect();
    Ok(RecipeImport {
        config,
        imported,
        skipped,
    })
}

/// Whether a problem on `field` (`nodes[1].ssh`, `serving.context`) is about the key a variable
/// sets (`nodes[1].ssh`; `storage.nfs_volume` for `storage.nfs_volume`).
fn field_matches(key: &str, field: &str) -> bool {
    field == key || field.starts_with(&format!("{key}.")) || field.starts_with(&format!("{key}["))
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
        let r = import_recipe(d.path(), Path::new("/home/u")).unwrap();
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
    fn recipe(env: &str, local: Option<&str>) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".env"), env).unwrap();
        if let Some(l) = local {
            std::fs::create_dir(d.path().join("scripts")).unwrap();
            std::fs::write(d.path().join("scripts/local.sh"), l).unwrap();
        }
        d
    }

    #[test]
    fn a_directory_without_a_recipe_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = import_recipe(d.path(), Path::new("/home/u")).unwrap_err();
        assert!(matches!(e, ConfigError::NoRecipe { .. }), "{e}");
        assert!(e.remedy().unwrap().contains("scripts/local.sh"));
    }

    #[test]
    fn a_bad_value_is_blamed_on_its_file_and_line() {
        let d = recipe(
            "# c\nPORT=8000\n",
            Some("\n\nMAX_TOKENS=18446744073709551615\n"),
        );
        let e = import_recipe(d.path(), Path::new("/home/u")).unwrap_err();
        let ConfigError::Recipe(p) = &e else {
            panic!("{e}")
        };
        assert_eq!(
            (
                p.file.ends_with("scripts/local.sh"),
                p.line,
                p.var.as_str(),
                p.field.as_str()
            ),
            (true, 3, "MAX_TOKENS", "serving.max_tokens")
        );
        assert!(!e.to_string().contains("environment variable"), "{e}");
        // Out of form (not a number) is blamed the same way.
        let d = recipe("PORT=99999\n", None);
        let e = import_recipe(d.path(), Path::new("/home/u")).unwrap_err();
        assert!(e.to_string().contains(".env:1: PORT="), "{e}");
        // Refused by validation only in combination: the winning variable is named.
        let d = recipe(
            "PORT=8000\nMASTER_PORT=8000\nWORKER=-oProxyCommand=x\n",
            None,
        );
        let e = import_recipe(d.path(), Path::new("/home/u")).unwrap_err();
        assert!(e.to_string().contains(".env:"), "{e}");
    }

    #[test]
    fn a_fifo_in_the_recipe_is_refused_without_blocking() {
        let d = recipe("PORT=8000\n", None);
        std::fs::create_dir(d.path().join("scripts")).unwrap();
        let st = std::process::Command::new("mkfifo")
            .arg(d.path().join("scripts/local.sh"))
            .status()
            .unwrap();
        assert!(st.success());
        let e = import_recipe(d.path(), Path::new("/home/u")).unwrap_err();
        assert!(
            matches!(e, ConfigError::RecipeRead { .. }) && e.to_string().contains("FIFO"),
            "{e}"
        );
    }
}
