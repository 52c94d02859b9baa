//! Shared fixtures: a generated repository tree served by the testbed hub.
#![allow(dead_code, unreachable_pub)]

pub mod testbed;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use spark_deploy_testbed::hub_server::{HubOptions, HubServer};

pub const GATED_TOKEN: &str = "hf_testbed_gated_secret_4242";
pub const TINY: &str = "testorg/tiny";
pub const GATED: &str = "testorg/gated";
pub const EDGE: &str = "testorg/edge-cases";
pub const PRIVATE: &str = "testorg/private";
pub const PRIVATE_TOKEN: &str = "hf_testbed_private_secret_77";
pub const SHARD: &str = "model-00001-of-00002.safetensors";
pub const BIAS_A: &str = "model.layers.0.mlp.gate.bias_vl";
pub const BIAS_B: &str = "model.layers.1.mlp.gate.bias_vl";

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A valid safetensors file from `(name, dtype, shape)` in the given layout order.
pub fn safetensors(tensors: &[(&str, &str, &[usize])], seed: u64) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (i, (name, dtype, shape)) in tensors.iter().enumerate() {
        let el = match *dtype {
            "F32" | "I32" => 4,
            "BF16" | "F16" | "I16" => 2,
            _ => 1,
        };
        let n = shape.iter().product::<usize>() * el;
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + n]}),
        );
        data.extend(bytes(seed + i as u64, n));
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

pub struct Tree {
    pub dir: tempfile::TempDir,
    pub files: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
}

impl Tree {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, repo: &str, path: &str) -> &[u8] {
        &self.files[repo][path]
    }

    /// Byte range `[a, b)` of a tensor inside a safetensors blob.
    pub fn tensor_bytes<'a>(&self, data: &'a [u8], name: &str) -> &'a [u8] {
        let n = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
        let h: serde_json::Value = serde_json::from_slice(&data[8..8 + n]).unwrap();
        let o = &h[name]["data_offsets"];
        let (a, b) = (
            o[0].as_u64().unwrap() as usize,
            o[1].as_u64().unwrap() as usize,
        );
        &data[8 + n + a..8 + n + b]
    }
}

/// `testorg/tiny`: a >10 MB shard holding two `bias_vl` tensors between big ones, a second small
/// shard, JSON files (one duplicated), and a nested path. `testorg/gated`: two small files.
pub fn make_tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let mut files: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    let config = br#"{"model_type":"dsv41-test","hidden_size":64}"#.to_vec();
    let tiny = files.entry(TINY.into()).or_default();
    tiny.insert("config.json".into(), config.clone());
    tiny.insert("nested/copy-of-config.json".into(), config);
    tiny.insert("README.md".into(), b"# tiny\n".to_vec());
    tiny.insert(
        SHARD.into(),
        safetensors(
            &[
                ("model.embed.weight", "BF16", &[2048, 2800]),
                (BIAS_A, "F32", &[256]),
                ("model.layers.0.mlp.experts.weight", "BF16", &[512, 512]),
                (BIAS_B, "F32", &[256]),
                ("lm_head.weight", "BF16", &[64, 512]),
            ],
            11,
        ),
    );
    tiny.insert(
        "model-00002-of-00002.safetensors".into(),
        safetensors(&[("norm.weight", "F32", &[1000])], 99),
    );
    tiny.insert("nested/deeper/extra.bin".into(), bytes(5, 300_001));
    let gated = files.entry(GATED.into()).or_default();
    gated.insert("config.json".into(), br#"{"gated":true}"#.to_vec());
    gated.insert(
        "overlay.safetensors".into(),
        safetensors(&[("x", "F16", &[64, 64])], 3),
    );
    let edge = files.entry(EDGE.into()).or_default();
    edge.insert("empty.txt".into(), Vec::new());
    edge.insert("dir with space/a b#1.json".into(), b"{\"x\": 1}".to_vec());
    edge.insert("weights/100%.bin".into(), bytes(8, 4096));
    let private = files.entry(PRIVATE.into()).or_default();
    private.insert("config.json".into(), br#"{"private":true}"#.to_vec());
    for (repo, fs) in &files {
        for (rel, data) in fs {
            let p = dir.path().join(repo).join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, data).unwrap();
        }
    }
    Tree { dir, files }
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub fn start(tree: &Tree, lfs_redirect: bool) -> HubServer {
    start_with(
        tree,
        HubOptions {
            lfs_redirect,
            ..HubOptions::default()
        },
    )
}

/// The hub over `tree` with `opts` plus the tree's gated and private repositories.
pub fn start_with(tree: &Tree, opts: HubOptions) -> HubServer {
    let opts = HubOptions {
        gated: HashMap::from([(GATED.to_owned(), GATED_TOKEN.to_owned())]),
        private: HashMap::from([(PRIVATE.to_owned(), PRIVATE_TOKEN.to_owned())]),
        ..opts
    };
    HubServer::start(tree.root(), loopback(), opts).unwrap()
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(data))
}

/// Every regular file reachable under `dir` (following symlinks), by relative path.
pub fn read_tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn go(root: &Path, d: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                go(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    go(dir, dir, &mut out);
    out
}

pub fn blobs_dir(cache: &Path, repo: &str) -> PathBuf {
    cache
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("blobs")
}
