"""Running plans from Python: events on the calling thread, step exceptions with the report,
Ctrl-C cancelling a long step, the runtime after fork, HTML reprs.

Traffic goes only to loopback: the worker is ``root@127.0.0.1`` on a port nothing listens on
(port 1) or on a socket server this test starts. These tests never bring the testbed up.
"""

import os
import signal
import socket
import threading
import time

import pytest

import spark_deploy

# Runs take the deployment lock in state_dir: never the default one a real deployment uses.
STATE_DIR = __import__("tempfile").mkdtemp(prefix="spark-deploy-pytest-state-")


def unreachable_config(port=1, key_dir=None):
    """The default config with the worker at ``root@127.0.0.1:port``; with ``key_dir``, an
    (unusable) identity and an empty known_hosts exist there, so SSH really connects."""
    d = spark_deploy.Config.load(None, env={}).to_dict()
    ident, known = "/nonexistent/spark-deploy-test/id_ed25519", "/nonexistent/spark-deploy-test/known_hosts"
    if key_dir is not None:
        ident, known = str(key_dir / "id_ed25519"), str(key_dir / "known_hosts")
        fd = os.open(ident, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        open(known, "w").close()
    d["deployment"]["name"] = "pytest-py-absent"  # no real deployment carries this name
    d["deployment"]["state_dir"] = STATE_DIR
    d["nodes"][1].update(
        ssh="root@127.0.0.1",
        ssh_port=port,
        identity_file=ident,
        known_hosts=known,
    )
    return spark_deploy.Config.from_dict(d)


def test_failed_preflight_raises_with_step_report_and_events_on_the_calling_thread():
    plan = spark_deploy.Plan.from_steps(unreachable_config(), ["Preflight"])
    assert plan.steps() == ["Preflight"]
    seen = []
    me = threading.get_ident()
    with pytest.raises(spark_deploy.PreflightError) as info:
        plan.run(on_event=lambda e: seen.append((threading.get_ident(), e)))
    err = info.value
    assert isinstance(err, spark_deploy.StepError) and isinstance(err, spark_deploy.SparkDeployError)
    assert err.step == "preflight"
    assert err.remedy
    assert isinstance(err.report, spark_deploy.Report) and isinstance(err.report, list)
    assert [s["step"] for s in err.report] == ["preflight"]
    assert err.report[0]["status"] == "failed" and "ssh" in err.report[0]["detail"]
    assert not err.report.ok
    assert any(c["check"] == "ssh" and c["node"] == "worker-1" and c["verdict"] == "fail" for c in err.checks), err.checks
    assert err.node is None and err.rank is None
    assert "failed" in err.report._repr_html_()
    assert all(tid == me for tid, _ in seen)
    kinds = [e["event"] for _, e in seen]
    assert kinds[0] == "started" and kinds[-1] == "failed"
    assert "log" in kinds
    assert all(e["schema"] == "spark-deploy.event/v2" and e["source"] == {"step": "preflight"} for _, e in seen)
    assert any(e["event"] == "log" and e.get("node") == "worker-1" and e["level"] == "error" for _, e in seen)


def test_deployment_preflight_and_step_names():
    dep = spark_deploy.Deployment(unreachable_config())
    assert "Deployment(" in repr(dep)
    assert dep.plan().steps()[0] == "Preflight"
    with pytest.raises(spark_deploy.PreflightError):
        dep.preflight()
    with pytest.raises(ValueError, match="unknown step"):
        spark_deploy.Plan.from_steps(unreachable_config(), ["Preflite"])
    plan = spark_deploy.Plan.from_steps(unreachable_config(), ["preflight", "FetchCheckpoint", "Stop"])
    assert plan.steps() == ["Preflight", "FetchCheckpoint", "Stop"]
    assert spark_deploy.Plan.teardown(unreachable_config()).steps() == ["Stop"]


def test_exception_from_the_callback_cancels_and_propagates():
    plan = spark_deploy.Plan.from_steps(unreachable_config(), ["Preflight", "FetchCheckpoint"])

    def boom(event):
        raise ValueError("callback says no")

    with pytest.raises(ValueError, match="callback says no"):
        plan.run(on_event=boom)


def test_plan_html():
    html = spark_deploy.Plan.standard(spark_deploy.Config.load(None, env={}))._repr_html_()
    assert html.startswith("<div>") and "<table>" in html
    for step in ("preflight", "fetch_checkpoint", "launch_rank", "smoke"):
        assert step in html


@pytest.fixture
def silent_server():
    """A loopback TCP server that accepts connections and never says anything."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []
    stop = threading.Event()

    def serve():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], conns
    stop.set()
    t.join(2)
    for c in conns:
        c.close()
    srv.close()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_sigint_during_a_long_step_raises_keyboard_interrupt_within_2s(silent_server, tmp_path):
    port, conns = silent_server
    plan = spark_deploy.Plan.from_steps(unreachable_config(port, tmp_path), ["Preflight", "FetchCheckpoint"])
    events = []
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            plan.run(on_event=events.append)
    finally:
        timer.cancel()
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0, elapsed
    assert elapsed >= 0.4, "the step should still have been waiting on the silent server"
    assert conns, "preflight should have connected to the silent server"
    assert [e["event"] for e in events][:1] == ["started"]
    assert not any(e["event"] == "started" and e["source"].get("step") == "fetch_checkpoint" for e in events)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_runtime_works_after_fork():
    plan = spark_deploy.Plan.from_steps(unreachable_config(), ["Preflight"])
    with pytest.raises(spark_deploy.PreflightError):
        plan.run()  # the parent's runtime exists before the fork
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            plan.run()
        except spark_deploy.PreflightError:
            code = 0
        except BaseException:
            code = 2
        os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung running a plan")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_cancel_flag_from_another_thread_stops_a_long_step(silent_server, tmp_path):
    port, _ = silent_server
    plan = spark_deploy.Plan.from_steps(unreachable_config(port, tmp_path), ["Preflight", "FetchCheckpoint"])
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(spark_deploy.PreflightError) as info:
        plan.run(cancel=cancel)
    assert time.monotonic() - t0 < 2.0
    assert info.value.error == "cancelled"
    assert [s["step"] for s in info.value.report] == ["preflight"]


def test_run_async_delivers_events_on_the_loop_thread_and_cancels(silent_server, tmp_path):
    import asyncio

    async def failing():
        seen = []
        me = threading.get_ident()
        plan = spark_deploy.Plan.from_steps(unreachable_config(), ["Preflight"])
        with pytest.raises(spark_deploy.PreflightError):
            await plan.run_async(on_event=lambda e: seen.append((threading.get_ident(), e["event"])))
        assert seen and all(tid == me for tid, _ in seen)
        assert seen[0][1] == "started" and seen[-1][1] == "failed"

    async def cancelled():
        port, _ = silent_server
        plan = spark_deploy.Plan.from_steps(unreachable_config(port, tmp_path), ["Preflight", "FetchCheckpoint"])
        task = asyncio.ensure_future(plan.run_async())
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 2.0

    asyncio.run(failing())
    asyncio.run(cancelled())


def test_jupyter_progress_table_renders_steps_with_bytes():
    import sys

    helpers = sys.modules["spark_deploy._helpers"]
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj)

    progress = helpers._JupyterProgress(lambda obj, display_id: (shown.append(obj), Handle())[1], lambda html: html)
    progress({"event": "started", "source": {"step": "fetch_checkpoint"}, "message": "download"})
    progress({"event": "progress", "source": {"step": "fetch_checkpoint"}, "label": "model.safetensors", "bytes_done": 512, "bytes_total": 2048, "rate_bps": 1024.0, "eta_s": 1.5})
    progress({"event": "finished", "source": {"step": "fetch_checkpoint"}, "duration_ms": 2000, "bytes": 2048})
    assert "<progress value='512' max='2048'" in shown[-1]
    assert "finished" in shown[-1] and "fetch_checkpoint" in shown[-1]
    assert helpers.default_progress() is None  # not in a Jupyter kernel


def test_status_and_logs_read_only():
    dep = spark_deploy.Deployment(unreachable_config())
    with pytest.raises(ValueError, match="no rank 7"):
        dep.logs(rank=7)
    assert dep.logs(rank=0) == ""  # the head's container does not exist
    status = dep.status()  # the worker is unreachable, the head has no container
    assert status["overall"] != "running"
    assert [r["rank"] for r in status["ranks"]] == [0, 1]
    assert status["ranks"][0]["state"] == "absent"
    assert status["ranks"][1]["state"] != "running"


def test_support_bundle_writes_one_archive_without_secrets(tmp_path):
    """A bundle of a deployment that does not run: the head's members, the worker named as
    unreachable in ``index.json``, and neither the HF token nor the API key in any member."""
    import json
    import tarfile

    token, key = "hf_pytest_bundle_token_31337", "sk-pytest-bundle-key-4242"
    toml = tmp_path / "spark-deploy.toml"
    toml.write_text(
        f'[deployment]\nname = "pytest-bundle"\nstate_dir = "{tmp_path}/state"\n'
        '[[nodes]]\nname = "head"\nssh = "local"\n'
        '[[nodes]]\nname = "worker-1"\nssh = "root@127.0.0.1"\nssh_port = 1\n'
        'identity_file = "/nonexistent/spark-deploy-test/id_ed25519"\n'
        'known_hosts = "/nonexistent/spark-deploy-test/known_hosts"\n'
    )
    # The secrets as the environment gives them: HF_TOKEN and SPARK_DEPLOY_API_KEY.
    config = spark_deploy.Config.load(str(toml), env={"HF_TOKEN": token, "SPARK_DEPLOY_API_KEY": key})
    # A saved heal log that echoed both secrets.
    heal = tmp_path / "state" / "watch" / "heals" / "20261201-000000"
    heal.mkdir(parents=True)
    (heal / "rank0.log").write_text(f"Bearer {key} {token}\n")
    dep = spark_deploy.Deployment(config)

    out = tmp_path / "out" / "bundle.tar.gz"
    path = dep.support_bundle(out=out)
    assert path == str(out) and out.is_file()
    assert not (tmp_path / "out" / "bundle.tar.gz.partial").exists()
    with tarfile.open(path) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    for name, data in members.items():
        assert token.encode() not in data and key.encode() not in data, name
    for name in ("index.json", "config.toml", "plan.json", "status.json", "watch/heals/20261201-000000/rank0.log"):
        assert name in members, sorted(members)
    assert b"Bearer ***" in members["watch/heals/20261201-000000/rank0.log"]
    index = json.loads(members["index.json"])
    absent = {a["name"]: a["why"] for a in index["absent"]}
    assert "nodes/worker-1/" in absent and "ranks/rank0.log" in absent, absent

    # Default path: under the state dir.
    default = dep.support_bundle()
    assert default.startswith(str(tmp_path / "state" / "bundles")) and default.endswith(".tar.gz")
