"""`spark-deploy demo` on the testbed, then the `openai` client through both ranks, then down.

Runs after the Rust testbed tests (scripts/test runs pytest after nextest), so the testbed's fixed
names are free.
"""

import json
import os
import pathlib
import subprocess

import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXE = ROOT / "target" / "debug" / "spark-deploy"
STATE = pathlib.Path(os.environ.get("SPARK_DEPLOY_TESTBED_DIR", "/var/tmp/spark-deploy-testbed"))


def last_json(out):
    """The final JSON document of a `--json` run (events come first, one JSON line each)."""
    return json.loads(out.strip().splitlines()[-1])


def sd(*args, check=True):
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, check=check, timeout=900)


@pytest.mark.skipif(not EXE.exists(), reason="build the CLI first (scripts/test does)")
def test_demo_serves_openai_clients_through_both_ranks():
    config = STATE / "spark-deploy.toml"
    try:
        out = sd("demo")
        assert "is running on port 8888" in out.stderr, out.stderr[-3000:]
        key = sd("--config", str(config), "api-key").stdout.strip()
        client = openai.OpenAI(base_url="http://127.0.0.1:8888/v1", api_key=key)
        models = [m.id for m in client.models.list().data]
        assert "DeepSeek-V4.1-Flash-1017" in models
        r = client.chat.completions.create(
            model="DeepSeek-V4.1-Flash-1017",
            messages=[{"role": "user", "content": "What is 6*7?"}],
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert r.choices[0].message.content.strip() == "42"
        health = json.loads(subprocess.run(["curl", "-s", "http://127.0.0.1:8888/health"], capture_output=True, text=True).stdout)
        assert health["status"] == "ok"

        # `preflight --json` checks both nodes for real (the worker over SSH) while the pair runs,
        # deciding the GPU and RoCE checks on what the testbed's hosts present (their nvidia-smi
        # reports the captured host's H200s) and the budget on the rank files built.
        pre = last_json(sd("--config", str(config), "--json", "preflight").stdout)
        rows = pre["preflight"]["results"]
        by = {(r["check"], r["node"]): r for r in rows}
        for node in ("head", "worker-1"):
            for check in ("docker", "docker.runtime", "gpu.containers", "gpu.processes", "memory.available", "fabric.addr", "disk"):
                assert (check, node) in by, (check, node, sorted(by))
            assert by[("gpu", node)]["observed"] == "2 × NVIDIA H200", by[("gpu", node)]
            assert "(rank file)" in by[("memory.budget", node)]["observed"], by[("memory.budget", node)]
            assert "RoCE v2 GID index 3" in by[("fabric.roce", node)]["observed"]
        assert ("ssh", "worker-1") in by and by[("ssh", "worker-1")]["verdict"] == "ok"
        assert "head: max 1980 MHz" in by[("gpu.clocks", "all")]["observed"], by[("gpu.clocks", "all")]
        assert all(r["verdict"] != "fail" for r in rows), [r for r in rows if r["verdict"] == "fail"]

        # A second `up` on the running, unchanged pair skips every step, Preflight included.
        again = last_json(sd("--config", str(config), "--json", "up").stdout)
        assert [s["status"] for s in again["report"]["steps"]] == ["skipped"] * 7, again
        down = sd("--config", str(config), "down")
        assert "log saved to" in down.stderr, down.stderr
        left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=io.spark-deploy.deployment=sd-testbed"], capture_output=True, text=True).stdout
        assert left.strip() == ""
    finally:
        if config.exists():
            sd("--config", str(config), "down", check=False)
        sd("testbed", "down", check=False)
