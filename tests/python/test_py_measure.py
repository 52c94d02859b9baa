"""`Deployment.validate()` and `Deployment.bench()` against the engine stand-in on loopback
(`standin-loopback`: both ranks, no testbed), reached through a config like any deployment."""

import json
import os
import signal
import subprocess
import threading

import pytest

import spark_deploy
from conftest import _cargo_binary


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    _cargo_binary("spark-deploy-testbed", "tf-standin", "TF_STANDIN_BIN", "dev")
    binary = _cargo_binary("spark-deploy-testbed", "standin-loopback", "STANDIN_LOOPBACK_BIN", "dev")
    config = tmp_path_factory.mktemp("loopback") / "spark-deploy.toml"
    proc = subprocess.Popen(
        [str(binary), "--config-out", str(config), "--env", "TF_STANDIN_TIME_SCALE=20"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads(proc.stdout.readline())
        yield spark_deploy.Deployment(spark_deploy.Config.load(str(config))), info
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_validate_returns_typed_results(loopback):
    deployment, _ = loopback
    events = []
    report = deployment.validate(skip=["image"], on_event=events.append)
    assert isinstance(report, spark_deploy.ValidationReport)
    assert report.ok, report
    assert [r.check for r in report][:3] == ["text", "thinking_on", "thinking_off"]
    assert all(r.verdict == spark_deploy.Verdict.PASS for r in report)
    assert all(r.verdict == "pass" and r.seconds >= 0 for r in report)
    assert sum(e["event"] == "log" for e in events) == len(report)
    assert all(e["source"] == {"command": "validate"} for e in events)
    assert "needle" in report._repr_html_()
    with pytest.raises(ValueError, match="vibes"):
        deployment.validate(only=["vibes"])


def test_bench_returns_rows_and_charts(loopback):
    deployment, _ = loopback
    rows = deployment.bench(streams=[1, 2], kinds=["prose"], reps=1, max_tokens=32, prefill=[8192])
    assert isinstance(rows, spark_deploy.BenchRows)
    decode = [r for r in rows if r["kind"] == "prose"]
    assert [r["streams"] for r in decode] == [1, 2]
    assert all(r["per_stream_tps"] > 0 and r["aggregate_tps"] > 0 for r in decode)
    prefill = [r for r in rows if r["kind"] == "prefill"]
    assert prefill[0]["length"] == 8192 and prefill[0]["prefill_tps"] > 0
    assert rows.png.startswith(b"\x89PNG") and "<svg" in rows._repr_html_()
    assert os.path.exists(rows.path) and rows.json["benchmarks"]
    assert not rows.interrupted
    try:
        import pandas  # noqa: F401
    except ImportError:
        return
    assert list(rows.to_pandas()["kind"]) == ["prose", "prose", "prefill"]


def test_cancel_stops_the_load_and_keeps_what_was_measured(loopback):
    deployment, _ = loopback
    cancel = threading.Event()

    def on_event(e):
        if e["event"] == "log":
            cancel.set()

    rows = deployment.bench(streams=[1, 2, 4], kinds=["prose", "code"], reps=1, max_tokens=32, prefill=[],
                            on_event=on_event, cancel=cancel)
    assert 1 <= len(rows) < 6, list(rows)
    assert rows[0]["kind"] == "prose" and rows[0]["streams"] == 1


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_ctrl_c_returns_the_rows_measured_so_far(loopback):
    deployment, _ = loopback
    fired = []

    def on_event(e):
        if e["event"] == "log" and not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    rows = deployment.bench(streams=[1, 2, 4], kinds=["prose", "code"], reps=1, max_tokens=32, prefill=[],
                            on_event=on_event)
    assert rows.interrupted
    assert 1 <= len(rows) < 6, list(rows)
