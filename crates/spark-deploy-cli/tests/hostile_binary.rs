//! Hostile binary inputs, generated: safetensors shards (`rank-cache index-only` on a checkpoint
//! with one shard replaced), rank files (`rank-cache verify --checksums` on a cache with the rank
//! file or its sidecar replaced) and host-fact outputs (`/proc/meminfo`, `df -Pk`, exports,
//! `nvidia-smi -q`, the sysfs dump: no CLI entry reads them from a file, so through the core's
//! parsers and preflight decisions). Every case must end in a clear error: exit 5 with a message
//! naming the shard, tensor or rank file (no panic), or a failed preflight row naming the node;
//! and nothing outside the case's own directory may change.
#![cfg(feature = "testbed")]
// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use serde_json::{Value, json};
use spark_deploy_core::engine::tensorfold::inputs::{
    RankCacheOptions, build_rank_cache, plan_rank_cache, sidecar_path,
};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate};

/// The tensor whose shard is replaced, and whose header entry is edited.
const TENSOR: &str = "layers.1.attn.wq_a.trellis";

/// A small generated checkpoint, rank 0 of 2 built from it, and the bytes the cases start from.
struct Base {
    root: tempfile::TempDir,
    model: PathBuf,
    shard: String,
    shard_bytes: Vec<u8>,
    header_len: usize,
    rank_dir: PathBuf,
    rank_name: String,
    rank_bytes: Vec<u8>,
    sidecar: Vec<u8>,
    data_bytes: u64,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let root = tempfile::tempdir().unwrap();
        let g = generate(&CheckpointSpec::small(5), &root.path().join("repos")).unwrap();
        let index: Value = serde_json::from_slice(
            &std::fs::read(g.model_dir.join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let shard = index["weight_map"][TENSOR].as_str().unwrap().to_owned();
        let shard_bytes = std::fs::read(g.model_dir.join(&shard)).unwrap();
        let header_len = u64::from_le_bytes(shard_bytes[..8].try_into().unwrap()) as usize;
        let opts = RankCacheOptions {
            engine_shape_guard: false,
            chunk_bytes: 64 << 10,
            ..RankCacheOptions::default()
        };
        let plan = plan_rank_cache(&g.model_dir, 0, 2, &opts).unwrap();
        let rank_dir = root.path().join("rank-cache");
        let file = build_rank_cache(&plan, &rank_dir, &opts, &mut |_| Ok(())).unwrap();
        Base {
            model: g.model_dir,
            shard,
            shard_bytes,
            header_len,
            rank_name: plan.file_name.clone(),
            rank_bytes: std::fs::read(&file).unwrap(),
            sidecar: std::fs::read(sidecar_path(&file)).unwrap(),
            data_bytes: plan.data_bytes,
            rank_dir,
            root,
        }
    })
}

/// Every file below `dir` with its length and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.insert(e.path(), (m.len(), m.modified().unwrap()));
        }
    }
    out
}

/// One hostile input: the bytes that replace a file, and what the error must name.
struct Case {
    name: String,
    bytes: Vec<u8>,
    /// The error names at least one of these.
    needles: Vec<String>,
}

fn case(name: impl Into<String>, bytes: Vec<u8>, needles: &[&str]) -> Case {
    Case {
        name: name.into(),
        bytes,
        needles: needles.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// Runs the CLI in `dir` (its own HOME there too) and checks a clear failure, and that the case
/// directory holds afterwards exactly what it held before.
fn expect_clear_failure(dir: &Path, args: &[&str], c: &Case) {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let before = snapshot(dir);
    let o = Command::new(env!("CARGO_BIN_EXE_spark-deploy"))
        .current_dir(dir)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}: exit {:?}, stderr: {err}",
        c.name,
        o.status
    );
    assert!(!err.contains("panicked"), "{}: {err}", c.name);
    assert!(
        c.needles.iter().any(|n| err.contains(n.as_str())),
        "{}: the error names none of {:?}: {err}",
        c.name,
        c.needles
    );
    assert_eq!(
        snapshot(dir),
        before,
        "{}: the case directory changed",
        c.name
    );
}

/// Runs `cases` on a few threads; each gets its own directory under the base's root.
fn run_cases<T: Sync>(kind: &str, cases: &[T], run: impl Fn(&Path, &T) + Sync) {
    let b = base();
    let work = b.root.path().join(kind);
    std::fs::create_dir_all(&work).unwrap();
    let watched = [b.model.clone(), b.rank_dir.clone()];
    let before: Vec<_> = watched.iter().map(|d| snapshot(d)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(c) = cases.get(i) else { return };
                    let dir = work.join(format!("case-{i}"));
                    std::fs::create_dir_all(&dir).unwrap();
                    run(&dir, c);
                }
            });
        }
    });
    let after: Vec<_> = watched.iter().map(|d| snapshot(d)).collect();
    assert_eq!(before, after, "{kind}: the shared fixtures changed");
}

// ---- safetensors shards ------------------------------------------------------------------------

/// A shard of `json` as its header and the base shard's data section.
fn shard_with_json(json: &[u8]) -> Vec<u8> {
    let b = base();
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json);
    out.extend_from_slice(&b.shard_bytes[8 + b.header_len..]);
    out
}

/// The base shard with `TENSOR`'s header entry edited (the data section kept).
fn shard_with_edit(edit: impl Fn(&mut Value)) -> Vec<u8> {
    let b = base();
    let mut header: Value = serde_json::from_slice(&b.shard_bytes[8..8 + b.header_len]).unwrap();
    edit(&mut header[TENSOR]);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    shard_with_json(&text)
}

fn tensor_field(v: &Value, i: usize) -> u64 {
    v["shape"][i].as_u64().unwrap()
}

fn safetensors_cases() -> Vec<Case> {
    let b = base();
    let (s, t) = (b.shard.as_str(), TENSOR);
    let total = b.shard_bytes.len();
    let n = b.header_len;
    let mut cases = Vec::new();
    for cut in [
        0,
        1,
        7,
        8,
        9,
        8 + n - 1,
        8 + n,
        8 + n + 1,
        total / 2,
        total - 1,
    ] {
        cases.push(case(
            format!("shard truncated to {cut} bytes"),
            b.shard_bytes[..cut].to_vec(),
            &[s],
        ));
    }
    for len in [
        0u64,
        1,
        7,
        n as u64 - 1,
        n as u64 + 1,
        n as u64 + 8,
        total as u64,
        total as u64 - 7,
        100_000_001,
        1 << 32,
        1 << 63,
        u64::MAX,
    ] {
        let mut bytes = b.shard_bytes.clone();
        bytes[..8].copy_from_slice(&len.to_le_bytes());
        cases.push(case(format!("header length {len}"), bytes, &[s]));
    }
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    for (what, json) in [
        ("empty header", b"".to_vec()),
        ("unclosed object", b"{".to_vec()),
        ("a list", b"[]".to_vec()),
        ("null", b"null".to_vec()),
        ("a number", b"1".to_vec()),
        ("a string", b"\"x\"".to_vec()),
        ("a tensor that is a number", b"{\"a\":1}".to_vec()),
        (
            "invalid UTF-8",
            vec![b'{', b'"', 0xff, 0xfe, b'"', b':', b'1', b'}'],
        ),
        ("no tensors at all", b"{}".to_vec()),
        ("nesting 300 deep", deep.into_bytes()),
        ("an empty tensor entry", b"{\"t\": {}}".to_vec()),
        (
            "metadata that is a number",
            b"{\"__metadata__\": 5}".to_vec(),
        ),
        (
            "metadata with a number",
            b"{\"__metadata__\": {\"a\": 1}}".to_vec(),
        ),
        ("NUL bytes", vec![0u8; 16]),
        ("spaces only", vec![b' '; 24]),
    ] {
        cases.push(case(
            format!("header JSON: {what}"),
            shard_with_json(&json),
            &[s],
        ));
    }
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit); 33] = [
        ("dtype Q4", |v| v["dtype"] = "Q4".into()),
        ("dtype empty", |v| v["dtype"] = "".into()),
        ("dtype a number", |v| v["dtype"] = 5.into()),
        ("dtype null", |v| v["dtype"] = Value::Null),
        ("dtype lower case", |v| v["dtype"] = "i16".into()),
        ("dtype with a space", |v| v["dtype"] = "I16 ".into()),
        ("dtype of another size", |v| v["dtype"] = "F64".into()),
        ("dtype I8 with the words doubled", |v| {
            v["dtype"] = "I8".into();
            let w = tensor_field(v, 2);
            v["shape"][2] = (w * 2).into();
        }),
        ("dtype F16, same shape", |v| v["dtype"] = "F16".into()),
        ("dtype BF16, same shape", |v| v["dtype"] = "BF16".into()),
        ("shape empty", |v| v["shape"] = json!([])),
        ("shape negative", |v| v["shape"] = json!([-1, 2])),
        ("shape fractional", |v| v["shape"] = json!([1.5])),
        ("shape of strings", |v| v["shape"] = json!(["a"])),
        ("shape past u64", |v| {
            v["shape"] = serde_json::from_str("[18446744073709551616]").unwrap();
        }),
        (
            "shape [2^62, 4, 0]: zero bytes, offsets say otherwise",
            |v| {
                v["shape"] = json!([1u64 << 62, 4, 0]);
            },
        ),
        ("shape of 2^65 elements", |v| {
            v["shape"] = json!([1u64 << 32, 1u64 << 32, 2]);
        }),
        ("shape of 2^64 bits", |v| {
            v["shape"] = json!([1u64 << 63, 2])
        }),
        ("five dims, same bytes", |v| {
            let (k, n, w) = (tensor_field(v, 0), tensor_field(v, 1), tensor_field(v, 2));
            v["shape"] = json!([1, 1, k, n, w]);
        }),
        ("K and N swapped", |v| {
            let (k, n, w) = (tensor_field(v, 0), tensor_field(v, 1), tensor_field(v, 2));
            v["shape"] = json!([n, k, w]);
        }),
        ("words halved, N doubled", |v| {
            let (k, n, w) = (tensor_field(v, 0), tensor_field(v, 1), tensor_field(v, 2));
            v["shape"] = json!([k, n * 2, w / 2]);
        }),
        ("K doubled, words halved", |v| {
            let (k, n, w) = (tensor_field(v, 0), tensor_field(v, 1), tensor_field(v, 2));
            v["shape"] = json!([k * 2, n, w / 2]);
        }),
        ("offsets one number", |v| v["data_offsets"] = json!([0])),
        ("offsets end before begin", |v| {
            let (b0, e0) = offsets(v);
            v["data_offsets"] = json!([e0, b0]);
        }),
        ("offsets negative", |v| v["data_offsets"] = json!([-1, 5])),
        ("offsets at 2^64 - 1", |v| {
            v["data_offsets"] = json!([u64::MAX, u64::MAX]);
        }),
        ("offsets shifted by one", |v| {
            let (b0, e0) = offsets(v);
            v["data_offsets"] = json!([b0 + 1, e0 + 1]);
        }),
        ("offsets two bytes longer", |v| {
            let (b0, e0) = offsets(v);
            v["data_offsets"] = json!([b0, e0 + 2]);
        }),
        ("offsets to 2^64 - 1", |v| {
            let (b0, _) = offsets(v);
            v["data_offsets"] = json!([b0, u64::MAX]);
        }),
        ("no dtype", |v| {
            v.as_object_mut().unwrap().remove("dtype");
        }),
        ("no shape", |v| {
            v.as_object_mut().unwrap().remove("shape");
        }),
        ("no offsets", |v| {
            v.as_object_mut().unwrap().remove("data_offsets");
        }),
        ("entry a list", |v| *v = json!([1, 2, 3])),
    ];
    for (what, edit) in edits {
        cases.push(case(
            format!("tensor entry: {what}"),
            shard_with_edit(edit),
            &[s, t],
        ));
    }
    // The tensor renamed: the header is valid, but the index json and the plan need it.
    let b2 = base();
    let mut header: Value = serde_json::from_slice(&b2.shard_bytes[8..8 + b2.header_len]).unwrap();
    let entry = header.as_object_mut().unwrap().remove(TENSOR).unwrap();
    header["renamed"] = entry;
    cases.push(case(
        "tensor renamed",
        shard_with_json(&serde_json::to_vec(&header).unwrap()),
        &[t],
    ));
    cases
}

fn offsets(v: &Value) -> (u64, u64) {
    (
        v["data_offsets"][0].as_u64().unwrap(),
        v["data_offsets"][1].as_u64().unwrap(),
    )
}

#[test]
fn hostile_safetensors_shards_are_refused_naming_the_shard_or_tensor() {
    let b = base();
    let cases = safetensors_cases();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    run_cases("safetensors", &cases, |dir, c| {
        let model = dir.join("model");
        std::fs::create_dir_all(&model).unwrap();
        for e in std::fs::read_dir(&b.model).unwrap() {
            let e = e.unwrap();
            if e.file_name().to_str() != Some(b.shard.as_str()) {
                std::fs::hard_link(e.path(), model.join(e.file_name())).unwrap();
            }
        }
        std::fs::write(model.join(&b.shard), &c.bytes).unwrap();
        let (m, out) = (model.display().to_string(), dir.join("out"));
        let out = out.display().to_string();
        expect_clear_failure(
            dir,
            &[
                "rank-cache",
                "index-only",
                &m,
                &out,
                "0",
                "2",
                "--test-scale",
            ],
            c,
        );
    });
}

// ---- rank files --------------------------------------------------------------------------------

/// The base rank file with its index replaced by `index` (data section and footer kept).
fn rank_with_index(index: &[u8]) -> Vec<u8> {
    let b = base();
    let d = b.data_bytes as usize;
    let mut out = b.rank_bytes[..d].to_vec();
    out.extend_from_slice(index);
    out.extend_from_slice(&b.rank_bytes[b.rank_bytes.len() - 16..]);
    out
}

fn base_index() -> Value {
    let b = base();
    let d = b.data_bytes as usize;
    serde_json::from_slice(&b.rank_bytes[d..b.rank_bytes.len() - 16]).unwrap()
}

fn index_text(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// How a rank-file case lays out its cache directory.
enum Layout {
    /// The rank file replaced by the case's bytes (the sidecar kept).
    File,
    /// The sidecar replaced by the case's bytes (the rank file kept).
    Sidecar,
    /// The rank file under another name.
    Renamed,
    /// The rank file and a second one.
    Twice,
    /// A directory under the rank file's name.
    Directory,
    /// A symlink to the rank file under its name.
    Symlink,
}

fn rank_cases() -> Vec<(Layout, Case)> {
    let b = base();
    let name = b.rank_name.as_str();
    let len = b.rank_bytes.len();
    let d = b.data_bytes as usize;
    let mut cases = Vec::new();
    let file = |c: Case| (Layout::File, c);
    for cut in [0, 1, 15, 16, 17, d, d + 1, len - 1, len - 8, len - 16] {
        cases.push(file(case(
            format!("rank file truncated to {cut} bytes"),
            b.rank_bytes[..cut].to_vec(),
            &[name],
        )));
    }
    for k in [0, 3, 5, 7] {
        let mut bytes = b.rank_bytes.clone();
        bytes[len - 8 + k] ^= 0x20;
        cases.push(file(case(
            format!("magic byte {k} changed"),
            bytes,
            &[name],
        )));
    }
    for at in [
        0u64,
        1,
        d as u64 - 1,
        d as u64 + 1,
        len as u64 - 16,
        len as u64 - 15,
        len as u64,
        u64::MAX,
        1 << 63,
    ] {
        let mut bytes = b.rank_bytes.clone();
        bytes[len - 16..len - 8].copy_from_slice(&at.to_le_bytes());
        cases.push(file(case(format!("footer offset {at}"), bytes, &[name])));
    }
    let ix = base_index();
    let first = |f: fn(&mut Value)| {
        let mut v = ix.clone();
        f(&mut v[0]);
        index_text(&v)
    };
    let mut spaced = b"[ ".to_vec();
    spaced.extend_from_slice(&index_text(&ix)[1..]);
    let mut dup = ix.clone();
    dup[1][0] = dup[0][0].clone();
    let mut extra = ix.clone();
    extra
        .as_array_mut()
        .unwrap()
        .push(json!(["extra|None", "uint8", [0], b.data_bytes, 0]));
    for (what, index) in [
        ("empty", b"".to_vec()),
        ("unclosed", b"[".to_vec()),
        ("an object", b"{}".to_vec()),
        ("an empty row", b"[[]]".to_vec()),
        ("null", b"null".to_vec()),
        ("invalid UTF-8", vec![b'[', b'"', 0xff, b'"', b']']),
        (
            "a valid index of another plan",
            b"[[\"a\", \"float32\", [2], 0, 8]]".to_vec(),
        ),
        ("the same rows, other spacing", spaced),
        (
            "first row one byte longer",
            first(|r| r[4] = (r[4].as_u64().unwrap() + 1).into()),
        ),
        ("first row at offset 1", first(|r| r[3] = 1.into())),
        (
            "first row of five dims",
            first(|r| r[2] = json!([1, 1, 1, 1, 1])),
        ),
        ("first row float64", first(|r| r[1] = "float64".into())),
        (
            "first row of four fields",
            first(|r| {
                r.as_array_mut().unwrap().pop();
            }),
        ),
        (
            "first row of 2^126 elements",
            first(|r| r[2] = json!([1u64 << 63, 1u64 << 63])),
        ),
        (
            "first row at a negative offset",
            first(|r| r[3] = json!(-8)),
        ),
        (
            "first row of 2^64 - 1 bytes",
            first(|r| r[4] = json!(u64::MAX)),
        ),
        ("a key twice", index_text(&dup)),
        ("one row more", index_text(&extra)),
    ] {
        cases.push(file(case(
            format!("index: {what}"),
            rank_with_index(&index),
            &[name],
        )));
    }
    for k in 0..12u64 {
        let at = if k == 11 {
            d - 1
        } else {
            (k * b.data_bytes / 11) as usize
        };
        let mut bytes = b.rank_bytes.clone();
        bytes[at] ^= 1 << (k % 8);
        cases.push(file(case(
            format!("data byte {at} flipped"),
            bytes,
            &["CRC-32"],
        )));
    }
    let side: Value = serde_json::from_slice(&b.sidecar).unwrap();
    let mut tampered = side.clone();
    let hex = tampered["checksums"]["blocks"].as_str().unwrap().to_owned();
    let flipped = if hex.starts_with('0') { "1" } else { "0" };
    tampered["checksums"]["blocks"] = format!("{flipped}{}", &hex[1..]).into();
    cases.push((
        Layout::Sidecar,
        case(
            "sidecar: a recorded checksum changed",
            tampered.to_string().into_bytes(),
            &["CRC-32"],
        ),
    ));
    cases.push((
        Layout::Renamed,
        case("renamed", b.rank_bytes.clone(), &["the file is named"]),
    ));
    cases.push((
        Layout::Twice,
        case(
            "two files for the rank",
            b.rank_bytes.clone(),
            &["remove all but one"],
        ),
    ));
    cases.push((
        Layout::Directory,
        case(
            "a directory under the name",
            Vec::new(),
            &["holds no rank0of2"],
        ),
    ));
    cases.push((
        Layout::Symlink,
        case(
            "a symlink under the name",
            b.rank_bytes.clone(),
            &["holds no rank0of2"],
        ),
    ));
    cases
}

#[test]
fn hostile_rank_files_are_refused_naming_the_file() {
    let b = base();
    let cases = rank_cases();
    assert!(cases.len() >= 50, "{} cases", cases.len());
    run_cases("rank-files", &cases, |dir, (layout, c)| {
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let file = out.join(&b.rank_name);
        let side = sidecar_path(&file);
        let other = out.join("rank0of2-00000000000000000000.bin");
        match layout {
            Layout::File => {
                std::fs::write(&file, &c.bytes).unwrap();
                std::fs::write(&side, &b.sidecar).unwrap();
            }
            Layout::Sidecar => {
                std::fs::write(&file, &b.rank_bytes).unwrap();
                std::fs::write(&side, &c.bytes).unwrap();
            }
            Layout::Renamed => std::fs::write(&other, &c.bytes).unwrap(),
            Layout::Twice => {
                std::fs::write(&file, &c.bytes).unwrap();
                std::fs::write(&other, &c.bytes).unwrap();
            }
            Layout::Directory => std::fs::create_dir(&file).unwrap(),
            Layout::Symlink => {
                let real = dir.join("elsewhere.bin");
                std::fs::write(&real, &c.bytes).unwrap();
                std::os::unix::fs::symlink(&real, &file).unwrap();
            }
        }
        let (m, o) = (b.model.display().to_string(), out.display().to_string());
        expect_clear_failure(
            dir,
            &[
                "rank-cache",
                "verify",
                &m,
                &o,
                "0",
                "2",
                "--test-scale",
                "--checksums",
            ],
            c,
        );
    });
}

// ---- host facts (no CLI entry reads them from a file: the core's parsers and decisions) ---------

mod host {
    use super::*;
    use spark_deploy_core::preflight::decide::{
        DiskFacts, DockerProbe, NodeFacts, Settings, decide, df_free_bytes,
    };
    use spark_deploy_core::preflight::exports::check_exports;
    use spark_deploy_core::preflight::meminfo::{mem_available, mem_total};
    use spark_deploy_core::preflight::report::{Check, Verdict};
    use spark_deploy_core::preflight::roce::{detect, parse_route};
    use spark_deploy_core::preflight::smi::parse_clocks;
    use spark_deploy_core::preflight::sysfs_dump::SysfsDump;

    const NODE: &str = "spark-b";

    fn settings() -> Settings {
        Settings {
            runtime: "nvidia".into(),
            min_avail_gib: 100,
            context: 1_048_576,
            max_tokens: 32_768,
            max_pool: 1_114_063,
            memory: spark_deploy_core::engine::limits::TENSORFOLD_DSV41.memory,
            engine_commit: "0123456789abcdef0123456789abcdef01234567".into(),
            base_image: "nvcr.io/nvidia/pytorch:25.09-py3".into(),
            nfs_export: None,
        }
    }

    fn node() -> NodeFacts {
        let mut f = NodeFacts::new(NODE, 1, "ops@spark-b");
        f.reach = Ok(());
        f.docker = DockerProbe::Reachable;
        f
    }

    /// The failed row of `check` for the node, naming it (in the row or its remedy).
    fn failed_row(f: NodeFacts, check: Check, case: &str) -> String {
        let d = decide(&settings(), &[f]);
        let r = d
            .results
            .iter()
            .find(|r| r.check == check && r.node == NODE)
            .unwrap_or_else(|| panic!("{case}: no {check:?} row: {:#?}", d.results));
        assert_eq!(r.verdict, Verdict::Fail, "{case}: {r:?}");
        let remedy = r.remedy.clone().unwrap_or_default();
        assert!(!remedy.is_empty(), "{case}: no remedy: {r:?}");
        format!("{} {remedy}", r.observed)
    }

    fn hostile_texts(field: &str) -> Vec<(String, String)> {
        let big = "9".repeat(40);
        vec![
            ("empty".into(), String::new()),
            (
                "binary".into(),
                String::from_utf8_lossy(&[0xff, 0, 1, 0x80, b'\n', 0]).into(),
            ),
            ("no colon".into(), format!("{field} 5 kB\n")),
            ("not a number".into(), format!("{field}: abc kB\n")),
            ("negative".into(), format!("{field}: -5 kB\n")),
            ("exponent".into(), format!("{field}: 1e9 kB\n")),
            (
                "2^64 kB".into(),
                format!("{field}: 18446744073709551616 kB\n"),
            ),
            (
                "2^64 bytes in kB".into(),
                format!("{field}: {} kB\n", u64::MAX / 1024 + 1),
            ),
            ("u64::MAX kB".into(), format!("{field}: {} kB\n", u64::MAX)),
            ("40 digits".into(), format!("{field}: {big} kB\n")),
            ("NUL inside".into(), format!("{field}: 12\u{0}34 kB\n")),
        ]
    }

    #[test]
    fn hostile_meminfo_is_unreadable_and_fails_the_memory_row_naming_the_node() {
        let cases = hostile_texts("MemAvailable");
        assert_eq!(cases.len(), 11);
        for (what, text) in cases {
            assert_eq!(mem_available(&text), None, "{what}");
            assert_eq!(
                mem_total(&text.replace("MemAvailable", "MemTotal")),
                None,
                "{what}"
            );
            let mut f = node();
            f.meminfo = Ok(text);
            let said = failed_row(f, Check::MemoryAvailable, &what);
            assert!(
                said.contains("MemAvailable") && said.contains(NODE),
                "{what}: {said}"
            );
        }
    }

    #[test]
    fn hostile_df_is_unreadable_and_fails_the_disk_row_naming_the_directory() {
        let dir = "/data/spark-deploy";
        let cases = [
            String::new(),
            "garbage".into(),
            "/dev/x 1 2\n".into(),
            "/dev/x 1 2 abc 3% /\n".into(),
            "/dev/x 1 2 -5 3% /\n".into(),
            format!("/dev/x 1 2 {} 3% /\n", u64::MAX),
            format!("/dev/x 1 2 {} 3% /\n", u64::MAX / 1024 + 1),
            "/dev/x 1 2 18446744073709551616 3% /\n".into(),
            "/dev/x 1 2 1.5 3% /\n".into(),
            "\u{0}\u{0}\u{0}\u{0}\n".into(),
        ];
        for text in cases {
            assert_eq!(df_free_bytes(&text), None, "{text:?}");
            let mut f = node();
            f.disks = vec![DiskFacts {
                dir: dir.into(),
                df: Ok(text.clone()),
                missing: Vec::new(),
                linked_from: None,
            }];
            let said = failed_row(f, Check::Disk, &text);
            assert!(said.contains(dir), "{text:?}: {said}");
        }
    }

    #[test]
    fn hostile_exports_never_grant_a_read_only_export() {
        let path = "/data/hf";
        let client: Ipv4Addr = "192.168.100.2".parse().unwrap();
        let cases = [
            "",
            "/data/hf(rw)",
            "/data/hf 192.168.100.2(rw,sync)",
            "/data/hf 192.168.100.0/33(ro)",
            "/data/hf 192.168.100.0/-1(ro)",
            "# /data/hf 192.168.100.2(ro)",
            "/data/hfx 192.168.100.2(ro)",
            "/data/h 192.168.100.2(ro)",
            "/data/hf 192.168.100.3(ro) 10.0.0.0/8(ro)",
            "\u{0}/data/hf 192.168.100.2(ro)",
            "/data/hf 192.168.100.256(ro)",
        ];
        for text in cases {
            let e = check_exports(text, path, client).unwrap_err();
            assert!(
                e.contains(path) || e.contains("read-write"),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn hostile_nvidia_smi_clocks_are_unknown_never_zero() {
        let cases = [
            "GPU 00000000:01:00.0\n    Max Clocks\n        Graphics : -1 MHz\n        SM : 1e3 MHz\n        Memory : 99999999999 MHz\n",
            "GPU 00000000:01:00.0\n    Max Clocks\n        Graphics : N/A\n        SM : Not Found\n        Memory : MHz\n",
            "GPU 00000000:01:00.0\n    Max Clocks\n        Graphics : 0x10 MHz\n        SM : 18446744073709551616 MHz\n        Memory : \u{0} MHz\n",
            "GPU \n    Applications Clocks\n        Graphics : abc\n        Memory : 1 2 MHz\n",
            "GPU 0\n  Max Clocks\nGraphics : 1980 MHz\n",
            "GPU 0\u{ff}\u{fe}\n    Max Clocks\n        Graphics : 4294967296 MHz\n",
        ];
        for text in cases {
            let gpus = parse_clocks(text);
            assert!(!gpus.is_empty(), "{text:?}");
            for g in gpus {
                for v in [
                    g.max_graphics,
                    g.max_sm,
                    g.max_memory,
                    g.app_graphics,
                    g.app_memory,
                ] {
                    assert_eq!(v, None, "{text:?}: {g:?}");
                }
            }
        }
    }

    #[test]
    fn hostile_sysfs_dumps_fail_roce_detection_naming_the_device() {
        let route = parse_route("10.0.0.2 dev enp1s0f0np0 src 10.0.0.1 uid 0").unwrap();
        let gid = "0000:0000:0000:0000:0000:ffff:0a00:0001";
        let dev = "D\t/sys/class/net/enp1s0f0np0/device/infiniband\trocep1s0f0 \n";
        let cases = [
            String::new(),
            "garbage\n\u{0}\n".into(),
            dev.to_owned(),
            format!("{dev}F\t/sys/class/infiniband/rocep1s0f0/ports/1/state\t1: DOWN\n"),
            format!(
                "{dev}F\t/sys/class/infiniband/rocep1s0f0/ports/1/state\t4: ACTIVE\nD\t/sys/class/infiniband/rocep1s0f0/ports/1/gids\t3 \nF\t/sys/class/infiniband/rocep1s0f0/ports/1/gids/3\t{gid}\nF\t/sys/class/infiniband/rocep1s0f0/ports/1/gid_attrs/types/3\tIB/RoCE v1\n"
            ),
            format!(
                "{dev}F\t/sys/class/infiniband/rocep1s0f0/ports/1/state\t4: ACTIVE\nD\t/sys/class/infiniband/rocep1s0f0/ports/1/gids\t../../x \nF\t/sys/class/infiniband/rocep1s0f0/ports/1/gids/../../x\t{gid}\n"
            ),
            format!("{dev}F\t/sys/class/infiniband/rocep1s0f0/ports/1/state\t\u{0}ACTIVE\n"),
        ];
        for text in cases {
            let e = detect(&SysfsDump::parse(&text), &route).unwrap_err();
            let said = format!("{e} {}", e.remedy());
            assert!(
                said.contains("enp1s0f0np0") || said.contains("rocep1s0f0"),
                "{text:?}: {said}"
            );
        }
        // A route line that is not one gives no route at all (the fabric row fails on it).
        for bad in [
            "",
            "dev",
            "10.0.0.2 dev x src 10.0.0.300",
            "src 10.0.0.1 dev",
        ] {
            assert_eq!(parse_route(bad), None, "{bad:?}");
        }
    }
}
