//! Rank 1's command line (`tf-dsv41-lanes MODEL CACHE RANK WORLD MASTER PORT KIT [--key value
//! ...]`).

use std::path::PathBuf;

use super::{ArgsError, DEFAULT_CONTEXT, Rank1Args, default_arena_gib, parse_ip};

/// A follower's known `--key`s in the TP=2 build. `--round-rows`, `--streams`, `--context` are
/// the TP=4 build's ([`TP4_KEYS`]) and unknown here.
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

/// The TP=4 build's follower keys: rows per round, pool streams (as rank 0's `TF_DS_ROUND_ROWS`
/// and `TF_DS_STREAMS`, which it reads from the environment) and a request's positions.
const TP4_KEYS: &[&str] = &["--round-rows", "--streams", "--context"];

fn bad(problem: impl Into<String>) -> ArgsError {
    ArgsError::BadArgument {
        problem: problem.into(),
    }
}

fn bad_num<T: std::str::FromStr>(what: &str, v: &str) -> Result<T, ArgsError> {
    v.parse()
        .map_err(|_| bad(format!("{what} {v:?} is not a number")))
}

/// Parses a follower's arguments (everything after `argv[0]`); `env` tells the build: with
/// `TF_DS_WINDOW` set it is the TP=4 build, which takes world 4 and [`TP4_KEYS`] (all three
/// required, rows and streams equal to the environment's).
///
/// # Errors
/// [`ArgsError::BadArgument`] for fewer than seven positionals, a positional that does not
/// parse, an unknown key, a bad value or a missing TP=4 key; [`ArgsError::Engine`]
/// `NotPortedYet` for a world the build does not serve, `BadIp` for a master that is not a
/// dotted quad, `BadEnvironment` for TP=4 flags that differ from the environment.
pub fn parse_rank1(
    args: &[String],
    env: &std::collections::HashMap<String, String>,
) -> Result<Rank1Args, ArgsError> {
    let window = super::tp4_window(env)?;
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
    if !(world == 2 || world == 4 && window.is_some()) {
        return Err(ArgsError::engine(
            "NotPortedYet",
            format!(
                "WORLD {world}: the TP=2 build serves world 2; world 4 is the TP=4 build's (its settings include TF_DS_WINDOW)"
            ),
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
        context: None,
        pairs: Vec::new(),
    };
    let mut tp4: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    let mut arena: Option<u64> = None;
    let mut ai = 7;
    // the engine's loop: `while (ai + 1 < len)`, so a dangling last key is never looked at
    while ai + 1 < args.len() {
        let key = args[ai].as_str();
        let v = args[ai + 1].as_str();
        ai += 2;
        if TP4_KEYS.contains(&key) && window.is_some() {
            tp4.insert(key, bad_num(key, v)?);
            a.pairs.push((key.to_owned(), v.to_owned()));
            continue;
        }
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
    if window.is_some() {
        for key in TP4_KEYS {
            if !tp4.contains_key(key) {
                return Err(bad(format!(
                    "the TP=4 build's follower takes {key} (with --round-rows, --streams and --context)"
                )));
            }
        }
        for (key, var, default) in [
            ("--round-rows", "TF_DS_ROUND_ROWS", 16),
            ("--streams", "TF_DS_STREAMS", 4),
        ] {
            let from_env = super::env_flag_u32(env, var, default, 1..=48)?;
            if u64::from(from_env) != tp4[key] {
                return Err(ArgsError::engine(
                    "BadEnvironment",
                    format!("{key} {} differs from {var}={from_env}", tp4[key]),
                ));
            }
        }
        let context = tp4["--context"];
        if context == 0 || context > a.pool {
            return Err(bad(format!(
                "--context {context} (one request) must be 1 … --pool {}",
                a.pool
            )));
        }
        a.context = Some(context);
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
