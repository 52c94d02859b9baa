"""Benchmark (not a test): our Hub port vs huggingface_hub.snapshot_download on the testbed hub.

    .venv/bin/python tests/python/bench_fetch.py --large --runs 3        # the issue-5 figure
    .venv/bin/python tests/python/bench_fetch.py --shards 4 --shard-mb 256

`--large`: the large test-scale checkpoint (`CheckpointSpec::large`, ~2.6 GB of shards), generated
once with `sd-hub generate --size large` into a scratch dir (kept for later runs, `--scratch`), is
served by `sd-hub serve` on loopback. Each run downloads it into an empty cache twice, alternating
which client goes first: with our FetchCheckpoint step (`spark-deploy fetch`, a config pinning the
model, the original model's Engram shards and the kit at their commits) and with
`snapshot_download` of the same three repos with the step's patterns as `allow_patterns` (in a
subprocess, like a user would run it). Both caches are compared (blob bytes, snapshot links,
refs) after the last run.

Timing: ours is the wall time of the `spark-deploy fetch` process (start-up, config, resolution,
download, sha256 of every byte, fsync of every file); the Python client's is the time of its
`snapshot_download` calls inside its process (interpreter start and imports excluded, no hashing,
no fsync), and its process wall time is printed too. The ratio is Python's time / ours (> 1: ours
is faster). `os.sync()` runs (untimed) before every download so one client's dirty pages are not
written back during the other's run.

Without `--large`: a synthetic repo of `--shards` random shards, fetched with `sd-hub fetch`.

Binaries are built in `--profile` (default `release`; `SD_HUB_BIN` / `SPARK_DEPLOY_BIN` override).
"""

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from conftest import generate_hub_tree, sd_hub_binary, spark_deploy_binary, start_hub  # noqa: E402
from hub_cache import KIT, MODEL, ORIGINAL, PATTERNS, cache_layout, repo_folder, write_fetch_config  # noqa: E402

PY_ENV = dict(os.environ, HF_HUB_DISABLE_IMPLICIT_TOKEN="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
PY_ENV.pop("HF_TOKEN", None)

# Runs snapshot_download for each (repo, revision, patterns, cache) and prints its own timing.
PY_CODE = """
import json, sys, time
from huggingface_hub import snapshot_download
endpoint, jobs = sys.argv[1], json.loads(sys.argv[2])
t = time.perf_counter()
for repo, rev, patterns, cache in jobs:
    snapshot_download(repo, revision=rev, endpoint=endpoint, cache_dir=cache, allow_patterns=patterns)
print(json.dumps({"elapsed": time.perf_counter() - t}))
"""


def make_repo(root: pathlib.Path, shards: int, shard_mb: int) -> int:
    repo = root / "bench" / "ckpt"
    repo.mkdir(parents=True)
    (repo / "config.json").write_text(json.dumps({"model_type": "dsv41-bench"}))
    total = 0
    for i in range(shards):
        n = shard_mb * 1024 * 1024
        header = {"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        p = repo / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            left = n
            while left:
                chunk = min(left, 16 << 20)
                f.write(os.urandom(chunk))
                left -= chunk
        total += p.stat().st_size
    return total


def run_python(endpoint, jobs) -> tuple[float, float]:
    """(seconds inside snapshot_download, process wall seconds)."""
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", PY_CODE, endpoint, json.dumps(jobs)],
        check=True,
        env=PY_ENV,
        capture_output=True,
        text=True,
    ).stdout
    wall = time.perf_counter() - t
    return json.loads(out.strip().splitlines()[-1])["elapsed"], wall


def digest_tree(snapshot: pathlib.Path) -> dict:
    return {
        p.relative_to(snapshot).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(snapshot.rglob("*"))
        if p.is_file()
    }


def fresh(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.sync()


def bench_synthetic(a) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        total = make_repo(tmp / "root", a.shards, a.shard_mb)
        bin_ = sd_hub_binary(a.profile)
        hub = start_hub(tmp / "root", gated=(), binary=bin_)
        ours, py = [], []
        try:
            for i in range(a.runs):
                for name in ("ours", "python"):
                    cache = tmp / f"cache-{name}"
                    fresh(cache)
                    if name == "ours":
                        t = time.perf_counter()
                        subprocess.run(
                            [str(bin_), "fetch", "--endpoint", hub.endpoint, "--cache", str(cache), "--repo", "bench/ckpt"],
                            check=True,
                            stdout=subprocess.DEVNULL,
                            env={k: v for k, v in os.environ.items() if k != "HF_TOKEN"},
                        )
                        ours.append(time.perf_counter() - t)
                        took = ours[-1]
                    else:
                        took, _ = run_python(hub.endpoint, [["bench/ckpt", "main", None, str(cache)]])
                        py.append(took)
                    print(f"run {i + 1} {name}: {took:.2f} s, {total / took / 1e6:.0f} MB/s", flush=True)
            sha = hub.commits["bench/ckpt"]
            snap = lambda c: tmp / c / "models--bench--ckpt" / "snapshots" / sha  # noqa: E731
            assert digest_tree(snap("cache-ours")) == digest_tree(snap("cache-python")), "caches differ"
        finally:
            hub.proc.terminate()
            hub.proc.wait(timeout=10)
    best_ours, best_py = min(ours), min(py)
    print(
        f"{total / 1e6:.0f} MB in {a.shards} shards: ours {total / best_ours / 1e6:.0f} MB/s "
        f"(verifies sha256), huggingface_hub {total / best_py / 1e6:.0f} MB/s; "
        f"ratio {best_py / best_ours:.2f}x (best of {a.runs}); profile {a.profile}"
    )


def bench_large(a) -> None:
    scratch = pathlib.Path(a.scratch or pathlib.Path(tempfile.gettempdir()) / f"sd-fetch-bench-large-seed{a.seed}")
    hub_bin, cli = sd_hub_binary(a.profile), spark_deploy_binary(a.profile)
    t = time.perf_counter()
    generated = generate_hub_tree(scratch / "repos", "large", a.seed, binary=hub_bin)
    print(
        f"checkpoint (CheckpointSpec::large({a.seed})) at {scratch / 'repos'} in {time.perf_counter() - t:.1f} s: "
        + ", ".join(f"{r} {n} files {b / 1e6:.1f} MB" for r, (n, b) in generated.items()),
        flush=True,
    )
    hub = start_hub(scratch / "repos", gated=(), binary=hub_bin)
    work = pathlib.Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    revisions = {r: hub.commits[r] for r in (MODEL, ORIGINAL, KIT)}
    ours_dir, py_dir = work / "ours", work / "python"
    env = {"PATH": os.environ["PATH"], "HOME": str(work / "home")}
    ours, py, py_wall = [], [], []
    total = None
    try:
        for i in range(a.runs):
            order = ("ours", "python") if i % 2 == 0 else ("python", "ours")
            for name in order:
                if name == "ours":
                    fresh(ours_dir)
                    cfg = write_fetch_config(ours_dir, hub.endpoint, revisions)
                    t = time.perf_counter()
                    subprocess.run(
                        [str(cli), "--config", str(cfg), "fetch"],
                        check=True,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    ours.append(time.perf_counter() - t)
                    if total is None:
                        total = sum(
                            p.stat().st_size
                            for r in revisions
                            for p in (ours_dir / "hf" / "hub" / repo_folder(r) / "blobs").iterdir()
                        )
                    print(f"run {i + 1} ours:   {ours[-1]:6.2f} s  {total / ours[-1] / 1e6:6.0f} MB/s", flush=True)
                else:
                    fresh(py_dir)
                    jobs = [[r, rev, PATTERNS[r], str(py_dir)] for r, rev in revisions.items()]
                    took, wall = run_python(hub.endpoint, jobs)
                    py.append(took)
                    py_wall.append(wall)
                    print(
                        f"run {i + 1} python: {took:6.2f} s  {total / took / 1e6:6.0f} MB/s"
                        f"  (process wall {wall:.2f} s)",
                        flush=True,
                    )
            print(f"run {i + 1} ratio (python time / ours): {py[-1] / ours[-1]:.2f}x", flush=True)
        for r in revisions:
            mine = cache_layout(ours_dir / "hf" / "hub" / repo_folder(r))
            theirs = cache_layout(py_dir / repo_folder(r))
            assert mine == theirs, f"{r}: the caches differ"
        print(f"caches compared: blobs (sha256), snapshot links and refs of {len(revisions)} repos are identical")
    finally:
        hub.proc.terminate()
        hub.proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    ratios = [p / o for p, o in zip(py, ours)]
    print(
        f"{total / 1e6:.0f} MB ({total} bytes, {len(revisions)} repos): "
        f"ours median {total / statistics.median(ours) / 1e6:.0f} MB/s (best {total / min(ours) / 1e6:.0f}), "
        f"huggingface_hub median {total / statistics.median(py) / 1e6:.0f} MB/s (best {total / min(py) / 1e6:.0f}); "
        f"ratio per run {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}x; "
        f"profile {a.profile}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large", action="store_true", help="the large test-scale checkpoint via spark-deploy fetch")
    ap.add_argument("--seed", type=int, default=5, help="--large: generator seed")
    ap.add_argument("--scratch", help="--large: where the checkpoint is generated once and kept")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--profile", default="release", help="cargo profile of sd-hub and spark-deploy")
    a = ap.parse_args()
    if a.large:
        bench_large(a)
    else:
        bench_synthetic(a)


if __name__ == "__main__":
    main()
