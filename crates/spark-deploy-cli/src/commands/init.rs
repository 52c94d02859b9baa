//! `spark-deploy init [--from-recipe DIR] [--stdout] [--force] [FILE]`.

use std::path::PathBuf;

use clap::Args;
use spark_deploy_core::config::{ConfigError, recipe::import_recipe, template::TEMPLATE};
use spark_deploy_core::safe_fs;

use super::{DEFAULT_FILE, Global};
use crate::exit::{CONFIG, Failure};
use crate::render;

#[derive(Args, Debug)]
pub(crate) struct InitArgs {
    /// Where to write the config.
    #[arg(default_value = DEFAULT_FILE)]
    file: PathBuf,
    /// Import `scripts/local.sh` and `.env` (plain KEY=value lines; nothing is executed) of a bash recipe.
    #[arg(long, value_name = "DIR")]
    from_recipe: Option<PathBuf>,
    /// Print to stdout instead of writing a file.
    #[arg(long)]
    stdout: bool,
    /// Overwrite an existing file.
    #[arg(long)]
    force: bool,
}

pub(crate) fn run(_global: &Global, args: &InitArgs) -> Result<(), Failure> {
    let (text, notes) = match &args.from_recipe {
        None => (TEMPLATE.to_owned(), Vec::new()),
        Some(dir) => {
            let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
            let import = import_recipe(dir, &home)?;
            let mut notes: Vec<String> = import
                .imported
                .iter()
                .map(|(k, f)| format!("imported {k} from {}", f.display()))
                .collect();
            notes.extend(import.skipped.iter().map(|s| {
                format!(
                    "not imported: {}:{}: {}",
                    s.file.display(),
                    s.line,
                    s.reason
                )
            }));
            if import.config.hub.token.is_some() {
                notes.push("HF_TOKEN found: not written to the config; export HF_TOKEN or run `hf auth login` on the head".to_owned());
            }
            let body = toml::to_string_pretty(&import.config)
                .map_err(|e| Failure::new(CONFIG, &e, None))?;
            let header = format!(
                "# spark-deploy configuration imported from the bash recipe in {}\n# See `spark-deploy init --stdout` for every key with its meaning.\n\n",
                dir.display()
            );
            (header + &body, notes)
        }
    };
    for n in &notes {
        render::note(n);
    }
    if args.stdout {
        render::out(&text);
        return Ok(());
    }
    if args.file.exists() && !args.force {
        return Err(Failure::msg(
            CONFIG,
            format!("{} already exists", args.file.display()),
            Some("pass --force to overwrite, or choose another file".into()),
        ));
    }
    let name = args.file.file_name().map_or_else(
        || "spark-deploy.toml".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    let tmp = args.file.with_file_name(format!(".{name}.partial"));
    safe_fs::write_atomic(&tmp, &args.file, text.as_bytes(), 0o644).map_err(|source| {
        Failure::from(ConfigError::Write {
            path: args.file.clone(),
            source,
        })
    })?;
    render::note(&format!(
        "wrote {}; check it with `spark-deploy config check`",
        args.file.display()
    ));
    Ok(())
}
