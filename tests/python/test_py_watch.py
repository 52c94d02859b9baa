"""``Deployment.watch``: blocking, events on the calling thread with the supervisor as source,
ended by a ``threading.Event`` or by Ctrl-C (KeyboardInterrupt within 2 s), its state written under
the state directory. A pause lease holds every action.

Traffic goes only to loopback: the worker is ``root@127.0.0.1`` on port 1 (nothing listens), the
head's Docker finds no container of this deployment. The testbed is never brought up.
"""

import datetime
import json
import os
import pathlib
import signal
import tempfile
import threading
import time

import pytest

import spark_deploy


def watched_config(state_dir):
    d = spark_deploy.Config.load(None, env={}).to_dict()
    d["deployment"]["name"] = "pytest-py-watch"  # no real deployment carries this name
    d["deployment"]["state_dir"] = str(state_dir)
    d["nodes"][1].update(
        ssh="root@127.0.0.1",
        ssh_port=1,
        identity_file="/nonexistent/spark-deploy-test/id_ed25519",
        known_hosts="/nonexistent/spark-deploy-test/known_hosts",
    )
    d["watch"].update(interval_s=0.5, wedge_s=2.0)
    return spark_deploy.Config.from_dict(d)


def lease(state_dir, minutes=30):
    """A pause lease as ``spark-deploy watch pause 30m`` writes it (docs/operations.md)."""
    w = pathlib.Path(state_dir) / "watch"
    w.mkdir(parents=True, exist_ok=True)
    until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=minutes)
    (w / "pause").write_text(until.strftime("%Y-%m-%dT%H:%M:%SZ") + "\n")


def test_watch_blocks_emits_supervisor_events_and_ends_on_cancel():
    state = tempfile.mkdtemp(prefix="spark-deploy-pytest-watch-")
    lease(state)
    dep = spark_deploy.Deployment(watched_config(state))
    cancel = threading.Event()
    seen = []
    me = threading.get_ident()

    def on_event(e):
        seen.append((threading.get_ident(), e))
        if sum(1 for _, x in seen if x.get("line", "").startswith("decision:")) >= 3:
            cancel.set()

    t = time.monotonic()
    assert dep.watch(on_event=on_event, cancel=cancel) is None
    assert time.monotonic() - t < 20
    assert all(tid == me for tid, _ in seen)
    events = [e for _, e in seen]
    assert events[0]["event"] == "started" and events[0]["source"] == {"supervisor": "watch"}
    assert all(e["schema"] == "spark-deploy.event/v2" for e in events)
    sup = [e for e in events if e["source"] == {"supervisor": "watch"}]
    assert any(e.get("line", "").startswith("sample: head rank0 absent") for e in sup), sup
    # Rank 0 is gone and the worker does not answer: a finding that needs a heal, held by the lease.
    held = [e for e in sup if "paused until" in e.get("line", "")]
    assert held, sup
    assert not any(e["event"] == "started" and "healing" in e.get("message", "") for e in sup)
    assert events[-1]["event"] == "finished"
    w = pathlib.Path(state) / "watch"
    st = json.loads((w / "state.json").read_text())
    assert st["schema"] == "spark-deploy.watch-state/v1" and st["state"] == "exited"
    samples = [json.loads(l) for l in (w / "samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 3 and samples[0]["ranks"][1]["container"] == "unreachable"
    status = dep.status()["watch"]
    assert status["state"] == "not running" and status["paused_until"]


def test_ctrl_c_ends_the_watch_with_keyboard_interrupt_within_2s():
    state = tempfile.mkdtemp(prefix="spark-deploy-pytest-watch-")
    lease(state)
    dep = spark_deploy.Deployment(watched_config(state))
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        dep.watch()
    assert time.monotonic() - t < 1.5 + 2.0
    st = json.loads((pathlib.Path(state) / "watch" / "state.json").read_text())
    assert st["state"] == "exited"
