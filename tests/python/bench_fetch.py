"""Benchmark (not a test): our Hub port vs huggingface_hub.snapshot_download on the testbed hub.

    .venv/bin/python tests/python/bench_fetch.py --shards 4 --shard-mb 256

Generates a repo of safetensors-like shards, serves it with `sd-hub` on loopback, then downloads
it into fresh caches with `sd-hub fetch` (our port: resumable, verified incl. sha256) and with
`snapshot_download` (in a subprocess, like a user would run it), alternating, and prints the
throughput of each and the ratio. Both caches are compared byte for byte at the end.
"""

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from conftest import WORKSPACE, sd_hub_binary, start_hub  # noqa: E402

import json  # noqa: E402
import struct  # noqa: E402


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


def run_ours(bin_, endpoint, cache) -> float:
    t = time.perf_counter()
    subprocess.run(
        [str(bin_), "fetch", "--endpoint", endpoint, "--cache", str(cache), "--repo", "bench/ckpt"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "HF_TOKEN"},
    )
    return time.perf_counter() - t


def run_python(endpoint, cache) -> float:
    code = (
        "from huggingface_hub import snapshot_download;"
        f"snapshot_download('bench/ckpt', endpoint='{endpoint}', cache_dir='{cache}')"
    )
    env = dict(os.environ, HF_HUB_DISABLE_IMPLICIT_TOKEN="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - t


def digest_tree(snapshot: pathlib.Path) -> dict:
    return {
        p.relative_to(snapshot).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(snapshot.rglob("*"))
        if p.is_file()
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        total = make_repo(tmp / "root", a.shards, a.shard_mb)
        hub = start_hub(tmp / "root", gated=())
        bin_ = sd_hub_binary()
        ours, py = [], []
        try:
            for i in range(a.runs):
                for name, fn, acc in (
                    ("ours", lambda c: run_ours(bin_, hub.endpoint, c), ours),
                    ("python", lambda c: run_python(hub.endpoint, c), py),
                ):
                    cache = tmp / f"cache-{name}"
                    shutil.rmtree(cache, ignore_errors=True)
                    acc.append(fn(cache))
                    print(f"run {i + 1} {name}: {acc[-1]:.2f} s, {total / acc[-1] / 1e6:.0f} MB/s", flush=True)
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
        f"ratio {best_py / best_ours:.2f}x (best of {a.runs}); build: {bin_} ({WORKSPACE.name})"
    )


if __name__ == "__main__":
    main()
