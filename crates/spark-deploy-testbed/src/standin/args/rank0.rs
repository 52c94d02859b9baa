//! Rank 0's command line (`tensorfold-native serve MODEL_DIR [flags]`) and the environment it
//! reads (`TF_TP_*`, `TF_DS_*`, `TENSORFOLD_*`).

use std::collections::HashMap;
use std::path::PathBuf;

use super::{
    ArgsError, DEFAULT_CONTEXT, DEFAULT_TP_PORT, Rank0Args, Rank0Env, check_kit_variants,
    env_flag_u32, parse_ip,
};

const RANK0_VALUE_FLAGS: &[&str] = &[
    "--host",
    "--port",
    "--name",
    "--alias",
    "--api-key",
    "--api-key-file",
    "--context",
    "--parallel",
    "--max-tokens",
    "--temperature",
    "--top-p",
    "--top-k",
    "--min-p",
    "--reasoning-effort",
    "--thinking-budget",
    "--prompt-cache-gib",
    "--checkpoint-slots",
    "--device",
    "--backend",
    "--vision-max-images",
];

const RANK0_BARE_FLAGS: &[&str] = &[
    "--thinking",
    "--no-thinking",
    "--loop-guard",
    "--no-drafts",
    "--keep-warm",
    "--metrics-open",
    "--no-update-check",
    "--dashboard",
];

fn usage(problem: impl Into<String>) -> ArgsError {
    ArgsError::Usage {
        problem: problem.into(),
    }
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, ArgsError> {
    v.parse()
        .map_err(|_| usage(format!("{flag} {v:?} is not a valid number")))
}

fn check_float(flag: &str, v: &str) -> Result<(), ArgsError> {
    parse_num::<f64>(flag, v).map(|_| ())
}

/// Parses rank 0's arguments (everything after `argv[0]`) and environment.
///
/// # Errors
/// [`ArgsError::NotServed`] / [`ArgsError::Usage`] (exit 2) for the command line,
/// [`ArgsError::Engine`] (exit 1) for the environment (`NoTpMaster`, `BadIp`, `NotPortedYet`,
/// `NoRankCache`, `NoKit`, `NoEngramTables`, `NoTokenMap`, `NoFreeSlot`, ...).
pub fn parse_rank0(args: &[String], env: &HashMap<String, String>) -> Result<Rank0Args, ArgsError> {
    let Some(cmd) = args.first() else {
        return Err(usage("no command"));
    };
    if cmd != "serve" {
        return Err(ArgsError::NotServed {
            flag: format!("command {cmd:?}"),
        });
    }
    let mut model_dir: Option<PathBuf> = None;
    let mut a = Rank0Args {
        model_dir: PathBuf::new(),
        host: "127.0.0.1".into(),
        port: 8080,
        name: String::new(),
        aliases: Vec::new(),
        api_key: None,
        api_key_file: None,
        context: DEFAULT_CONTEXT,
        parallel: None,
        max_tokens: 4096,
        thinking: true,
        reasoning_effort: None,
        no_drafts: false,
        metrics_open: false,
        backend: "auto".into(),
        recorded: Vec::new(),
        env: parse_rank0_env(env)?,
    };
    let mut name: Option<String> = None;
    let mut i = 1;
    while i < args.len() {
        let flag = args[i].as_str();
        i += 1;
        if !flag.starts_with("--") {
            if model_dir.is_none() {
                model_dir = Some(PathBuf::from(flag));
                continue;
            }
            return Err(usage(format!("unexpected argument {flag:?}")));
        }
        if RANK0_BARE_FLAGS.contains(&flag) {
            match flag {
                "--thinking" => a.thinking = true,
                "--no-thinking" => a.thinking = false,
                "--no-drafts" => a.no_drafts = true,
                "--metrics-open" => a.metrics_open = true,
                _ => a.recorded.push((flag.to_owned(), None)),
            }
            continue;
        }
        if !RANK0_VALUE_FLAGS.contains(&flag) {
            return Err(ArgsError::NotServed {
                flag: flag.to_owned(),
            });
        }
        let Some(v) = args.get(i) else {
            return Err(usage(format!("{flag} needs a value")));
        };
        i += 1;
        match flag {
            "--host" => a.host = v.clone(),
            "--port" => a.port = parse_num(flag, v)?,
            "--name" => name = Some(v.clone()),
            "--alias" => a.aliases.push(v.clone()),
            "--api-key" => a.api_key = Some(v.clone()),
            "--api-key-file" => a.api_key_file = Some(PathBuf::from(v)),
            "--context" => {
                a.context = parse_num(flag, v)?;
                if a.context == 0 {
                    return Err(usage("--context must be positive"));
                }
            }
            "--parallel" => {
                a.parallel = if v == "auto" {
                    None
                } else {
                    Some(parse_num(flag, v)?)
                }
            }
            "--max-tokens" => a.max_tokens = parse_num(flag, v)?,
            "--reasoning-effort" => {
                if !["low", "medium", "high", "xhigh"].contains(&v.as_str()) {
                    return Err(usage(format!(
                        "--reasoning-effort {v:?} is not low|medium|high|xhigh"
                    )));
                }
                a.reasoning_effort = Some(v.clone());
            }
            "--backend" => {
                if v != "auto" && v != "cuda" {
                    return Err(usage(format!("--backend {v:?} is not auto|cuda")));
                }
                a.backend = v.clone();
            }
            "--temperature" | "--top-p" | "--min-p" => {
                check_float(flag, v)?;
                a.recorded.push((flag.to_owned(), Some(v.clone())));
            }
            _ => {
                parse_num::<u64>(flag, v)?;
                a.recorded.push((flag.to_owned(), Some(v.clone())));
            }
        }
    }
    let Some(model_dir) = model_dir else {
        return Err(usage("missing MODEL_DIR"));
    };
    a.name = name.unwrap_or_else(|| {
        model_dir
            .file_name()
            .map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned())
    });
    a.model_dir = model_dir;
    check_kit_variants(env)?;
    if let Some(window) = a.env.window
        && a.context > window
    {
        return Err(ArgsError::engine(
            "ContextAboveWindow",
            format!(
                "--context {} (one request) exceeds TF_DS_WINDOW {window} (the shared pool)",
                a.context
            ),
        ));
    }
    let parallel = a.parallel.unwrap_or(1);
    if parallel == 0 || parallel > a.env.streams {
        return Err(ArgsError::engine(
            "NoFreeSlot",
            format!(
                "--parallel {parallel} needs as many pool streams; TF_DS_STREAMS is {}",
                a.env.streams
            ),
        ));
    }
    Ok(a)
}

fn parse_rank0_env(env: &HashMap<String, String>) -> Result<Rank0Env, ArgsError> {
    let get = |k: &str| env.get(k).filter(|v| !v.is_empty());
    let window = super::tp4_window(env)?;
    let world = match (env.get("TF_TP_WORLD").map(String::as_str), window) {
        (None | Some("2"), _) => 2,
        (Some("4"), Some(_)) => 4,
        (Some(other), _) => {
            return Err(ArgsError::engine(
                "NotPortedYet",
                format!(
                    "TF_TP_WORLD={other:?}: the TP=2 build serves world 2; world 4 is the TP=4 build's (its settings include TF_DS_WINDOW)"
                ),
            ));
        }
    };
    let master = get("TF_TP_MASTER")
        .ok_or_else(|| ArgsError::engine("NoTpMaster", "TF_TP_MASTER is not set"))?;
    let master = parse_ip("TF_TP_MASTER", master)?;
    let port = match env.get("TF_TP_PORT") {
        None => DEFAULT_TP_PORT,
        Some(p) => p
            .parse()
            .map_err(|_| ArgsError::engine("BadPort", format!("TF_TP_PORT={p:?} is not a port")))?,
    };
    let rank_cache = get("TF_DS_RANK_CACHE")
        .ok_or_else(|| ArgsError::engine("NoRankCache", "TF_DS_RANK_CACHE is not set"))?;
    let kit = get("TF_DS_KIT").ok_or_else(|| ArgsError::engine("NoKit", "TF_DS_KIT is not set"))?;
    let engram = get("TF_DS_ENGRAM").ok_or_else(|| {
        ArgsError::engine(
            "NoEngramTables",
            "TF_DS_ENGRAM is not set and the checkpoint has Engram layers",
        )
    })?;
    let token_map = get("TF_DS_TOKEN_MAP").ok_or_else(|| {
        ArgsError::engine("NoTokenMap", "TF_DS_TOKEN_MAP is not set (TF_DS_ENGRAM is)")
    })?;
    let kit = PathBuf::from(kit);
    let kernels = get("TENSORFOLD_CUDA_KERNELS").map_or_else(|| kit.join("aot"), PathBuf::from);
    let rdma_devices = get("TF_RDMA_DEVICES")
        .map(|v| {
            v.split(',')
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let streams = env_flag_u32(env, "TF_DS_STREAMS", 4, 1..=16)?;
    let round_rows = env_flag_u32(env, "TF_DS_ROUND_ROWS", 16, 16..=48)?;
    let mut engine_vars: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| {
            k.starts_with("TF_") || k.starts_with("NCCL_") || k.starts_with("TENSORFOLD_")
        })
        .filter(|(k, _)| k.as_str() != "TENSORFOLD_API_KEY")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    engine_vars.sort();
    Ok(Rank0Env {
        world,
        window,
        master,
        port,
        rank_cache: PathBuf::from(rank_cache),
        kit,
        kernels,
        engram: PathBuf::from(engram),
        token_map: PathBuf::from(token_map),
        rdma_devices,
        streams,
        round_rows,
        api_key: get("TENSORFOLD_API_KEY").cloned(),
        engine_vars,
    })
}
