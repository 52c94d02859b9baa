"""The Python module end to end on the testbed: plan, run with progress events, a chat completion
through both ranks with the ``openai`` client, status and logs, stop; and Ctrl-C once the ranks
have started stops both within 15 s.

Takes the testbed's fixed names, so it runs only when ``SPARK_DEPLOY_PY_TESTBED=1`` (scripts/test
sets it; it runs after the Rust testbed tests and ``test_demo.py``, one at a time).
"""

import os
import signal
import threading
import time

import pytest

import spark_deploy

pytestmark = pytest.mark.skipif(
    os.environ.get("SPARK_DEPLOY_PY_TESTBED") != "1", reason="set SPARK_DEPLOY_PY_TESTBED=1 (the testbed must be free)"
)


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def testbed():
    # The stand-in engine binary built by `cargo build --workspace --bins` (scripts/test).
    os.environ.setdefault("SPARK_DEPLOY_STANDIN", str(ROOT / "target" / "debug" / "tf-standin"))
    tb = spark_deploy.testbed_up()
    try:
        yield tb
    finally:
        try:
            spark_deploy.Deployment(tb.config).stop()
        except spark_deploy.SparkDeployError:
            pass
        tb.close()
        spark_deploy.testbed_down()


def test_deploy_chat_status_logs_stop(testbed):
    import openai

    dep = spark_deploy.Deployment(testbed.config)
    desc = dep.plan().describe()
    assert [s["step"] for s in desc["steps"]][0] == "preflight"
    events = []
    me = threading.get_ident()
    report = dep.up(on_event=lambda e: events.append((threading.get_ident(), e)))
    assert all(t == me for t, _ in events)
    assert report.ok and [s["step"] for s in report][-1] == "smoke"
    progress = {}
    for _, e in events:
        if e["event"] == "progress":
            progress.setdefault((e["step"], e.get("node"), e["label"]), []).append(e["bytes_done"])
    assert progress, "no progress events"
    assert any(len(v) > 1 and v == sorted(v) and v[-1] > v[0] for v in progress.values())

    client = openai.OpenAI(base_url=dep.base_url, api_key=dep.api_key())
    r = client.chat.completions.create(
        model="DeepSeek-V4.1-Flash-1017",
        messages=[{"role": "user", "content": "What is 6*7?"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].message.content.strip() == "42"

    status = dep.status()
    assert status["overall"] == "running", status
    assert [r["state"] for r in status["ranks"]] == ["running", "running"]
    assert dep.logs(rank=0, tail=50)

    stopped = dep.stop()
    assert stopped.ok
    assert all(r["state"] != "running" for r in dep.status()["ranks"])


def test_ctrl_c_after_launch_stops_both_ranks_within_15s(testbed):
    dep = spark_deploy.Deployment(testbed.config)
    fired = []

    def on_event(e):
        if e["event"] == "started" and e["step"] == "smoke" and not fired:
            fired.append(time.monotonic())
            threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()

    with pytest.raises(KeyboardInterrupt):
        dep.up(on_event=on_event)
    assert fired and time.monotonic() - fired[0] < 15.0
    assert all(r["state"] != "running" for r in dep.status()["ranks"])
