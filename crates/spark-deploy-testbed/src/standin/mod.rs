//! The engine stand-in: the testbed's `tensorfold-native` and `tf-dsv41-lanes` (docs/testbed.md).
//!
//! One binary (`tf-standin`) installed under the engine's two names; [`run`] dispatches on the
//! base name of `argv[0]`:
//! - `tensorfold-native` (or `tensorfold`) → rank 0: `serve MODEL_DIR [flags]` + env
//!   ([`args::parse_rank0`]), loads and checks its inputs, rendezvous (binds
//!   `TF_TP_MASTER:TF_TP_PORT`, waits with no timeout), runs the split proof with the followers, then
//!   serves the HTTP API ([`server`]) until SIGTERM/SIGINT, on which it sends `done` and exits 0;
//! - `tf-dsv41-lanes` → rank 1: `MODEL CACHE RANK WORLD MASTER PORT KIT [--key value ...]`
//!   ([`args::parse_rank1`]), loads, prints its loaded line, connects (retrying every 250 ms for
//!   `TF_STANDIN_CONNECT_TIMEOUT_S`, default 300 s), ships its split-proof partials and follows
//!   rank 0 until `done` (exit 0, `{"rank": 1, "followed": true}`) or a link error (exit 1,
//!   `{"rank": 1, "follow": "<Error>"}`).
//!
//! Stand-in-only environment: `TF_STANDIN_CONNECT_TIMEOUT_S` (rank 1's connect window) and
//! `TF_STANDIN_PROOF` (`all`, or a comma list of tensor prefixes; default
//! [`split::default_tensors`]). Pass both to both ranks. Rank 0 also reads the performance
//! model ([`perf`]: `TF_STANDIN_DECODE_TPS`, `TF_STANDIN_PREFILL_TPS`, `TF_STANDIN_CONTENTION`,
//! `TF_STANDIN_TIME_SCALE`, `TF_STANDIN_ACCEPT`) and the API's fault modes ([`faults`]:
//! `TF_STANDIN_FAULT`).
//!
//! Library code does not print: the protocol lines go to the `out` writer the binary passes
//! (stdout), errors to `err` (stderr).
//!
//! # Installing and launching (for the testbed's engine profile)
//!
//! - Build `tf-standin` (`cargo build -p spark-deploy-testbed --bin tf-standin`; find it with
//!   [`locate_binary`]) and put it in an engine dir under both names with
//!   [`install_engine_dir`] (`tensorfold-native`, `tf-dsv41-lanes`); mount that dir at `/engine`.
//! - Image: `docker import` the tar of [`rootfs_tar`] (loader + the libraries `ldd` lists, `/tmp`)
//!   or of [`rootfs_tar_with`]`(bin, SHELL_PROGRAMS)`, which adds `bash` and `tee` so the bash
//!   recipe's `bash -c "( CMD ) 2>&1 | tee /logs/NAME.log"` container command runs unchanged.
//! - Command lines and env: exactly the engine's (docs/engine-contract.md, "Launch lines").
//!   Test-scale knobs: `TF_STANDIN_CONNECT_TIMEOUT_S` (rank 1), `TF_STANDIN_PROOF` (both).
//!
//! # Behaviour decisions where the contract is silent
//!
//! - Errors before serving/following: one stderr line `error.<Name>: <context>`, exit 1 (exit 2
//!   for rank-0 usage errors and unserved flags). Names used beyond the contract's: `NoTpMaster`,
//!   `BadIp`, `BadPort`, `BadEnvironment`, `BadConfig`, `UnsupportedModel`, `NoTokenizer`,
//!   `BadTokenMap`, `NoRopeTables`, `RopeTableTooShort` (pool + 49 rows), `BadEngramJson`,
//!   `NoKernelImages` (no `aot.json`), `NoVisionBias`, `EngramRowsDiffer`, `BadRankCache`,
//!   `MissingTensor`, `BadApiKeyFile`, `BindFailed`, `AddressInUse`.
//! - `ConnectFailed` goes to stderr only (it happens before following); rank 1's
//!   `{"rank": 1, "follow": …}` lines are for errors while following.
//! - Rank 0 prints two stand-in lines on stdout: `{"rank": 0, "loaded_s", "pool", "rendezvous",
//!   "digest"}` (SIGTERM is handled from then on) and `{"rank": 0, "serving", "split_proof"}`.
//!   HTTP opens only after the rendezvous and the proof (whether the engine opens it earlier is
//!   not known). `digest` (also in rank 1's loaded line) is [`digest::digests`]: which weights the
//!   rank loaded, for the `ABLIT` test.
//! - Different RDMA device counts (`TF_RDMA_DEVICES` vs `--rdma`, empty = none) stop both
//!   ranks with `error.BadInfo` right after the rendezvous (`rdma.zig connect`); the stand-in
//!   also treats "RDMA on one rank only" as `BadInfo` (the engine would hang in the QP exchange).
//! - `--pool` ≠ `--context` is only noticed as the engine notices it: a larger rank-0 pool makes
//!   rank 1 fail with `FrameTooLong` (rank 0 then serves with a failed proof: every chat is 500);
//!   a smaller one goes unnoticed. Drafts, kit, token map and Engram mismatches are not checked.
//! - World 4 is the TP=4 build's: with `TF_DS_WINDOW` set (only that build reads it) rank 0 takes
//!   `TF_TP_WORLD=4`, its pool is the window (`--context` bounds one request, at most the window),
//!   the followers take `--round-rows/--streams/--context` (all three, rows and streams equal to
//!   `TF_DS_ROUND_ROWS`/`TF_DS_STREAMS`), and follower g joins rank 0 on `TF_TP_PORT` + g − 1 (rank
//!   0 listens on one port per follower); the proof combines every rank's partials. Without the
//!   window, world 4 is `NotPortedYet` and those flags are unknown keys. After a follower fails,
//!   rank 0 keeps the other followers' links open and unused (they hang as in a collective): only
//!   the deployer's stop ends them.
//! - Not emulated: rank-0 gate mode of `tf-dsv41-lanes`, TP=4 `--parity`, NCCL/RDMA,
//!   `follow_refused`, `/v1/completions`, `/v1/responses`, `/v1/messages`, `/detokenize` (404),
//!   non-PNG images (400: the image has no python3/Pillow), the config shape guard (the real
//!   model's dimensions; test-scale checkpoints must pass), kit `MANIFEST` verification (not done
//!   by the engine).

pub mod answer;
pub mod args;
pub mod digest;
pub mod faults;
pub mod generate;
pub mod inputs;
pub mod link;
pub mod loopback;
pub mod opened;
pub mod perf;
pub mod png;
pub mod rank_file;
pub mod rootfs;
pub mod server;
pub mod split;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

pub use rootfs::{SHELL_PROGRAMS, rootfs_tar, rootfs_tar_with, write_rootfs_tar};

use self::args::{ArgsError, Rank0Args, Rank1Args};
use self::inputs::{Checkpoint, ModelConfig};
use self::link::{LinkError, kind};
use self::rank_file::RankFile;
use self::split::{Partial, ProofReport};

/// The names rank 0 answers to.
pub const RANK0_NAMES: &[&str] = &["tensorfold-native", "tensorfold"];
/// The name rank 1 answers to.
pub const RANK1_NAME: &str = "tf-dsv41-lanes";
/// Env: rank 1's connect window in seconds (default 300, the engine's).
pub const CONNECT_TIMEOUT_ENV: &str = "TF_STANDIN_CONNECT_TIMEOUT_S";
/// Env: which tensors the split proof covers.
pub const PROOF_ENV: &str = "TF_STANDIN_PROOF";

/// A failure that ends a rank before it serves or follows: the engine's error name and context.
#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    /// The command line or environment.
    #[error(transparent)]
    Args(#[from] ArgsError),
    /// An input file.
    #[error(transparent)]
    Inputs(#[from] inputs::InputsError),
    /// The rank file.
    #[error(transparent)]
    RankFile(#[from] rank_file::RankFileError),
    /// The rank file lacks a tensor the proof needs.
    #[error(transparent)]
    Split(#[from] split::SplitError),
    /// The link (bind, connect).
    #[error("error.{}", .0.detail())]
    Link(#[from] LinkError),
    /// The HTTP listener.
    #[error(transparent)]
    Server(#[from] server::ServerError),
    /// The performance model's environment.
    #[error(transparent)]
    Perf(#[from] perf::PerfError),
    /// The fault modes' environment.
    #[error(transparent)]
    Fault(#[from] faults::FaultError),
    /// The async runtime.
    #[error("error.Runtime: {0}")]
    Runtime(std::io::Error),
}

impl StandinError {
    /// The exit code.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Args(a) => a.exit_code(),
            _ => 1,
        }
    }
}

/// Runs the stand-in as the rank `argv[0]` names. Returns the process exit code.
pub fn run(
    argv: &[String],
    env: &HashMap<String, String>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let name = argv
        .first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let rest = argv.get(1..).unwrap_or(&[]);
    let r = if RANK0_NAMES.contains(&name.as_str()) {
        run_rank0(rest, env, out)
    } else if name == RANK1_NAME {
        run_rank1(rest, env, out)
    } else {
        let _ = writeln!(
            err,
            "tf-standin: install me as tensorfold-native (rank 0) or tf-dsv41-lanes (rank 1); argv[0] is {name:?}"
        );
        return 2;
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "{e}");
            e.exit_code()
        }
    }
}

/// Runs the stand-in as this process: `argv` and the environment of the process, stdout and
/// stderr; the exit code. For `tf-standin` and the multi-call `spark-deploy` binary.
#[must_use]
pub fn run_process() -> u8 {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let env = std::env::vars_os()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    run(&argv, &env, &mut std::io::stdout(), &mut std::io::stderr())
}

/// Whether `name` (the base name of `argv[0]`) is one of the engine binaries the stand-in runs as.
#[must_use]
pub fn is_engine_name(name: &str) -> bool {
    RANK0_NAMES.contains(&name) || name == RANK1_NAME
}

/// Installs `binary` in `engine_dir` under both engine names (`tensorfold-native`,
/// `tf-dsv41-lanes`): a hard link, or a copy when linking fails (another filesystem). Existing
/// files of those names are replaced.
///
/// # Errors
/// Creating the directory or copying fails.
pub fn install_engine_dir(binary: &Path, engine_dir: &Path) -> std::io::Result<()> {
    fs_err::create_dir_all(engine_dir)?;
    for name in [RANK0_NAMES[0], RANK1_NAME] {
        let to = engine_dir.join(name);
        if to.exists() {
            fs_err::remove_file(&to)?;
        }
        if fs_err::hard_link(binary, &to).is_err() {
            fs_err::copy(binary, &to)?;
        }
    }
    Ok(())
}

/// Finds a built `tf-standin` next to the running executable (or one directory up, for test
/// binaries in `target/<profile>/deps/`).
#[must_use]
pub fn locate_binary() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join("tf-standin"))
        .find(|p| p.is_file())
}

fn secs(start: Instant) -> f64 {
    (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
}

/// What both ranks load before they meet.
struct Loaded {
    cfg: ModelConfig,
    rank_file: RankFile,
    partials: Vec<Partial>,
    tensors: Vec<String>,
    /// sha256 of the digested tensors' entries, by key (which weights were loaded).
    digest: std::collections::BTreeMap<String, String>,
}

#[allow(clippy::too_many_arguments)]
fn load(
    model_dir: &Path,
    cache: &Path,
    rank: u32,
    world: u32,
    kit: &Path,
    kernels: &Path,
    engram: &Path,
    token_map: &Path,
    pool: u64,
    env: &HashMap<String, String>,
) -> Result<Loaded, StandinError> {
    let cfg = ModelConfig::read(model_dir)?;
    let path = rank_file::find(cache, rank, world)?;
    let rank_file = RankFile::open(&path)?;
    let vocab = inputs::tokenizer_vocab_size(model_dir)?;
    inputs::read_token_map(token_map, vocab, cfg.compressed_vocab)?;
    inputs::check_kit(kit, kernels, &cfg, pool)?;
    inputs::check_engram(engram, &cfg)?;
    let tensors = split::tensors_from_env(
        env.get(PROOF_ENV).map(String::as_str),
        &cfg.engram_layers,
        &rank_file,
    );
    let partials = split::rank_partials(&rank_file, rank, &tensors)?;
    let digest = digest::digests(
        &rank_file,
        &digest::tensors_from_env(env.get(digest::DIGEST_ENV).map(String::as_str)),
    )?;
    Ok(Loaded {
        cfg,
        rank_file,
        partials,
        tensors,
        digest,
    })
}

fn run_rank1(
    argv: &[String],
    env: &HashMap<String, String>,
    out: &mut dyn Write,
) -> Result<u8, StandinError> {
    let start = Instant::now();
    let a: Rank1Args = args::parse_rank1(argv, env)?;
    if faults::Faults::from_env(env)?.has(faults::Fault::FollowerExits) {
        let _ = writeln!(
            out,
            "{{\"rank\": {}, \"exit\": \"follower_exits\"}}",
            a.rank
        );
        let _ = out.flush();
        return Ok(2);
    }
    args::check_kit_variants(env)?;
    let engram = a.engram.clone().unwrap_or_default();
    let token_map = a.token_map.clone().unwrap_or_default();
    let kernels = env
        .get("TENSORFOLD_CUDA_KERNELS")
        .filter(|v| !v.is_empty())
        .map_or_else(|| a.kit.join("aot"), std::path::PathBuf::from);
    let l = load(
        &a.model_dir,
        &a.cache_dir,
        a.rank,
        a.world,
        &a.kit,
        &kernels,
        &engram,
        &token_map,
        a.pool,
        env,
    )?;
    let _ = writeln!(
        out,
        "{{\"rank\": {}, \"loaded_s\": {}, \"pool\": {}, \"drafts\": {}, \"arena_used\": {}, \"opened\": {}, \"digest\": {}}}",
        a.rank,
        secs(start),
        a.pool,
        u8::from(a.drafts),
        l.rank_file.data_len,
        serde_json::to_string(&opened::opened()).unwrap_or_else(|_| "[]".to_owned()),
        serde_json::to_string(&l.digest).unwrap_or_else(|_| "{}".to_owned())
    );
    let _ = out.flush();
    let timeout = env
        .get(CONNECT_TIMEOUT_ENV)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(300);
    let mut s = link::connect(
        a.master,
        args::follower_port(a.port, a.rank),
        Duration::from_secs(timeout),
    )?;
    if faults::Faults::from_env(env)?.has(faults::Fault::CrashLoop) {
        crash_after(a.rank, faults::CRASH_AFTER);
    }
    let follow = |out: &mut dyn Write, e: &LinkError| {
        let _ = writeln!(
            out,
            "{{\"rank\": {}, \"follow\": \"{}\"}}",
            a.rank,
            e.name()
        );
        let _ = out.flush();
    };
    let limit = link::rank1_limit(a.pool);
    let partials = serde_json::to_vec(
        &serde_json::json!({"partials": l.partials, "rdma_devices": a.rdma.len()}),
    )
    .unwrap_or_default();
    let mut expected = 0u64;
    loop {
        let mut peer_rdma = None;
        let r = link::read_frame(&mut s, limit).and_then(|f| {
            let (k, step, fields) = link::split_payload(&f)?;
            if k == kind::INIT && fields.len() >= 8 {
                peer_rdma = Some(u32::from_le_bytes([
                    fields[4], fields[5], fields[6], fields[7],
                ]));
            }
            if step != expected {
                return Err(LinkError::OutOfStep {
                    expected,
                    got: step,
                });
            }
            if !kind::FOLLOWED.contains(&k) {
                return Err(LinkError::BadFrame);
            }
            Ok((k, step))
        });
        match r {
            Ok((kind::DONE, _)) => {
                let _ = writeln!(out, "{{\"rank\": {}, \"followed\": true}}", a.rank);
                let _ = out.flush();
                return Ok(0);
            }
            Ok((kind::INIT, step)) => {
                if let Err(e) =
                    link::write_frame(&mut s, &link::payload(kind::PARTIALS, step, &partials))
                {
                    follow(out, &e);
                    return Ok(1);
                }
                // the RDMA ring's QP exchange: both ranks refuse different device counts
                let theirs = peer_rdma.unwrap_or(0) as usize;
                if theirs != a.rdma.len() {
                    return Err(LinkError::BadInfo {
                        ours: a.rdma.len(),
                        theirs,
                    }
                    .into());
                }
            }
            Ok((_, step)) => {
                if let Err(e) = link::write_frame(&mut s, &link::payload(kind::ACK, step, &[])) {
                    follow(out, &e);
                    return Ok(1);
                }
            }
            Err(e) => {
                follow(out, &e);
                return Ok(1);
            }
        }
        expected += 1;
    }
}

/// `crash_loop`: the process exits (code 3, one JSON line) `after` from now, like an engine that
/// dies after every start.
#[allow(clippy::exit)]
fn crash_after(rank: u32, after: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{{\"rank\": {rank}, \"crash\": \"crash_loop\"}}");
        let _ = out.flush();
        std::process::exit(3);
    });
}

fn run_rank0(
    argv: &[String],
    env: &HashMap<String, String>,
    out: &mut dyn Write,
) -> Result<u8, StandinError> {
    let start = Instant::now();
    let a: Rank0Args = args::parse_rank0(argv, env)?;
    let perf = perf::PerfModel::from_env(env)?;
    let faults = faults::Faults::from_env(env)?;
    let mut keys: Vec<String> = a.api_key.iter().cloned().collect();
    if let Some(f) = &a.api_key_file {
        keys.extend(inputs::read_api_keys(f)?);
    }
    keys.extend(a.env.api_key.iter().cloned());
    let l = load(
        &a.model_dir,
        &a.env.rank_cache,
        0,
        a.env.world,
        &a.env.kit,
        &a.env.kernels,
        &a.env.engram,
        &a.env.token_map,
        a.pool(),
        env,
    )?;
    let ckpt = Checkpoint::open(&a.model_dir)?;
    let loaded_s = secs(start);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(StandinError::Runtime)?;
    rt.block_on(rank0_async(a, keys, l, ckpt, loaded_s, (perf, faults), out))
}

async fn rank0_async(
    a: Rank0Args,
    keys: Vec<String>,
    l: Loaded,
    ckpt: Checkpoint,
    loaded_s: f64,
    (perf, faults): (perf::PerfModel, faults::Faults),
    out: &mut dyn Write,
) -> Result<u8, StandinError> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(StandinError::Runtime)?;
    // printed once SIGTERM is handled, so a stop right after this line is a clean exit 0
    let _ = writeln!(
        out,
        "{{\"rank\": 0, \"loaded_s\": {loaded_s}, \"pool\": {}, \"world\": {}, \"rendezvous\": \"{}:{}\", \"digest\": {}}}",
        a.pool(),
        a.env.world,
        a.env.master,
        a.env.port,
        serde_json::to_string(&l.digest).unwrap_or_else(|_| "{}".to_owned())
    );
    let _ = out.flush();
    // the engine waits for its followers with no timeout (follower g on port + g − 1); a stop
    // while waiting ends the process cleanly
    let accepts = futures::future::try_join_all(
        (1..a.env.world)
            .map(|g| link::accept_once(a.env.master, args::follower_port(a.env.port, g))),
    );
    let mut streams = tokio::select! {
        r = accepts => r?,
        _ = sigterm.recv() => return Ok(0),
        _ = tokio::signal::ctrl_c() => return Ok(0),
    };
    // the first frame carries a payload sized by rank 0's pool
    let pad = usize::try_from((a.pool() + 1) * 4).unwrap_or(usize::MAX);
    let mut fields = vec![0u8; pad];
    fields[..4].copy_from_slice(&(l.tensors.len() as u32).to_le_bytes());
    fields[4..8].copy_from_slice(&(a.env.rdma_devices.len() as u32).to_le_bytes());
    let init = link::payload(kind::INIT, 0, &fields);
    let exchanged = async {
        let mut bodies = Vec::with_capacity(streams.len());
        for s in &mut streams {
            link::write_frame_async(s, &init).await?;
        }
        for s in &mut streams {
            let f = link::read_frame_async(s, 1 << 30).await?;
            let (k, step, body) = link::split_payload(&f)?;
            if k != kind::PARTIALS || step != 0 {
                return Err(LinkError::BadFrame);
            }
            bodies.push(body.to_vec());
        }
        Ok(bodies)
    }
    .await;
    let (proof, streams) = match exchanged {
        Ok(bodies) => {
            let mut all = l.partials.clone();
            for body in bodies {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let theirs = v["rdma_devices"].as_u64().unwrap_or(0) as usize;
                if theirs != a.env.rdma_devices.len() {
                    return Err(LinkError::BadInfo {
                        ours: a.env.rdma_devices.len(),
                        theirs,
                    }
                    .into());
                }
                let peer: Vec<Partial> =
                    serde_json::from_value(v["partials"].clone()).unwrap_or_default();
                all.extend(peer);
            }
            let tensors = l.tensors.clone();
            let world = a.env.world;
            let proof =
                tokio::task::spawn_blocking(move || split::prove(&ckpt, &tensors, &all, world))
                    .await
                    .unwrap_or_else(|e| ProofReport::failed(format!("the proof panicked: {e}")));
            (proof, streams)
        }
        Err(e) => (
            ProofReport::failed(format!("{} during the split proof exchange", e.detail())),
            Vec::new(),
        ),
    };
    let mut ids = vec![a.name.clone()];
    ids.extend(a.aliases.iter().cloned());
    let cfg = server::ServerConfig {
        served_ids: ids,
        keys,
        metrics_open: a.metrics_open,
        pool: a.pool(),
        max_tokens: a.max_tokens,
        thinking: a.thinking,
        vision: l.cfg.vision,
        parallel: a.parallel.unwrap_or(1),
        proof: proof.clone(),
        drafts: !a.no_drafts,
        perf,
        faults,
        fault_file: Some(faults::FAULT_FILE.into()),
    };
    let listener = server::bind(&a.host, a.port).await?;
    let _ = writeln!(
        out,
        "{{\"rank\": 0, \"serving\": \"{}:{}\", \"split_proof\": {}}}",
        a.host,
        a.port,
        proof.to_json()
    );
    let _ = out.flush();
    let state = server::AppState::new(cfg, streams, 0);
    let app = server::router(state.clone());
    // streamed chunks leave at once (no Nagle delay behind the client's delayed ACK)
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::select! {
        r = axum::serve(listener, app) => {
            r.map_err(StandinError::Runtime)?;
        }
        _ = sigterm.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    state.send_done().await;
    Ok(0)
}
