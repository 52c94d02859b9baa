//! Both ranks of the stand-in on loopback, without the testbed: a generated test-scale
//! checkpoint, rank files from the native builder, the `tf-standin` binary installed under the
//! engine's two names, rank 1 then rank 0 started with the engine's command lines, HTTP on
//! `127.0.0.1`. For tests and benchmarks of what talks to the API (`validate`, `bench`).
//!
//! Children are killed (and reaped) when the [`LoopbackPair`] is dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use spark_deploy_core::engine::tensorfold::inputs::{
    Cancelled, RankCacheOptions, RankCacheProgress, build_rank_cache, plan_rank_cache, token_map,
};

use crate::checkpoint::{CheckpointSpec, generate};

/// Why a pair could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    /// Generating the inputs failed.
    #[error("generating the stand-in's inputs in {dir}: {detail}")]
    Inputs {
        /// Where.
        dir: PathBuf,
        /// What failed.
        detail: String,
    },
    /// A rank did not start or did not print its line in time.
    #[error("rank {rank} did not {what} within {timeout_s} s; its stderr: {stderr}")]
    Start {
        /// The rank.
        rank: u32,
        /// What it should have done.
        what: &'static str,
        /// The wait.
        timeout_s: u64,
        /// Its stderr so far.
        stderr: String,
    },
    /// Spawning or a file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LoopbackError {
    let what = what.into();
    move |source| LoopbackError::Io { what, source }
}

/// The generated inputs both ranks read (one set serves any number of pairs).
#[derive(Debug)]
pub struct LoopbackInputs {
    dir: tempfile::TempDir,
    engine: PathBuf,
    model: PathBuf,
    original: PathBuf,
    kit: PathBuf,
    token_map: PathBuf,
    caches: [PathBuf; 2],
}

impl LoopbackInputs {
    /// Generates a small checkpoint (RoPE tables long enough for pools up to `max_pool`), its
    /// token map and both rank files in a temporary directory, and installs `binary` (a built
    /// `tf-standin`) as the engine.
    ///
    /// # Errors
    /// [`LoopbackError::Inputs`] when a generator or the rank-file builder fails.
    pub fn generate(binary: &Path, max_pool: u64) -> Result<Self, LoopbackError> {
        let dir = tempfile::tempdir().map_err(io("creating a temporary directory"))?;
        let root = dir.path().to_owned();
        let fail = |detail: String| LoopbackError::Inputs {
            dir: root.clone(),
            detail,
        };
        let mut spec = CheckpointSpec::small(7);
        spec.max_position = spec
            .max_position
            .max(usize::try_from(max_pool).unwrap_or(usize::MAX));
        let g = generate(&spec, &root.join("repos")).map_err(|e| fail(e.to_string()))?;
        let cache = root.join("cache");
        std::fs::create_dir_all(&cache)
            .map_err(io(format!("creating the cache dir {}", cache.display())))?;
        let tm = cache.join("dsv41_token_map.json");
        token_map::write_token_map(&g.model_dir, &tm).map_err(|e| fail(e.to_string()))?;
        let opts = RankCacheOptions {
            engine_shape_guard: false,
            chunk_bytes: 256 << 10,
            threads: 1,
            ..RankCacheOptions::default()
        };
        let mut caches = Vec::new();
        for rank in 0..2 {
            let out = root.join(format!("rank-cache-{rank}"));
            let plan =
                plan_rank_cache(&g.model_dir, rank, 2, &opts).map_err(|e| fail(e.to_string()))?;
            build_rank_cache(&plan, &out, &opts, &mut |_: &RankCacheProgress| {
                Ok::<(), Cancelled>(())
            })
            .map_err(|e| fail(e.to_string()))?;
            caches.push(out);
        }
        let engine = root.join("engine");
        super::install_engine_dir(binary, &engine).map_err(io("installing the engine"))?;
        let [c0, c1]: [PathBuf; 2] = caches
            .try_into()
            .map_err(|_| fail("two rank caches expected".into()))?;
        Ok(Self {
            dir,
            engine,
            model: g.model_dir,
            original: g.original_dir,
            kit: g.kit_dir,
            token_map: tm,
            caches: [c0, c1],
        })
    }
}

impl LoopbackInputs {
    /// The directory holding everything below.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The engine directory (the stand-in under both engine names).
    #[must_use]
    pub fn engine(&self) -> &Path {
        &self.engine
    }

    /// The EXL3 checkpoint (`MODEL_DIR`).
    #[must_use]
    pub fn model(&self) -> &Path {
        &self.model
    }

    /// The original model (Engram tables, `bias_vl`).
    #[must_use]
    pub fn original(&self) -> &Path {
        &self.original
    }

    /// The kernel kit.
    #[must_use]
    pub fn kit(&self) -> &Path {
        &self.kit
    }

    /// The token map.
    #[must_use]
    pub fn token_map(&self) -> &Path {
        &self.token_map
    }

    /// Rank `rank`'s rank-cache directory (0 or 1).
    #[must_use]
    pub fn cache(&self, rank: usize) -> &Path {
        &self.caches[rank.min(1)]
    }

    /// Builds every rank's file for `world` ranks (each in its own directory, as each node holds
    /// only its own) from the same checkpoint, with the native builder; the directories in rank
    /// order.
    ///
    /// # Errors
    /// [`LoopbackError::Inputs`] when the plan or the builder fails (a dimension that does not
    /// split into `world` parts).
    pub fn rank_caches_at(&self, world: usize) -> Result<Vec<PathBuf>, LoopbackError> {
        let fail = |detail: String| LoopbackError::Inputs {
            dir: self.dir.path().to_owned(),
            detail,
        };
        let opts = RankCacheOptions {
            engine_shape_guard: false,
            chunk_bytes: 256 << 10,
            threads: 1,
            ..RankCacheOptions::default()
        };
        (0..world)
            .map(|rank| {
                let out = self.dir.path().join(format!("rank-cache-{rank}of{world}"));
                if !out.is_dir() {
                    let plan = plan_rank_cache(&self.model, rank, world, &opts)
                        .map_err(|e| fail(e.to_string()))?;
                    build_rank_cache(&plan, &out, &opts, &mut |_: &RankCacheProgress| {
                        Ok::<(), Cancelled>(())
                    })
                    .map_err(|e| fail(e.to_string()))?;
                }
                Ok(out)
            })
            .collect()
    }
}

/// How a pair is started.
#[derive(Debug, Clone)]
pub struct LoopbackOptions {
    /// `--context` / `--pool`.
    pub pool: u64,
    /// `--parallel`.
    pub parallel: u32,
    /// `--max-tokens`.
    pub max_tokens: u64,
    /// `--name`.
    pub served_name: String,
    /// The API key rank 0 accepts (written to a `label: key` file, mode 0600).
    pub key: String,
    /// Extra environment for rank 0 (`TF_STANDIN_*`).
    pub env: Vec<(String, String)>,
    /// How long each rank may take to print its line.
    pub timeout: Duration,
}

impl Default for LoopbackOptions {
    fn default() -> Self {
        Self {
            pool: 65_536,
            parallel: 4,
            max_tokens: 2048,
            served_name: "DeepSeek-V4.1-Flash-1017".into(),
            key: "sk-loopback".into(),
            env: Vec::new(),
            timeout: Duration::from_secs(60),
        }
    }
}

/// A child killed on drop, its stdout lines on a channel, its stderr in a file.
#[derive(Debug)]
struct Rank {
    child: Child,
    lines: Receiver<String>,
    stderr: PathBuf,
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Rank {
    fn spawn(mut cmd: Command, stderr: PathBuf) -> Result<Self, LoopbackError> {
        let err = std::fs::File::create(&stderr)
            .map_err(io(format!("creating the stderr file {}", stderr.display())))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err));
        let mut child = cmd.spawn().map_err(io("starting a stand-in rank"))?;
        let (tx, lines) = channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines() {
                    let Ok(l) = l else { break };
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Self {
            child,
            lines,
            stderr,
        })
    }

    fn wait_for(
        &self,
        rank: u32,
        key: &str,
        what: &'static str,
        timeout: Duration,
    ) -> Result<(), LoopbackError> {
        let end = Instant::now() + timeout;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(&format!("\"{key}\"")) => return Ok(()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        Err(LoopbackError::Start {
            rank,
            what,
            timeout_s: timeout.as_secs(),
            stderr: std::fs::read_to_string(&self.stderr).unwrap_or_default(),
        })
    }
}

/// Both ranks, serving.
#[derive(Debug)]
pub struct LoopbackPair {
    rank0: Rank,
    _rank1: Rank,
    /// The HTTP port on 127.0.0.1.
    pub port: u16,
    /// The API key file (`label: key`, mode 0600).
    pub key_file: PathBuf,
    /// The served model id.
    pub served_name: String,
}

fn free_port() -> Result<u16, LoopbackError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(io("finding a free port"))
}

impl LoopbackPair {
    /// Starts rank 1, then rank 0, and waits until rank 0 serves.
    ///
    /// # Errors
    /// [`LoopbackError`] when a rank fails to start or print its line in time.
    pub fn start(inputs: &LoopbackInputs, opts: &LoopbackOptions) -> Result<Self, LoopbackError> {
        let tp = free_port()?;
        let http = free_port()?;
        let root = inputs.dir.path();
        let run = root.join(format!("run-{http}"));
        std::fs::create_dir_all(&run)
            .map_err(io(format!("creating the run dir {}", run.display())))?;
        let key_file = run.join("api-key");
        std::fs::write(&key_file, format!("spark-deploy: {}\n", opts.key))
            .and_then(|()| {
                std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))
            })
            .map_err(io(format!("writing {}", key_file.display())))?;
        let pool = opts.pool.to_string();
        let mut c1 = Command::new(inputs.engine.join(super::RANK1_NAME));
        c1.env_clear()
            .env("TF_DS_REPLAY_FLOOR", "1")
            .env(
                super::CONNECT_TIMEOUT_ENV,
                opts.timeout.as_secs().to_string(),
            )
            .arg(&inputs.model)
            .arg(&inputs.caches[1])
            .args(["1", "2", "127.0.0.1", &tp.to_string()])
            .arg(&inputs.kit)
            .arg("--engram")
            .arg(&inputs.original)
            .arg("--token-map")
            .arg(&inputs.token_map)
            .args(["--pool", &pool]);
        let rank1 = Rank::spawn(c1, run.join("rank1.stderr"))?;
        rank1.wait_for(1, "loaded_s", "print its loaded line", opts.timeout)?;
        let mut c0 = Command::new(inputs.engine.join(super::RANK0_NAMES[0]));
        c0.env_clear()
            .env("TF_DS_REPLAY_FLOOR", "1")
            .env("TF_TP_WORLD", "2")
            .env("TF_TP_MASTER", "127.0.0.1")
            .env("TF_TP_PORT", tp.to_string())
            .env("TF_DS_RANK_CACHE", &inputs.caches[0])
            .env("TF_DS_KIT", &inputs.kit)
            .env("TENSORFOLD_CUDA_KERNELS", inputs.kit.join("aot"))
            .env("TF_DS_ENGRAM", &inputs.original)
            .env("TF_DS_TOKEN_MAP", &inputs.token_map)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .arg("serve")
            .arg(&inputs.model)
            .args(["--host", "127.0.0.1", "--port", &http.to_string()])
            .args(["--name", &opts.served_name])
            .arg("--api-key-file")
            .arg(&key_file)
            .args(["--context", &pool])
            .args(["--parallel", &opts.parallel.to_string()])
            .args(["--max-tokens", &opts.max_tokens.to_string()]);
        let rank0 = Rank::spawn(c0, run.join("rank0.stderr"))?;
        rank0.wait_for(0, "serving", "serve HTTP", opts.timeout)?;
        Ok(Self {
            rank0,
            _rank1: rank1,
            port: http,
            key_file,
            served_name: opts.served_name.clone(),
        })
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Rank 0's stderr so far.
    #[must_use]
    pub fn rank0_stderr(&self) -> String {
        std::fs::read_to_string(&self.rank0.stderr).unwrap_or_default()
    }

    /// A spark-deploy config (TOML) whose API is this pair: `serving.host`/`port`, the served
    /// name, the pool and streams, `state_dir` and the key file.
    #[must_use]
    pub fn config_toml(&self, state_dir: &Path, pool: u64, parallel: u32) -> String {
        format!(
            "[deployment]\nstate_dir = {state:?}\n\n[model]\nserved_name = {name:?}\n\n[serving]\nhost = \"127.0.0.1\"\nport = {port}\ncontext = {pool}\nparallel = {parallel}\napi_key_file = {key:?}\n",
            state = state_dir.display().to_string(),
            name = self.served_name,
            port = self.port,
            key = self.key_file.display().to_string(),
        )
    }
}
