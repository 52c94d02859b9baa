"""Benchmark (not a test): `spark-deploy bench` against a minimal raw `openai` streaming client on
the same engine stand-in, in the same run.

Both measure prose decode at 1 and 4 streams (warm-up, 3 repetitions, medians, 256 tokens,
thinking off, `ignore_eos`) by the same rule: per stream (completion tokens - 1) / (last token
chunk - first token chunk), aggregate = completion tokens / (latest end - earliest start). The
last line is the ratio bench / raw of the wall time and of each figure.

Needs `cargo build -p spark-deploy-testbed --bin standin-loopback --bin tf-standin` and
`cargo build -p spark-deploy-cli`. Usage: python tests/python/bench_overhead.py [--scale 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target" / "debug"
PROMPT = (
    "Write a long, detailed essay about the history of lighthouses and the people who kept them, "
    "with the storms they saw and the ships they saved."
)
MAX_TOKENS = 256
REPS = 3
STREAMS = (1, 4)


def one_stream(client: openai.OpenAI, model: str, prompt: str, out: list, barrier: threading.Barrier) -> None:
    barrier.wait()
    start = time.perf_counter()
    first = last = None
    usage = None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"reasoning_effort": "none", "ignore_eos": True},
    )
    for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else now
            last = now
    end = time.perf_counter()
    out.append((start, first, last, end, usage.completion_tokens))


def raw_client(base_url: str, key: str, model: str) -> tuple[dict, float]:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
    t0 = time.perf_counter()
    warm: list = []
    one_stream(client, model, PROMPT + " (variant warm-up)", warm, threading.Barrier(1))
    figures = {}
    for n in STREAMS:
        per, agg = [], []
        for rep in range(REPS):
            out: list = []
            barrier = threading.Barrier(n)
            threads = [
                threading.Thread(
                    target=one_stream,
                    args=(client, model, f"{PROMPT} (variant raw-{n}-{rep}-{i})", out, barrier),
                )
                for i in range(n)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            per += [(c - 1) / (last - first) for (_, first, last, _, c) in out]
            agg.append(sum(o[4] for o in out) / (max(o[3] for o in out) - min(o[0] for o in out)))
        figures[f"prose x {n} per-stream"] = statistics.median(per)
        figures[f"prose x {n} aggregate"] = statistics.median(agg)
    return figures, time.perf_counter() - t0


def spark_bench(config: Path) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run(
        [str(TARGET / "spark-deploy"), "--config", str(config), "--json", "bench", "--kinds", "prose",
         "--streams", ",".join(map(str, STREAMS)), "--reps", str(REPS), "--max-tokens", str(MAX_TOKENS),
         "--no-prefill"],
        capture_output=True, text=True, check=True,
    )
    wall = time.perf_counter() - t0
    doc = json.loads(r.stdout)
    figures = {}
    for d in doc["spark_deploy"]["results"]["decode"]:
        figures[f"prose x {d['streams']} per-stream"] = statistics.median(d["per_stream"]["values"])
        figures[f"prose x {d['streams']} aggregate"] = d["aggregate"]["median"]
    return figures, wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="4", help="the stand-in's time scale")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "spark-deploy.toml"
        pair = subprocess.Popen(
            [str(TARGET / "standin-loopback"), "--config-out", str(config),
             "--env", f"TF_STANDIN_TIME_SCALE={args.scale}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            assert pair.stdout is not None
            info = json.loads(pair.stdout.readline())
            cfg = tomllib.loads(config.read_text())
            key_line = Path(cfg["serving"]["api_key_file"]).read_text().splitlines()[0]
            key = key_line.split(":", 1)[1].strip()
            bench, bench_wall = spark_bench(config)
            raw, raw_wall = raw_client(info["base_url"], key, info["model"])
        finally:
            if pair.stdin:
                pair.stdin.close()
            pair.wait(timeout=30)
    print(f"{'figure':28} {'bench':>10} {'raw':>10} {'ratio':>8}")
    for k in raw:
        print(f"{k:28} {bench[k]:10.1f} {raw[k]:10.1f} {bench[k] / raw[k]:8.4f}")
    print(f"{'wall time, s':28} {bench_wall:10.2f} {raw_wall:10.2f} {bench_wall / raw_wall:8.4f}")
    ratios = " ".join(f"{k.replace(' ', '')}={bench[k] / raw[k]:.4f}" for k in raw)
    print(f"ratio bench/raw: wall={bench_wall / raw_wall:.4f} {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
