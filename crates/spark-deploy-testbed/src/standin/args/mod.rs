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

mod rank0;
mod rank1;

pub use rank0::parse_rank0;
pub use rank1::parse_rank1;

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
    /// `TF_TP_WORLD`: 2, or 4 in the TP=4 build.
    pub world: u32,
    /// `TF_DS_WINDOW` (the TP=4 build's shared pool; `--context` then bounds one request).
    pub window: Option<u64>,
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
    /// `RANK` (1 … WORLD−1).
    pub rank: u32,
    /// `WORLD` (2, or 4 in the TP=4 build).
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
    /// The TP=4 build's `--context` (a request's positions, at most `--pool`).
    pub context: Option<u64>,
    /// Every `--key value` pair as given (known keys only).
    pub pairs: Vec<(String, String)>,
}

impl Rank0Args {
    /// The shared pool of positions: `TF_DS_WINDOW` in the TP=4 build, else `--context`.
    #[must_use]
    pub fn pool(&self) -> u64 {
        self.env.window.unwrap_or(self.context)
    }
}

/// The engine's default device arena for a pool, in GiB (`defaultArenaGib(pool)`).
#[must_use]
pub fn default_arena_gib(pool: u64) -> u64 {
    2 + (7 * pool).div_ceil(1 << 19)
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

/// The TP=4 build's shared pool, `TF_DS_WINDOW`: the stand-in runs as the TP=4 build when it is
/// set (only that build reads it), and then takes world 4 and the followers' TP=4 flags.
///
/// # Errors
/// `BadEnvironment` for a value that is not a positive number.
pub fn tp4_window(env: &HashMap<String, String>) -> Result<Option<u64>, ArgsError> {
    match env.get("TF_DS_WINDOW") {
        None => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(ArgsError::engine(
                "BadEnvironment",
                format!("TF_DS_WINDOW={v:?} is not a positive number of positions"),
            )),
        },
    }
}

/// The port follower `rank` joins: `port` + rank − 1 (rank 0 listens on one per follower; at
/// world 2 the port itself).
#[must_use]
pub fn follower_port(port: u16, rank: u32) -> u16 {
    port.saturating_add(u16::try_from(rank.saturating_sub(1)).unwrap_or(u16::MAX))
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
    // The TP=4 build's kit recorded 16 to 48 rows and up to 16 streams.
    if tp4_window(env)?.is_some() {
        return Ok(());
    }
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
        let a = parse_rank1(&v, &HashMap::new()).unwrap();
        assert_eq!(a.pool, DEFAULT_CONTEXT);
        let mut v = s(&base);
        v.extend(s(&["--bogus", "1"]));
        let e = parse_rank1(&v, &HashMap::new()).unwrap_err();
        assert!(matches!(e, ArgsError::BadArgument { .. }), "{e}");
        assert_eq!(e.exit_code(), 1);
        let mut v = s(&base);
        v.extend(s(&["--round-rows", "48"]));
        assert!(parse_rank1(&v, &HashMap::new()).is_err());
        let mut v = s(&base);
        v.extend(s(&["--pool", "4096", "--arena-gib", "3"]));
        let a = parse_rank1(&v, &HashMap::new()).unwrap();
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

    #[test]
    fn world_4_is_the_tp4_builds_and_its_follower_flags_must_match_its_environment() {
        let follower = |rank: &str, extra: &[&str]| {
            let mut v = s(&[
                "/m",
                "/c",
                rank,
                "4",
                "10.0.0.1",
                "29620",
                "/k",
                "--engram",
                "/e",
                "--token-map",
                "/t",
                "--pool",
                "8192",
            ]);
            v.extend(s(extra));
            v
        };
        let tp4: HashMap<String, String> = [("TF_DS_WINDOW", "8192"), ("TF_DS_STREAMS", "8")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let flags = ["--round-rows", "16", "--streams", "8", "--context", "4096"];
        // The TP=2 build (no TF_DS_WINDOW) serves world 2 only and knows no TP=4 flag.
        let e = parse_rank1(&follower("3", &flags), &HashMap::new()).unwrap_err();
        assert!(e.to_string().starts_with("error.NotPortedYet"), "{e}");
        let a = parse_rank1(&follower("3", &flags), &tp4).unwrap();
        assert_eq!((a.rank, a.world, a.context), (3, 4, Some(4096)));
        assert_eq!(follower_port(29620, a.rank), 29622);
        assert_eq!(follower_port(29620, 1), 29620);
        // Every TP=4 flag is required, rows and streams as the environment says.
        let e = parse_rank1(&follower("2", &flags[..4]), &tp4).unwrap_err();
        assert!(e.to_string().contains("--context"), "{e}");
        let mut other = flags;
        other[3] = "16";
        let e = parse_rank1(&follower("2", &other), &tp4).unwrap_err();
        assert!(
            e.to_string()
                .contains("--streams 16 differs from TF_DS_STREAMS=8"),
            "{e}"
        );
        // Rank 0: world 4 with the window, whose pool it is; a request above it is refused.
        let mut env = env0();
        env.insert("TF_TP_WORLD".into(), "4".into());
        let e = parse_rank0(&s(&["serve", "/m"]), &env).unwrap_err();
        assert!(e.to_string().starts_with("error.NotPortedYet"), "{e}");
        env.extend(tp4);
        let a = parse_rank0(&s(&["serve", "/m", "--context", "4096"]), &env).unwrap();
        assert_eq!((a.env.world, a.pool()), (4, 8192));
        let e = parse_rank0(&s(&["serve", "/m", "--context", "9000"]), &env).unwrap_err();
        assert!(e.to_string().starts_with("error.ContextAboveWindow"), "{e}");
    }
}
