//! The two command lines of the dsv41 engine, parsed as strictly (and as weakly) as the engine
//! parses them (the launch lines of docs/engine-contract.md).
//!
//! - Rank 0: `tensorfold-native serve MODEL_DIR [flags]` plus the `TF_TP_*` / `TF_DS_*` /
//!   `TENSORFOLD_*` environment. A flag the native engine does not serve exits 2 with
//!   "… is not served by the native engine yet".
//! - Rank 1: `tf-dsv41-lanes MODEL CACHE RANK WORLD MASTER PORT KIT [--key value ...]`. An unknown
//!   key fails with `error.BadArgument` (exit 1); a dangling last key is silently ignored, as the
//!   engine's loop only reads pairs with `ai + 1 < len`.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// The default `--context` (and, in the stand-in, rank 1's default `--pool`): `native.zig
/// default_context`.
pub const DEFAULT_CONTEXT: u64 = 262_144;
/// The default rendezvous port (`TF_TP_PORT`).
pub const DEFAULT_TP_PORT: u16 = 29_620;

/// Why a command line or its environment was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A rank-0 flag the native engine does not serve (exit 2).
    #[error("{flag} is not served by the native engine yet")]
    NotServed {
        /// The flag as given.
        flag: String,
    },
    /// A rank-0 command line that is not `serve MODEL_DIR [flags]`, a flag without its value or a
    /// value that does not parse (exit 2).
    #[error("usage: tensorfold-native serve MODEL_DIR [flags]: {problem}")]
    Usage {
        /// What is wrong.
        problem: String,
    },
    /// Rank 1's `error.BadArgument` (exit 1): an unknown key, a bare word where a `--key` was
    /// expected, a positional that does not parse, or a value out of range.
    #[error("error.BadArgument: {problem}")]
    BadArgument {
        /// What is wrong.
        problem: String,
    },
    /// An engine error raised while reading the environment or the arguments (exit 1), e.g.
    /// `NoRankCache` when `TF_DS_RANK_CACHE` is unset or `NotPortedYet` for `TF_TP_WORLD=3`.
    #[error("error.{name}: {detail}")]
    Engine {
        /// The engine's error name.
        name: &'static str,
        /// Context.
        detail: String,
    },
}

impl ArgsError {
    /// The process exit code the engine uses for this failure.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotServed { .. } | Self::Usage { .. } => 2,
            Self::BadArgument { .. } | Self::Engine { .. } => 1,
        }
    }

    fn engine(name: &'static str, detail: impl Into<String>) -> Self {
        Self::Engine {
            name,
            detail: detail.into(),
        }
    }
}

/// Rank 0's serve flags that the stand-in uses or records.
#[derive(Debug, Clone, PartialEq)]
pub struct Rank0Args {
    /// `serve MODEL_DIR`.
    pub model_dir: PathBuf,
    /// `--host` (default `127.0.0.1`).
    pub host: String,
    /// `--port` (default 8080).
    pub port: u16,
    /// `--name` (default: the model directory's base name).
    pub name: String,
    /// `--alias`, repeatable.
    pub aliases: Vec<String>,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// `--api-key-file` (`label: key` lines).
    pub api_key_file: Option<PathBuf>,
    /// `--context`: the shared pool of positions of all streams together.
    pub context: u64,
    /// `--parallel` (`None` = `auto`).
    pub parallel: Option<u32>,
    /// `--max-tokens` (default 4096).
    pub max_tokens: u64,
    /// `--thinking` / `--no-thinking` (default on).
    pub thinking: bool,
    /// `--reasoning-effort`.
    pub reasoning_effort: Option<String>,
    /// `--no-drafts`.
    pub no_drafts: bool,
    /// `--metrics-open`.
    pub metrics_open: bool,
    /// `--backend` (`auto` or `cuda`).
    pub backend: String,
    /// Every other accepted flag, recorded as given (`--temperature`, `--top-p`, ...).
    pub recorded: Vec<(String, Option<String>)>,
    /// The environment (`TF_TP_*`, `TF_DS_*`, ...).
    pub env: Rank0Env,
}

/// Rank 0's environment: its inputs and the rendezvous address.
#[derive(Debug, Clone, PartialEq)]
pub struct Rank0Env {
    /// `TF_TP_WORLD` (only 2 is emulated).
    pub world: u32,
    /// `TF_TP_MASTER`.
    pub master: Ipv4Addr,
    /// `TF_TP_PORT`.
    pub port: u16,
    /// `TF_DS_RANK_CACHE`.
    pub rank_cache: PathBuf,
    /// `TF_DS_KIT`.
    pub kit: PathBuf,
    /// `TENSORFOLD_CUDA_KERNELS`, default `<kit>/aot`.
    pub kernels: PathBuf,
    /// `TF_DS_ENGRAM`.
    pub engram: PathBuf,
    /// `TF_DS_TOKEN_MAP`.
    pub token_map: PathBuf,
    /// `TF_RDMA_DEVICES` (empty = NCCL).
    pub rdma_devices: Vec<String>,
    /// `TF_DS_STREAMS` (default 4, at most 16).
    pub streams: u32,
    /// `TF_DS_ROUND_ROWS` (16 … 48).
    pub round_rows: u32,
    /// `TENSORFOLD_API_KEY`.
    pub api_key: Option<String>,
    /// Every `TF_*`, `NCCL_*` and `TENSORFOLD_*` variable, sorted (for `/health` and fingerprints).
    pub engine_vars: Vec<(String, String)>,
}

/// Rank 1's command line: positional `MODEL CACHE RANK WORLD MASTER PORT KIT`, then `--key value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rank1Args {
    /// `MODEL_DIR`.
    pub model_dir: PathBuf,
    /// `CACHE_DIR`.
    pub cache_dir: PathBuf,
    /// `RANK` (1 in TP=2).
    pub rank: u32,
    /// `WORLD` (2).
    pub world: u32,
    /// `MASTER_IP`.
    pub master: Ipv4Addr,
    /// `PORT`.
    pub port: u16,
    /// `KIT_DIR`.
    pub kit: PathBuf,
    /// `--pool` (the stand-in's default is the native default context, 262,144).
    pub pool: u64,
    /// `--drafts 0|1` (default 1).
    pub drafts: bool,
    /// `--arena-gib` (default `2 + ceil(7·pool / 2^19)`).
    pub arena_gib: u64,
    /// `--engram`.
    pub engram: Option<PathBuf>,
    /// `--token-map`.
    pub token_map: Option<PathBuf>,
    /// `--rdma` device list.
    pub rdma: Vec<String>,
    /// Every `--key value` pair as given (known keys only).
    pub pairs: Vec<(String, String)>,
}

/// The engine's default device arena for a pool, in GiB (`defaultArenaGib(pool)`).
#[must_use]
pub fn default_arena_gib(pool: u64) -> u64 {
    2 + (7 * pool).div_ceil(1 << 19)
}

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

fn parse_ip(what: &str, v: &str) -> Result<Ipv4Addr, ArgsError> {
    // `link.parseIp`: dotted quad only
    let ok = v.split('.').count() == 4
        && v.split('.')
            .all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()));
    match v.parse::<Ipv4Addr>() {
        Ok(ip) if ok => Ok(ip),
        _ => Err(ArgsError::engine(
            "BadIp",
            format!("{what} {v:?} is not a dotted-quad IPv4 address"),
        )),
    }
}

fn env_flag_u32(
    env: &HashMap<String, String>,
    key: &str,
    default: u32,
    range: std::ops::RangeInclusive<u32>,
) -> Result<u32, ArgsError> {
    match env.get(key) {
        None => Ok(default),
        Some(v) => match v.parse::<u32>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(ArgsError::engine(
                "BadEnvironment",
                format!(
                    "{key}={v:?} is not a number in {}..={}",
                    range.start(),
                    range.end()
                ),
            )),
        },
    }
}

/// The TP=2 kit's recorded Triton variants: 16-row rounds and at most 4 pool streams.
/// `TF_DS_ROUND_ROWS` and `TF_DS_STREAMS` are read from the environment on **both** ranks; other
/// values fail with `MissingTritonVariant` (the stand-in fails at start, where the engine fails
/// at its first launch of the missing variant).
///
/// # Errors
/// [`ArgsError::Engine`] `MissingTritonVariant`, or `BadEnvironment` for a value that does not
/// parse.
pub fn check_kit_variants(env: &HashMap<String, String>) -> Result<(), ArgsError> {
    let rows = env_flag_u32(env, "TF_DS_ROUND_ROWS", 16, 16..=48)?;
    let streams = env_flag_u32(env, "TF_DS_STREAMS", 4, 1..=16)?;
    if rows != 16 || streams > 4 {
        return Err(ArgsError::engine(
            "MissingTritonVariant",
            format!(
                "TF_DS_ROUND_ROWS={rows}, TF_DS_STREAMS={streams}: the TP=2 kit recorded 16-row rounds and at most 4 streams"
            ),
        ));
    }
    Ok(())
}

fn parse_rank0_env(env: &HashMap<String, String>) -> Result<Rank0Env, ArgsError> {
    let get = |k: &str| env.get(k).filter(|v| !v.is_empty());
    let world = match env.get("TF_TP_WORLD").map(String::as_str) {
        None | Some("2") => 2,
        Some(other) => {
            return Err(ArgsError::engine(
                "NotPortedYet",
                format!("TF_TP_WORLD={other:?}: the stand-in emulates the TP=2 build (world 2)"),
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

/// Rank 1's known `--key`s in the TP=2 build. `--round-rows`, `--streams`, `--context` are TP=4
/// builds only and so unknown here.
const RANK1_KEYS: &[&str] = &[
    "--pool",
    "--drafts",
    "--arena-gib",
    "--engram",
    "--token-map",
    "--rdma",
    "--rdma-kernels",
    "--graphs",
    "--side",
    "--prefetch",
    "--aio",
    "--profile",
    "--serial",
    "--parallel",
    "--requests",
];

fn bad(problem: impl Into<String>) -> ArgsError {
    ArgsError::BadArgument {
        problem: problem.into(),
    }
}

fn bad_num<T: std::str::FromStr>(what: &str, v: &str) -> Result<T, ArgsError> {
    v.parse()
        .map_err(|_| bad(format!("{what} {v:?} is not a number")))
}

/// Parses rank 1's arguments (everything after `argv[0]`).
///
/// # Errors
/// [`ArgsError::BadArgument`] for fewer than seven positionals, a positional that does not
/// parse, an unknown key or a bad value; [`ArgsError::Engine`] `NotPortedYet` for a world other
/// than 2, `BadIp` for a master that is not a dotted quad.
pub fn parse_rank1(args: &[String]) -> Result<Rank1Args, ArgsError> {
    if args.len() < 7 {
        return Err(bad(format!(
            "expected MODEL CACHE RANK WORLD MASTER PORT KIT, got {} positional arguments",
            args.iter().take_while(|a| !a.starts_with("--")).count()
        )));
    }
    if let Some(p) = args[..7].iter().find(|a| a.starts_with("--")) {
        return Err(bad(format!(
            "{p} where the 7 positionals MODEL CACHE RANK WORLD MASTER PORT KIT are expected"
        )));
    }
    let rank: u32 = bad_num("RANK", &args[2])?;
    let world: u32 = bad_num("WORLD", &args[3])?;
    if world != 2 {
        return Err(ArgsError::engine(
            "NotPortedYet",
            format!("WORLD {world}: the stand-in emulates the TP=2 build (world 2)"),
        ));
    }
    if rank == 0 || rank >= world {
        return Err(bad(format!(
            "RANK {rank}: tf-dsv41-lanes follows rank 0, so RANK is 1 … WORLD-1 (the stand-in does not emulate rank-0 gate mode)"
        )));
    }
    let master = parse_ip("MASTER_IP", &args[4])?;
    let port: u16 = bad_num("PORT", &args[5])?;
    let mut a = Rank1Args {
        model_dir: PathBuf::from(&args[0]),
        cache_dir: PathBuf::from(&args[1]),
        rank,
        world,
        master,
        port,
        kit: PathBuf::from(&args[6]),
        pool: DEFAULT_CONTEXT,
        drafts: true,
        arena_gib: 0,
        engram: None,
        token_map: None,
        rdma: Vec::new(),
        pairs: Vec::new(),
    };
    let mut arena: Option<u64> = None;
    let mut ai = 7;
    // the engine's loop: `while (ai + 1 < len)`, so a dangling last key is never looked at
    while ai + 1 < args.len() {
        let key = args[ai].as_str();
        let v = args[ai + 1].as_str();
        ai += 2;
        if !RANK1_KEYS.contains(&key) {
            return Err(bad(format!("unknown key {key:?}")));
        }
        let zero_one = |v: &str| match v {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(bad(format!("{key} {v:?} is not 0 or 1"))),
        };
        match key {
            "--pool" => {
                a.pool = bad_num(key, v)?;
                if a.pool == 0 {
                    return Err(bad("--pool must be positive"));
                }
            }
            "--drafts" => a.drafts = zero_one(v)?,
            "--arena-gib" => arena = Some(bad_num(key, v)?),
            "--engram" => a.engram = Some(PathBuf::from(v)),
            "--token-map" => a.token_map = Some(PathBuf::from(v)),
            "--rdma" => {
                a.rdma = v
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            "--graphs" | "--side" | "--prefetch" | "--aio" | "--serial" => {
                zero_one(v)?;
            }
            "--profile" if !["0", "1", "2"].contains(&v) => {
                return Err(bad(format!("--profile {v:?} is not 0, 1 or 2")));
            }
            "--parallel" => {
                bad_num::<u32>(key, v)?;
            }
            _ => {}
        }
        a.pairs.push((key.to_owned(), v.to_owned()));
    }
    a.arena_gib = arena.unwrap_or_else(|| default_arena_gib(a.pool));
    if a.engram.is_none() {
        return Err(ArgsError::engine(
            "NoEngramTables",
            "no --engram and the checkpoint has Engram layers",
        ));
    }
    if a.token_map.is_none() {
        return Err(ArgsError::engine(
            "NoTokenMap",
            "no --token-map (--engram is set)",
        ));
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    fn env0() -> HashMap<String, String> {
        [
            ("TF_TP_MASTER", "127.0.0.1"),
            ("TF_DS_RANK_CACHE", "/cache"),
            ("TF_DS_KIT", "/kit"),
            ("TF_DS_ENGRAM", "/engram"),
            ("TF_DS_TOKEN_MAP", "/tm.json"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    #[test]
    fn rank1_dangling_key_is_ignored_and_unknown_key_refused() {
        let base = [
            "/m",
            "/c",
            "1",
            "2",
            "10.0.0.1",
            "29620",
            "/k",
            "--engram",
            "/e",
            "--token-map",
            "/t",
        ];
        let mut v = s(&base);
        v.push("--pool".into());
        let a = parse_rank1(&v).unwrap();
        assert_eq!(a.pool, DEFAULT_CONTEXT);
        let mut v = s(&base);
        v.extend(s(&["--bogus", "1"]));
        let e = parse_rank1(&v).unwrap_err();
        assert!(matches!(e, ArgsError::BadArgument { .. }), "{e}");
        assert_eq!(e.exit_code(), 1);
        let mut v = s(&base);
        v.extend(s(&["--round-rows", "48"]));
        assert!(parse_rank1(&v).is_err());
        let mut v = s(&base);
        v.extend(s(&["--pool", "4096", "--arena-gib", "3"]));
        let a = parse_rank1(&v).unwrap();
        assert_eq!((a.pool, a.arena_gib), (4096, 3));
    }

    #[test]
    fn rank0_unknown_flag_exits_2_and_env_is_required() {
        let e = parse_rank0(&s(&["serve", "/m", "--bogus", "1"]), &env0()).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string()
                .contains("is not served by the native engine yet")
        );
        let mut env = env0();
        env.remove("TF_DS_RANK_CACHE");
        let e = parse_rank0(&s(&["serve", "/m"]), &env).unwrap_err();
        assert!(e.to_string().starts_with("error.NoRankCache"), "{e}");
        let a = parse_rank0(
            &s(&[
                "serve",
                "/m",
                "--context",
                "4096",
                "--no-thinking",
                "--port",
                "1",
            ]),
            &env0(),
        )
        .unwrap();
        assert_eq!((a.context, a.thinking, a.port), (4096, false, 1));
        assert_eq!(default_arena_gib(1 << 20), 16);
    }
}
