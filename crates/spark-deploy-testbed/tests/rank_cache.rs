//! BuildRankCache on the test-scale checkpoint: both ranks of W=2 are built, decoded with a reader
//! written here (not the writer's code), reassembled and compared byte for byte with the source
//! shards (read with a safetensors reader written here too).
//!
//! Longer than the ~600-line rule on purpose: the independent reader and the byte-for-byte
//! comparison are the point, and they are only used here; one test binary (each binary in
//! `tests/` links the whole testbed again).

// An integration test: a failed unwrap or expect is the test failure, with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use sha2::{Digest, Sha256};
use spark_deploy_core::engine::tensorfold::inputs::{
    Cancelled, ExistingRankFile, RankCacheError, RankCacheOptions, VerifyLevel, build_rank_cache,
    plan_rank_cache, verify_rank_cache,
};
use spark_deploy_testbed::checkpoint::{CheckpointSpec, generate};

/// One small checkpoint shared by the read-only tests.
fn small() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let g = generate(&CheckpointSpec::small(11), d.path()).unwrap();
        (d, g.model_dir)
    })
    .1
}

fn opts() -> RankCacheOptions {
    RankCacheOptions {
        engine_shape_guard: false,
        chunk_bytes: 256 << 10,
        ..RankCacheOptions::default()
    }
}

fn no_progress()
-> impl FnMut(&spark_deploy_core::engine::tensorfold::inputs::RankCacheProgress) -> Result<(), Cancelled>
{
    |_| Ok(())
}

fn build(model: &Path, out: &Path, rank: usize, o: &RankCacheOptions) -> PathBuf {
    let plan = plan_rank_cache(model, rank, 2, o).unwrap();
    build_rank_cache(&plan, out, o, &mut no_progress()).unwrap()
}

/// A symlink planted at the partial's name (by anyone who may write into OUT_DIR) is replaced,
/// never written through; a FIFO or a directory given as a shard is refused without blocking.
#[test]
fn a_planted_partial_symlink_is_not_followed_and_a_fifo_shard_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let victim = out.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, out.path().join(".rank0of2.partial")).unwrap();
    let file = build(small(), out.path(), 0, &opts());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(file.exists() && !out.path().join(".rank0of2.partial").exists());

    for kind in ["fifo", "dir"] {
        let model = tempfile::tempdir().unwrap();
        let mut shard = None;
        for e in std::fs::read_dir(small()).unwrap() {
            let p = e.unwrap().path();
            let to = model.path().join(p.file_name().unwrap());
            let is_shard = p.extension().is_some_and(|x| x == "safetensors");
            if is_shard && shard.is_none() {
                shard = Some(to);
            } else if p.is_file() {
                std::fs::copy(&p, &to).unwrap();
            }
        }
        let shard = shard.unwrap();
        if kind == "fifo" {
            let st = std::process::Command::new("mkfifo")
                .arg(&shard)
                .status()
                .unwrap();
            assert!(st.success());
        } else {
            std::fs::create_dir(&shard).unwrap();
        }
        let t = std::time::Instant::now();
        let e = plan_rank_cache(model.path(), 0, 2, &opts()).unwrap_err();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "no blocking"
        );
        let want = if kind == "fifo" { "FIFO" } else { "directory" };
        assert!(e.to_string().contains(want), "{kind}: {e}");
    }
}

// ---- an independent TFDSRK01 reader -------------------------------------------------------------

#[derive(Debug)]
struct Row {
    key: String,
    dtype: String,
    shape: Vec<usize>,
    offset: usize,
    bytes: usize,
}

struct RankFile {
    bytes: Vec<u8>,
    rows: Vec<Row>,
    index_text: Vec<u8>,
}

impl RankFile {
    fn open(path: &Path) -> Self {
        let bytes = std::fs::read(path).unwrap();
        let n = bytes.len();
        assert_eq!(&bytes[n - 8..], b"TFDSRK01", "magic");
        let at = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()) as usize;
        let index_text = bytes[at..n - 16].to_vec();
        let v: Value = serde_json::from_slice(&index_text).unwrap();
        let mut rows = Vec::new();
        let mut end = 0usize;
        for r in v.as_array().unwrap() {
            let r = r.as_array().unwrap();
            let row = Row {
                key: r[0].as_str().unwrap().to_owned(),
                dtype: r[1].as_str().unwrap().to_owned(),
                shape: r[2]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect(),
                offset: r[3].as_u64().unwrap() as usize,
                bytes: r[4].as_u64().unwrap() as usize,
            };
            let size = match row.dtype.as_str() {
                "bfloat16" | "float16" | "int16" => 2,
                "float32" | "int32" => 4,
                "uint8" | "float8_e4m3fn" => 1,
                "int64" => 8,
                d => panic!("dtype {d}"),
            };
            assert_eq!(row.offset, end, "{} not back to back", row.key);
            assert_eq!(
                row.bytes,
                size * row.shape.iter().product::<usize>(),
                "{}",
                row.key
            );
            end += row.bytes;
            rows.push(row);
        }
        assert_eq!(end, at, "data section ends where the index starts");
        // the index text byte for byte: rows `[key, dtype, shape, offset, bytes]`, `, ` between
        let text: Vec<String> = rows
            .iter()
            .map(|r| {
                let dims: Vec<String> = r.shape.iter().map(ToString::to_string).collect();
                format!(
                    "[{}, \"{}\", [{}], {}, {}]",
                    serde_json::to_string(&r.key).unwrap(),
                    r.dtype,
                    dims.join(", "),
                    r.offset,
                    r.bytes
                )
            })
            .collect();
        assert_eq!(
            format!("[{}]", text.join(", ")).as_bytes(),
            &index_text[..],
            "index text is byte-exact"
        );
        Self {
            bytes,
            rows,
            index_text,
        }
    }

    fn data(&self, r: &Row) -> &[u8] {
        &self.bytes[r.offset..r.offset + r.bytes]
    }
}

// ---- an independent safetensors reader ----------------------------------------------------------

struct Source {
    tensors: HashMap<String, (String, Vec<usize>, Vec<u8>)>,
}

impl Source {
    fn open(dir: &Path) -> Self {
        let mut tensors = HashMap::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().and_then(|x| x.to_str()) != Some("safetensors") {
                continue;
            }
            let b = std::fs::read(&p).unwrap();
            let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
            let h: BTreeMap<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
            for (name, t) in h {
                if name == "__metadata__" {
                    continue;
                }
                let o = t["data_offsets"].as_array().unwrap();
                let (a, z) = (
                    o[0].as_u64().unwrap() as usize,
                    o[1].as_u64().unwrap() as usize,
                );
                let shape = t["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                tensors.insert(
                    name,
                    (
                        t["dtype"].as_str().unwrap().to_owned(),
                        shape,
                        b[8 + n + a..8 + n + z].to_vec(),
                    ),
                );
            }
        }
        Self { tensors }
    }

    fn get(&self, name: &str) -> &(String, Vec<usize>, Vec<u8>) {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("no source tensor {name}"))
    }
}

/// f16 bits to f32 through the value (a different method from the library's bit shuffling).
fn widen(src: &[u8]) -> Vec<u8> {
    src.chunks_exact(2)
        .flat_map(|h| {
            let h = u16::from_le_bytes([h[0], h[1]]);
            let s = if h & 0x8000 != 0 { -1.0f64 } else { 1.0 };
            let e = i32::from((h >> 10) & 0x1f);
            let m = f64::from(h & 0x3ff);
            assert!(e != 31, "generated f16 values are finite");
            let v = if e == 0 {
                s * m * 2f64.powi(-24)
            } else {
                s * (1.0 + m / 1024.0) * 2f64.powi(e - 15)
            };
            (v as f32).to_le_bytes()
        })
        .collect()
}

fn parse_range(t: &str) -> Option<(usize, usize)> {
    if t == "None" {
        return None;
    }
    let (a, b) = t
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split_once(", ")
        .unwrap();
    Some((a.parse().unwrap(), b.parse().unwrap()))
}

#[test]
fn both_ranks_reassemble_to_the_source_byte_for_byte() {
    let model = small();
    let out = tempfile::tempdir().unwrap();
    let o = opts();
    let files: Vec<RankFile> = (0..2)
        .map(|r| RankFile::open(&build(model, &out.path().join(format!("r{r}")), r, &o)))
        .collect();
    let src = Source::open(model);
    // names follow from the index text
    for (r, f) in files.iter().enumerate() {
        let h = hex::encode(Sha256::digest(&f.index_text));
        let dir = out.path().join(format!("r{r}"));
        assert!(dir.join(format!("rank{r}of2-{}.bin", &h[..20])).is_file());
        assert_eq!(f.rows[0].key, "embed.weight|None");
    }
    assert_eq!(files[0].rows.len(), files[1].rows.len());
    let mut split_checked = 0;
    let mut plain_checked = 0;
    let mut widened = 0;
    let mut wo_a_groups = 0;
    for (a, b) in files[0].rows.iter().zip(&files[1].rows) {
        let fa: Vec<&str> = a.key.split('|').collect();
        let fb: Vec<&str> = b.key.split('|').collect();
        if fa[0] != fb[0] {
            // wo_a output groups are split by whole tensors: rank 0 holds slice g, rank 1 slice g + o_groups/2
            let (ga, gb) = (
                fa[0].rsplit_once(".slice.").unwrap(),
                fb[0].rsplit_once(".slice.").unwrap(),
            );
            assert_eq!(
                ga.0, gb.0,
                "both ranks list the same tensors in the same order"
            );
            assert!(ga.0.ends_with(".attn.wo_a"), "{}", a.key);
            let half = CheckpointSpec::small(11).o_groups / 2;
            assert_eq!(
                ga.1.parse::<usize>().unwrap() + half,
                gb.1.parse::<usize>().unwrap(),
                "rank 1 holds group g + o_groups/2"
            );
            let suffix = match fa[3] {
                "tr" => "trellis",
                p => p,
            };
            assert_eq!(
                files[0].data(a),
                &src.get(&format!("{}.{suffix}", fa[0])).2[..],
                "{}",
                a.key
            );
            assert_eq!(
                files[1].data(b),
                &src.get(&format!("{}.{suffix}", fb[0])).2[..],
                "{}",
                b.key
            );
            wo_a_groups += 1;
            continue;
        }
        if fa.len() == 2 {
            // plain: replicated, copied or widened
            let (dtype, _, bytes) = src.get(fa[0]);
            let want = if fa[1] == "torch.float32" && dtype == "F16" {
                widened += 1;
                widen(bytes)
            } else {
                bytes.clone()
            };
            assert_eq!(files[0].data(a), &want[..], "{}", a.key);
            assert_eq!(files[1].data(b), &want[..], "{}", b.key);
            plain_checked += 1;
            continue;
        }
        let (prefix, part) = (fa[0], fa[3]);
        let suffix = match part {
            "tr" => "trellis",
            "suh" => "suh",
            "svh" => "svh",
            p => panic!("part {p}"),
        };
        let (_, shape, full) = src.get(&format!("{prefix}.{suffix}"));
        let (ca, ra, cb, rb) = (
            parse_range(fa[1]),
            parse_range(fa[2]),
            parse_range(fb[1]),
            parse_range(fb[2]),
        );
        let (da, db) = (files[0].data(a), files[1].data(b));
        let sel = match part {
            "suh" => (ra, rb),
            "svh" => (ca, cb),
            _ => (ca.or(ra), cb.or(rb)),
        };
        match sel {
            (None, None) => {
                assert_eq!(da, &full[..], "{}", a.key);
                assert_eq!(db, &full[..], "{}", b.key);
                plain_checked += 1;
            }
            (Some(x), Some(y)) => {
                // the halves are complementary
                assert_eq!(x.0, 0, "{}", a.key);
                assert_eq!(x.1, y.0, "{}", a.key);
                let whole: Vec<u8> = if part == "tr" && ca.is_some() {
                    // column halves: interleave each K-tile row
                    let (ra_, rb_) = (da.len() / shape[0], db.len() / shape[0]);
                    (0..shape[0])
                        .flat_map(|k| {
                            da[k * ra_..(k + 1) * ra_]
                                .iter()
                                .chain(&db[k * rb_..(k + 1) * rb_])
                                .copied()
                        })
                        .collect()
                } else {
                    da.iter().chain(db).copied().collect()
                };
                assert_eq!(whole, *full, "{} reassembled", prefix);
                split_checked += 1;
            }
            _ => panic!("{} and {} split differently", a.key, b.key),
        }
    }
    assert!(split_checked > 100, "{split_checked}");
    assert_eq!(
        wo_a_groups,
        3 * 6 * (CheckpointSpec::small(11).o_groups / 2),
        "three parts of each of a rank's o_groups/2 groups in each of 6 blocks"
    );
    assert!(
        plain_checked > 100 && widened > 20,
        "{plain_checked} {widened}"
    );
}

#[test]
fn index_only_writes_nothing_and_names_the_built_file() {
    let model = small();
    let out = tempfile::tempdir().unwrap();
    let o = opts();
    let plan = plan_rank_cache(model, 1, 2, &o).unwrap();
    assert!(
        plan.index_json
            .starts_with("[[\"embed.weight|None\", \"bfloat16\", [")
    );
    assert!(plan.index_json.ends_with(", 0, 0]]") || plan.index_json.ends_with("]]"));
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    let f = build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap();
    assert_eq!(f.file_name().unwrap().to_str().unwrap(), plan.file_name);
    assert_eq!(std::fs::metadata(&f).unwrap().len(), plan.file_len());
    // only the final file, its sidecar and its stamp are left
    let mut names: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            format!(".{}.checked", plan.file_name),
            plan.file_name.clone(),
            format!("{}.source.json", plan.file_name)
        ]
    );
    let side = spark_deploy_core::engine::tensorfold::inputs::read_sidecar(&f).unwrap();
    assert_eq!(side["file"], plan.file_name.as_str());
    assert_eq!(side["rank"], 1);
    // The whole file's sha256, taken from the chunks as 4 threads wrote them (256 KiB chunks:
    // many, finishing out of order), is recorded and holds for the file as it stands.
    let bytes = std::fs::read(&f).unwrap();
    assert!(bytes.len() > 16 * (256 << 10), "{} bytes", bytes.len());
    assert_eq!(
        spark_deploy_core::engine::tensorfold::inputs::rank_cache::content::recorded_sha256(&f),
        Some(hex::encode(Sha256::digest(&bytes)))
    );
    // no DSpark: a different index, no mtp entries
    let nd = plan_rank_cache(model, 1, 2, &RankCacheOptions { dspark: false, ..o }).unwrap();
    assert!(!nd.index_json.contains("mtp."));
    assert_ne!(nd.file_name, plan.file_name);
}

#[test]
fn verify_catches_one_flipped_byte() {
    let model = small();
    let out = tempfile::tempdir().unwrap();
    let o = opts();
    let plan = plan_rank_cache(model, 0, 2, &o).unwrap();
    let f = build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap();
    verify_rank_cache(
        &plan,
        out.path(),
        VerifyLevel::Bytes,
        &o,
        &mut no_progress(),
    )
    .unwrap();
    // flip one byte inside an expert's trellis
    let e = plan
        .entries
        .iter()
        .find(|e| e.row.key.starts_with("layers.2.ffn.experts.3.w1|"))
        .unwrap();
    let at = e.row.offset + e.row.bytes / 2;
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[at as usize] ^= 0x01;
    std::fs::write(&f, &bytes).unwrap();
    // the index still checks out, the bytes do not
    verify_rank_cache(&plan, &f, VerifyLevel::Index, &o, &mut no_progress()).unwrap();
    let err = verify_rank_cache(&plan, &f, VerifyLevel::Bytes, &o, &mut no_progress()).unwrap_err();
    match &err {
        RankCacheError::Mismatch { key, problem, .. } => {
            assert_eq!(key, &e.row.key);
            assert!(problem.contains(&at.to_string()), "{problem}");
        }
        other => panic!("{other}"),
    }
    // a flipped byte in the index is caught without reading data
    bytes[at as usize] ^= 0x01;
    let ix = plan.data_bytes as usize + 30;
    bytes[ix] = if bytes[ix] == b'1' { b'2' } else { b'1' };
    std::fs::write(&f, &bytes).unwrap();
    assert!(verify_rank_cache(&plan, &f, VerifyLevel::Index, &o, &mut no_progress()).is_err());
}

#[test]
fn a_second_rank_file_is_refused() {
    let model = small();
    let out = tempfile::tempdir().unwrap();
    let o = opts();
    let plan = plan_rank_cache(model, 0, 2, &o).unwrap();
    let f = build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap();
    let err = build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap_err();
    assert!(matches!(err, RankCacheError::Exists { .. }), "{err}");
    assert!(
        err.to_string().contains("verify"),
        "the message says what to do: {err}"
    );
    // a stray second file: verify of the directory refuses like the engine (SeveralRankCaches)
    std::fs::copy(&f, out.path().join("rank0of2-00000000000000000000.bin")).unwrap();
    let err = verify_rank_cache(
        &plan,
        out.path(),
        VerifyLevel::Index,
        &o,
        &mut no_progress(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("remove all but one"), "{err}");
    // a rank 1 file does not count against rank 0
    std::fs::remove_file(out.path().join("rank0of2-00000000000000000000.bin")).unwrap();
    std::fs::write(out.path().join("rank1of2-x.bin"), b"").unwrap();
    verify_rank_cache(
        &plan,
        out.path(),
        VerifyLevel::Index,
        &o,
        &mut no_progress(),
    )
    .unwrap();
    // MoveAside: a rebuild (here without DSpark) leaves exactly one rank-0 file
    let o2 = RankCacheOptions {
        dspark: false,
        existing: ExistingRankFile::MoveAside,
        ..o
    };
    let plan2 = plan_rank_cache(model, 0, 2, &o2).unwrap();
    let f2 = build_rank_cache(&plan2, out.path(), &o2, &mut no_progress()).unwrap();
    let left: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("rank0of2-") && n.ends_with(".bin"))
        .collect();
    assert_eq!(
        left,
        vec![f2.file_name().unwrap().to_str().unwrap().to_owned()]
    );
    let old_side = format!("{}.source.json", f.file_name().unwrap().to_str().unwrap());
    assert!(out.path().join("superseded").join(old_side).is_file());
    assert!(
        out.path()
            .join("superseded")
            .join(f.file_name().unwrap())
            .is_file()
    );
}

#[test]
fn a_cancelled_build_leaves_no_file_under_a_final_name() {
    let model = small();
    let out = tempfile::tempdir().unwrap();
    let o = RankCacheOptions {
        chunk_bytes: 64 << 10,
        threads: 2,
        ..opts()
    };
    let plan = plan_rank_cache(model, 1, 2, &o).unwrap();
    let mut calls = 0;
    let mut stop_after_three =
        |p: &spark_deploy_core::engine::tensorfold::inputs::RankCacheProgress| {
            calls += 1;
            assert!(p.bytes_done <= p.bytes_total);
            if calls >= 3 { Err(Cancelled) } else { Ok(()) }
        };
    let err = build_rank_cache(&plan, out.path(), &o, &mut stop_after_three).unwrap_err();
    assert!(
        matches!(err, RankCacheError::Cancelled { rank: 1 }),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(out.path()).unwrap().count(),
        0,
        "neither a final file nor a partial is left"
    );
    // and the next build succeeds
    build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap();
}

/// The child process of `a_killed_build_leaves_no_file_under_a_final_name`: a slowed build of
/// rank 0 of `SD_KILLED_BUILD_MODEL` into `SD_KILLED_BUILD_OUT`, which the parent kills mid-write.
/// Does nothing when run on its own.
#[test]
#[ignore = "the child process of a_killed_build_leaves_no_file_under_a_final_name"]
fn killed_build_child() {
    let (Some(model), Some(out)) = (
        std::env::var_os("SD_KILLED_BUILD_MODEL"),
        std::env::var_os("SD_KILLED_BUILD_OUT"),
    ) else {
        return;
    };
    let o = RankCacheOptions {
        chunk_bytes: 65536,
        threads: 1,
        ..opts()
    };
    let plan = plan_rank_cache(Path::new(&model), 0, 2, &o).unwrap();
    let mut slow = |_: &spark_deploy_core::engine::tensorfold::inputs::RankCacheProgress| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        Ok(())
    };
    build_rank_cache(&plan, Path::new(&out), &o, &mut slow).unwrap();
}

#[test]
fn a_killed_build_leaves_no_file_under_a_final_name() {
    let model = small();
    let out = tempfile::tempdir().unwrap();
    // This test binary again, running only the child above: a build in its own process to SIGKILL.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "killed_build_child",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env("SD_KILLED_BUILD_MODEL", model)
        .env("SD_KILLED_BUILD_OUT", out.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let partial = out.path().join(".rank0of2.partial");
    let t0 = std::time::Instant::now();
    while !partial.exists() {
        assert!(t0.elapsed().as_secs() < 60, "the build never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the build was killed before it finished");
    let finals: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    assert!(finals.is_empty(), "{finals:?}");
    // a rebuild overwrites the stale partial and ends with one file
    let o = opts();
    let plan = plan_rank_cache(model, 0, 2, &o).unwrap();
    build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap();
    assert!(!partial.exists());
    verify_rank_cache(
        &plan,
        out.path(),
        VerifyLevel::Bytes,
        &o,
        &mut no_progress(),
    )
    .unwrap();
}

fn write_safetensors(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
    let mut h = serde_json::Map::new();
    let mut at = 0;
    for (name, dtype, shape, data) in tensors {
        h.insert((*name).to_owned(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + data.len()]}));
        at += data.len();
    }
    let mut text = serde_json::to_vec(&Value::Object(h)).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut b = (text.len() as u64).to_le_bytes().to_vec();
    b.extend(text);
    for (_, _, _, d) in tensors {
        b.extend(d);
    }
    std::fs::write(path, b).unwrap();
}

#[test]
fn ablit_overlay_replaces_base_tensors() {
    let model = small();
    let src = Source::open(model);
    let out = tempfile::tempdir().unwrap();
    let (_, tr_shape, tr) = src.get("layers.1.ffn.experts.0.w1.trellis").clone();
    let (_, n_shape, norm) = src.get("layers.0.attn_norm.weight").clone();
    let new_tr: Vec<u8> = tr.iter().map(|b| b.wrapping_add(1)).collect();
    let new_norm: Vec<u8> = norm.iter().map(|b| b ^ 0x5a).collect();
    let ov = out.path().join("ablit.safetensors");
    write_safetensors(
        &ov,
        &[
            (
                "layers.1.ffn.experts.0.w1.trellis",
                "I16",
                tr_shape.clone(),
                new_tr.clone(),
            ),
            (
                "layers.0.attn_norm.weight",
                "BF16",
                n_shape,
                new_norm.clone(),
            ),
        ],
    );
    let base = plan_rank_cache(model, 0, 2, &opts()).unwrap();
    let o = RankCacheOptions {
        overlay: Some(ov.clone()),
        ..opts()
    };
    let plan = plan_rank_cache(model, 0, 2, &o).unwrap();
    // the index holds no content hash: an ABLIT file has the base file's name, so it must live in
    // its own cache directory
    assert_eq!(plan.file_name, base.file_name);
    let f = RankFile::open(
        &build_rank_cache(&plan, &out.path().join("ablit"), &o, &mut no_progress()).unwrap(),
    );
    let row = |k: &str| f.rows.iter().find(|r| r.key.starts_with(k)).unwrap();
    assert_eq!(f.data(row("layers.0.attn_norm.weight|None")), &new_norm[..]);
    // rank 0's column half of the overlay trellis
    let r = row("layers.1.ffn.experts.0.w1|(0, 128)|None|tr");
    let full_row = tr_shape[1] * tr_shape[2] * 2;
    let want: Vec<u8> = (0..tr_shape[0])
        .flat_map(|k| new_tr[k * full_row..k * full_row + full_row / 2].to_vec())
        .collect();
    assert_eq!(f.data(r), &want[..]);
    verify_rank_cache(
        &plan,
        &out.path().join("ablit"),
        VerifyLevel::Bytes,
        &o,
        &mut no_progress(),
    )
    .unwrap();
    // an overlay whose trellis has another K is refused before writing, naming the entry and rank
    let bad = out.path().join("bad.safetensors");
    write_safetensors(
        &bad,
        &[(
            "layers.1.ffn.experts.0.w1.trellis",
            "I16",
            vec![tr_shape[0] - 1, tr_shape[1], tr_shape[2]],
            vec![0; (tr_shape[0] - 1) * tr_shape[1] * tr_shape[2] * 2],
        )],
    );
    let err = plan_rank_cache(
        model,
        0,
        2,
        &RankCacheOptions {
            overlay: Some(bad),
            ..opts()
        },
    )
    .unwrap_err();
    let s = err.to_string();
    assert!(
        s.contains("layers.1.ffn.experts.0.w1|(0, 128)|None|tr") && s.contains("rank 0"),
        "{s}"
    );
}

#[test]
fn the_engine_shape_guard_refuses_a_test_scale_checkpoint() {
    let err = plan_rank_cache(small(), 0, 2, &RankCacheOptions::default()).unwrap_err();
    let s = err.to_string();
    assert!(
        s.contains("text_config.num_hidden_layers") && s.contains("40"),
        "{s}"
    );
}

#[test]
fn generation_is_deterministic_from_the_seed() {
    let hash_dir = |d: &Path| {
        let mut files: Vec<PathBuf> = Vec::new();
        for sub in ["model", "original", "kit"] {
            let mut stack = vec![d.join(sub)];
            while let Some(p) = stack.pop() {
                for e in std::fs::read_dir(&p).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p)
                    } else {
                        files.push(p)
                    }
                }
            }
        }
        files.sort();
        let mut h = Sha256::new();
        for f in files {
            h.update(f.strip_prefix(d).unwrap().to_string_lossy().as_bytes());
            h.update(std::fs::read(&f).unwrap());
        }
        hex::encode(h.finalize())
    };
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    generate(&CheckpointSpec::small(5), a.path()).unwrap();
    generate(&CheckpointSpec::small(5), b.path()).unwrap();
    generate(&CheckpointSpec::small(6), c.path()).unwrap();
    assert_eq!(hash_dir(a.path()), hash_dir(b.path()));
    assert_ne!(hash_dir(a.path()), hash_dir(c.path()));
}

#[test]
fn a_shard_truncated_after_planning_fails_the_build_with_the_entry() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for e in std::fs::read_dir(small()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, model.join(p.file_name().unwrap())).unwrap();
    }
    let o = opts();
    let plan = plan_rank_cache(&model, 0, 2, &o).unwrap();
    let shard = model.join("model-00002-of-00005.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = d.path().join("out");
    let err = build_rank_cache(&plan, &out, &o, &mut no_progress()).unwrap_err();
    match &err {
        RankCacheError::ReadSource {
            key, path, rank, ..
        } => {
            assert_eq!(*rank, 0);
            assert_eq!(path, &shard);
            assert!(plan.entries.iter().any(|e| &e.row.key == key));
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("re-download"), "{err}");
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "no file is left behind"
    );
    // planning again refuses the truncated shard up front
    assert!(plan_rank_cache(&model, 0, 2, &o).is_err());
}

/// A copy of the small checkpoint (shards hard-linked) whose shard holding `tensor` has that
/// tensor's header entry rewritten by `edit`, the data section untouched.
fn tampered(tensor: &str, edit: impl Fn(&mut Value)) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let model = small();
    let index: Value =
        serde_json::from_slice(&std::fs::read(model.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let shard = index["weight_map"][tensor].as_str().unwrap().to_owned();
    for e in std::fs::read_dir(model).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_str() != Some(shard.as_str()) {
            std::fs::hard_link(e.path(), d.path().join(e.file_name())).unwrap();
        }
    }
    let bytes = std::fs::read(model.join(&shard)).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header[tensor]);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(d.path().join(&shard), out).unwrap();
    d
}

#[test]
fn a_shard_whose_dtype_or_shape_was_changed_consistently_is_refused() {
    let o = opts();
    // Each edit keeps the tensor's byte length, so the shard's header is valid safetensors.
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str); 7] = [
        (
            "layers.0.attn_norm.weight",
            |t| t["dtype"] = "F16".into(),
            "expects BF16",
        ),
        (
            "embed.weight",
            |t| t["shape"] = serde_json::json!([512, 512]),
            "config.json makes it [1024, 256]",
        ),
        (
            "embed.weight",
            |t| {
                t["dtype"] = "F32".into();
                t["shape"] = serde_json::json!([1024, 128]);
            },
            "config.json makes it [1024, 256]",
        ),
        (
            "layers.1.ffn.gate.bias",
            |t| t["dtype"] = "BF16".into(),
            "only F16 → F32 widening",
        ),
        (
            "layers.1.attn.wq_a.trellis",
            |t| {
                let s = t["shape"].as_array().unwrap().clone();
                let (k, n, w) = (
                    s[0].as_u64().unwrap(),
                    s[1].as_u64().unwrap(),
                    s[2].as_u64().unwrap(),
                );
                t["shape"] = serde_json::json!([k, n * 3, w / 3]);
            },
            "config.json makes N 128",
        ),
        (
            "layers.1.attn.wq_a.trellis",
            |t| {
                let s = t["shape"].as_array().unwrap().clone();
                let (k, n, w) = (
                    s[0].as_u64().unwrap(),
                    s[1].as_u64().unwrap(),
                    s[2].as_u64().unwrap(),
                );
                t["shape"] = serde_json::json!([k, n * 2, w / 2]);
            },
            "words per tile",
        ),
        (
            "layers.1.attn.wq_a.svh",
            |t| t["shape"] = serde_json::json!([t["shape"][0].as_u64().unwrap() / 2, 2]),
            "float16 vectors",
        ),
    ];
    for (tensor, edit, says) in cases {
        let d = tampered(tensor, edit);
        let err = plan_rank_cache(d.path(), 0, 2, &o).unwrap_err();
        match &err {
            RankCacheError::Layout {
                tensor: t, problem, ..
            } => {
                assert_eq!(t, tensor, "{err}");
                assert!(problem.contains(says), "{tensor}: {err}");
            }
            other => panic!("{tensor}: {other}"),
        }
        assert!(err.to_string().contains("re-download"), "{err}");
    }
    // A trellis and its scales changed together (K and N swapped) still disagree with config.json.
    let d = tampered("layers.1.attn.wq_a.trellis", |t| {
        let s = t["shape"].as_array().unwrap().clone();
        t["shape"] = serde_json::json!([s[1], s[0], s[2]]);
    });
    let err = plan_rank_cache(d.path(), 0, 2, &o).unwrap_err();
    assert!(err.to_string().contains("config.json makes K 256"), "{err}");
}

/// What `up` uses: every block when the file changed since its last full check (any write moves
/// its ctime), else the first, the last and a sample — so only damage beneath the file system
/// (the stamp unchanged) can slip past a stamped check, and only outside the sample.
#[test]
fn a_stamped_check_reads_every_block_after_a_change_and_a_sample_otherwise() {
    use spark_deploy_core::engine::tensorfold::inputs::rank_cache::stamp;
    let model = small();
    let out = tempfile::tempdir().unwrap();
    let mut o = opts();
    o.chunk_bytes = 4096;
    let plan = plan_rank_cache(model, 0, 2, &o).unwrap();
    let f = build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap();
    let blocks = plan.data_bytes.div_ceil(4096);
    assert!(blocks > 4 * (stamp::SAMPLE_BLOCKS + 2), "{blocks} blocks");
    let stamped =
        |f: &Path| verify_rank_cache(&plan, f, VerifyLevel::Stamped, &o, &mut no_progress());
    // The build records the stamp (its CRC-32s are of the buffers it wrote): the first `up` after
    // a build reads a sample, not every block again.
    assert_eq!(
        stamp::read(&f),
        Some(stamp::Stamp::of(&std::fs::metadata(&f).unwrap())),
        "the build records the stamp of the file as it landed"
    );
    // A write after the build moves the stamp: every block is read, the byte found.
    let built = std::fs::read(&f).unwrap();
    let mut bad = built.clone();
    bad[(plan.data_bytes / 2 + 3) as usize] ^= 0x10;
    std::fs::write(&f, &bad).unwrap();
    assert!(
        stamped(&f).is_err(),
        "a write after the build is checked in full"
    );
    assert!(stamp::read(&f).is_none());
    std::fs::write(&f, &built).unwrap();
    stamped(&f).unwrap();
    assert!(stamp::read(&f).is_some(), "a full check records the stamp");
    let good = std::fs::read(&f).unwrap();
    // A flipped byte anywhere, written through the file system: the stamp no longer matches,
    // every block is read, the byte is found and the stamp is forgotten.
    for at in [
        1,
        plan.data_bytes / 3,
        plan.data_bytes / 2 + 77,
        plan.data_bytes - 1,
    ] {
        let mut bytes = good.clone();
        bytes[at as usize] ^= 0x10;
        std::fs::write(&f, &bytes).unwrap();
        let err = stamped(&f).unwrap_err();
        assert!(err.to_string().contains("CRC-32"), "byte {at}: {err}");
        assert!(stamp::read(&f).is_none(), "byte {at}: stamp forgotten");
        std::fs::write(&f, &good).unwrap();
        stamped(&f).unwrap();
    }
    // Damage the file system never saw (the stamp re-recorded over it): the first and the last
    // block are always read; a block outside the sample passes the stamped check, and the full
    // one (`rank-cache verify --checksums`) finds it.
    let unseen = |at: u64| {
        let mut bytes = good.clone();
        bytes[at as usize] ^= 0x10;
        std::fs::write(&f, &bytes).unwrap();
        stamp::write(&f, &stamp::Stamp::of(&std::fs::metadata(&f).unwrap())).unwrap();
    };
    unseen(0);
    assert!(stamped(&f).is_err(), "the first block is always read");
    unseen(plan.data_bytes - 1);
    assert!(stamped(&f).is_err(), "the last block is always read");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let sampled: std::collections::HashSet<u64> = [seed, seed + 1, seed + 2]
        .iter()
        .flat_map(|&s| stamp::sample(blocks, s))
        .collect();
    let outside = (1..blocks - 1).find(|b| !sampled.contains(b)).unwrap();
    unseen(outside * 4096 + 5);
    stamped(&f).unwrap();
    assert!(verify_rank_cache(&plan, &f, VerifyLevel::Checksums, &o, &mut no_progress()).is_err());
}

#[test]
fn checksums_recorded_at_build_catch_every_flipped_byte_without_the_checkpoint() {
    let model = small();
    let out = tempfile::tempdir().unwrap();
    let o = opts();
    let plan = plan_rank_cache(model, 1, 2, &o).unwrap();
    let f = build_rank_cache(&plan, out.path(), &o, &mut no_progress()).unwrap();
    let side = spark_deploy_core::engine::tensorfold::inputs::read_sidecar(&f).unwrap();
    assert_eq!(side["checksums"]["algorithm"], "crc32");
    verify_rank_cache(&plan, &f, VerifyLevel::Checksums, &o, &mut no_progress()).unwrap();
    let good = std::fs::read(&f).unwrap();
    // One flipped bit at 64 places spread over the data section (first and last byte included):
    // each is caught, naming the entries of its block; the index level sees none of them.
    let n = plan.data_bytes;
    for k in 0..64u64 {
        let at = if k == 63 { n - 1 } else { k * n / 63 };
        let mut bytes = good.clone();
        bytes[at as usize] ^= 1 << (k % 8);
        std::fs::write(&f, &bytes).unwrap();
        verify_rank_cache(&plan, &f, VerifyLevel::Index, &o, &mut no_progress()).unwrap();
        let err = verify_rank_cache(&plan, &f, VerifyLevel::Checksums, &o, &mut no_progress())
            .unwrap_err();
        let RankCacheError::Mismatch { key, problem, .. } = &err else {
            panic!("byte {at}: {err}");
        };
        let e = plan
            .entries
            .iter()
            .find(|e| e.row.offset <= at && at < e.row.offset + e.row.bytes)
            .unwrap();
        assert!(
            key.contains(&e.row.key) || key.contains(" … "),
            "byte {at}: {err}"
        );
        assert!(problem.contains("CRC-32"), "{problem}");
    }
    // The checkpoint is not read at this level: it verifies with the model directory gone.
    std::fs::write(&f, &good).unwrap();
    let moved = tempfile::tempdir().unwrap();
    let plan_elsewhere = plan_rank_cache(model, 1, 2, &o).unwrap();
    drop(moved);
    verify_rank_cache(
        &plan_elsewhere,
        &f,
        VerifyLevel::Checksums,
        &o,
        &mut no_progress(),
    )
    .unwrap();
    // A sidecar without checksums (an older build): the level falls back to byte for byte.
    let side_path = spark_deploy_core::engine::tensorfold::inputs::sidecar_path(&f);
    let mut old = side.clone();
    old.as_object_mut().unwrap().remove("checksums");
    std::fs::write(&side_path, old.to_string()).unwrap();
    let mut bytes = good.clone();
    bytes[(n / 2) as usize] ^= 0x80;
    std::fs::write(&f, &bytes).unwrap();
    let err =
        verify_rank_cache(&plan, &f, VerifyLevel::Checksums, &o, &mut no_progress()).unwrap_err();
    assert!(
        err.to_string().contains("differs from the checkpoint"),
        "{err}"
    );
}

/// The pipelined `up` builds rank files while shards arrive: every entry of a shard written as
/// the shard lands, in any order. Handed the shards backwards, both ranks come out byte for byte
/// as the whole-file build writes them, with the same block checksums; stopped after two shards,
/// the next build is handed only the rest (the journal records the two) and ends the same.
#[test]
fn a_streaming_build_in_any_shard_order_equals_the_whole_file_build_and_resumes_after_a_stop() {
    use spark_deploy_core::engine::tensorfold::inputs::{
        build_rank_caches_streaming, plan_rank_cache_from, safetensors_index::Checkpoint,
    };
    let model = small();
    let o = opts();
    let whole = tempfile::tempdir().unwrap();
    let want: Vec<PathBuf> = (0..2).map(|r| build(model, whole.path(), r, &o)).collect();
    let plans: Vec<_> = (0..2)
        .map(|r| {
            plan_rank_cache_from(model, Checkpoint::open_dir(model).unwrap(), r, 2, &o).unwrap()
        })
        .collect();
    let shards = plans[0].checkpoint.shards.len();
    assert!(shards >= 3, "{shards} shards");
    let same = |got: &[PathBuf]| {
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.file_name(), w.file_name());
            assert!(
                std::fs::read(g).unwrap() == std::fs::read(w).unwrap(),
                "{} differs",
                g.display()
            );
            let sums = |p: &Path| {
                spark_deploy_core::engine::tensorfold::inputs::read_sidecar(p).unwrap()["checksums"]
                    .clone()
            };
            assert_eq!(sums(g), sums(w), "{}", g.display());
            // The sha256 taken along the way is the file's, so shipping it reads nothing.
            let recorded =
                spark_deploy_core::engine::tensorfold::inputs::rank_cache::content::recorded_sha256(
                    g,
                );
            assert_eq!(
                recorded,
                Some(spark_deploy_core::digest::sha256_file(g).unwrap()),
                "{}",
                g.display()
            );
        }
    };

    // Backwards, in one go.
    let out = tempfile::tempdir().unwrap();
    let mut backwards = |pending: &[usize]| Ok(*pending.last().unwrap());
    let got =
        build_rank_caches_streaming(&plans, out.path(), &o, &mut backwards, &mut no_progress())
            .unwrap();
    same(&got.iter().map(|s| s.path.clone()).collect::<Vec<_>>());
    assert!(got.iter().all(|s| s.resumed_shards == 0));
    let left: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial") || n.ends_with(".journal"))
        .collect();
    assert!(left.is_empty(), "no partial or journal is left: {left:?}");

    // Stopped after two shards, then resumed.
    let out = tempfile::tempdir().unwrap();
    let mut handed = Vec::new();
    let mut two_then_stop = |pending: &[usize]| {
        if handed.len() == 2 {
            return Err(Cancelled);
        }
        handed.push(pending[0]);
        Ok(pending[0])
    };
    let err = build_rank_caches_streaming(
        &plans,
        out.path(),
        &o,
        &mut two_then_stop,
        &mut no_progress(),
    )
    .unwrap_err();
    assert!(matches!(err, RankCacheError::Cancelled { .. }), "{err}");
    assert!(out.path().join(".rank0of2.partial.journal").exists());
    assert!(
        !std::fs::read_dir(out.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".bin")),
        "no file under a final name"
    );
    let mut asked = Vec::new();
    let mut rest = |pending: &[usize]| {
        asked.extend_from_slice(pending);
        Ok(pending[0])
    };
    let got =
        build_rank_caches_streaming(&plans, out.path(), &o, &mut rest, &mut no_progress()).unwrap();
    assert!(
        handed.iter().all(|s| !asked.contains(s)),
        "journalled shards {handed:?} were asked for again: {asked:?}"
    );
    assert!(got.iter().all(|s| s.resumed_shards == 2), "{got:?}");
    same(&got.iter().map(|s| s.path.clone()).collect::<Vec<_>>());
}
