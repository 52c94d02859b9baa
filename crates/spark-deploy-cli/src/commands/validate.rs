//! `validate`: the recipe's checks against the deployment's API (docs/validate-and-bench.md).

use clap::Args;
use spark_deploy_core::api::Api;
use spark_deploy_core::event::Event;
use spark_deploy_core::validate::{self, Check, Options, Verdict};

use super::Global;
use crate::exit::{Failure, RUNTIME, USAGE};
use crate::render;

/// `spark-deploy validate` options.
#[derive(Args, Debug)]
pub(crate) struct ValidateArgs {
    /// Run only these checks (comma list): text, thinking_on, thinking_off, tool_call,
    /// tool_array, json_schema, tokenizer, image, needle, exactness.
    #[arg(long, value_delimiter = ',', value_name = "CHECKS")]
    only: Vec<String>,
    /// Leave these checks out (comma list).
    #[arg(long, value_delimiter = ',', value_name = "CHECKS")]
    skip: Vec<String>,
    /// Needle prompt size in tokens (default 16000, capped by the pool; 250000 for the real
    /// thing on a 1M pool).
    #[arg(long, value_name = "TOKENS")]
    needle: Option<u64>,
}

fn checks(names: &[String]) -> Result<Vec<Check>, Failure> {
    names
        .iter()
        .filter(|n| !n.trim().is_empty())
        .map(|n| Check::parse(n).map_err(|e| Failure::new(USAGE, &e, None)))
        .collect()
}

pub(crate) fn run(global: &Global, args: &ValidateArgs) -> Result<(), Failure> {
    let config = global.load()?;
    let opts = Options {
        only: checks(&args.only)?,
        skip: checks(&args.skip)?,
        needle_tokens: args.needle,
    };
    let api = Api::from_config(&config).map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(RUNTIME, &e, None))?;
    let json = global.json;
    let sink = move |e: Event| {
        if let Event::Log { line, .. } = &e
            && !json
        {
            render::out(line);
        }
    };
    let report = rt
        .block_on(validate::run(&api, &opts, &sink))
        .map_err(|e| Failure::new(USAGE, &e, None))?;
    if json {
        render::out(&serde_json::to_string_pretty(&report).unwrap_or_default());
    }
    let failed: Vec<&str> = report
        .results
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| r.check.name())
        .collect();
    if failed.is_empty() {
        if !json {
            render::note(&format!(
                "validate: {} check(s) passed or unsupported on {}",
                report.results.len(),
                report.base_url
            ));
        }
        return Ok(());
    }
    Err(Failure::msg(
        RUNTIME,
        format!("validate: {} check(s) failed: {}", failed.len(), failed.join(", ")),
        Some(
            "each failed check's line says what the engine answered; `spark-deploy logs` shows the ranks' side"
                .into(),
        ),
    ))
}
