"""The Python module end to end on the testbed: plan, run with progress events, a chat completion
through both ranks with the ``openai`` client, status and logs, stop; Ctrl-C during the copy to the
worker raises within 2 s and the re-run sends only what is missing; and Ctrl-C once the ranks have
started stops both within 15 s.

Takes the testbed's fixed names, so it runs only when ``SPARK_DEPLOY_PY_TESTBED=1`` (scripts/test
sets it; it runs after the Rust testbed tests and ``test_demo.py``, one at a time).
"""

import hashlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
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

    assert isinstance(testbed.state_dir, pathlib.Path) and (testbed.state_dir / "testbed.json").is_file()
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
            progress.setdefault((e["source"].get("step"), e.get("node"), e["label"]), []).append(e["bytes_done"])
    assert progress, "no progress events"
    # The bytes move: some step on some node reports more than once with growing figures (copy
    # mode ships only small files now, so a single file may report once).
    per_step = {}
    for (step, node, _), v in progress.items():
        per_step.setdefault((step, node), []).extend(v)
    assert any(len(v) > 1 and v[-1] > v[0] for v in per_step.values()), progress

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
    # The stand-in prefills 20 tokens a second here, so Smoke's chat takes seconds and the SIGINT
    # 0.2 s into Smoke lands while `up` still runs (at the default speed Smoke could end first,
    # and the KeyboardInterrupt then hit pytest itself).
    d = testbed.config.to_dict()
    d["engine"]["env"] = {**d["engine"].get("env", {}), "TF_STANDIN_PREFILL_TPS": "20"}
    dep = spark_deploy.Deployment(spark_deploy.Config.from_dict(d))
    fired = []

    def on_event(e):
        if e["event"] == "started" and e["source"].get("step") == "smoke" and not fired:
            fired.append(time.monotonic())
            threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()

    with pytest.raises(KeyboardInterrupt):
        dep.up(on_event=on_event)
    assert fired and time.monotonic() - fired[0] < 15.0
    assert all(r["state"] != "running" for r in dep.status()["ranks"])


FABRIC_BRIDGE = "sd-fabric0"  # the testbed's fabric network; the head's file server sits on it
FABRIC_RATE = "8mbit"  # ~1 MB/s: the ~15 MB the worker needs take ~15 s


def tc(*args: str, check: bool = True) -> str:
    return subprocess.run(["tc", *args], capture_output=True, text=True, check=check).stdout


def fabric_bytes_sent() -> int:
    """Bytes the head has sent onto the fabric bridge (its root qdisc's counter)."""
    m = re.search(r"Sent (\d+) bytes", tc("-s", "qdisc", "show", "dev", FABRIC_BRIDGE, "root"))
    assert m, tc("-s", "qdisc", "show", "dev", FABRIC_BRIDGE)
    return int(m.group(1))


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def worker_copies(config: dict) -> dict[pathlib.Path, pathlib.Path]:
    """Every file ConfigureWorkerStorage (copy mode) gives the worker: its path on the worker's
    disk (the same path on this machine) -> its source on the head. Of the checkpoint only the
    small files (no shards)."""
    head, worker = config["nodes"][0], config["nodes"][1]
    folder = "models--" + config["model"]["id"].replace("/", "--")
    snap = pathlib.Path("hub") / folder / "snapshots" / config["model"]["revision"]
    roots = [(pathlib.Path(config["hub"]["cache"]) / snap, pathlib.Path(worker["hf_cache"]) / snap)]
    for sub in ("kit", "engram"):
        roots.append((pathlib.Path(head["data_dir"]) / sub, pathlib.Path(worker["data_dir"]) / sub))
    pairs = {}
    for i, (src_root, dst_root) in enumerate(roots):
        for src in src_root.rglob("*"):
            rel = src.relative_to(src_root)
            # Of the checkpoint, only its small files: a follower reads its weights from its rank file.
            shard = i == 0 and src.suffix == ".safetensors"
            if src.is_file() and not shard and not any(part.startswith(".") for part in rel.parts):
                pairs[dst_root / rel] = src
    # Of the rank inputs, the token map and the worker's own rank file.
    inputs = pathlib.Path(head["data_dir"]) / "inputs"
    for src in [*inputs.glob("*/dsv41_token_map.json"), *inputs.glob("*/rank-cache/rank1of2-*.bin")]:
        pairs[pathlib.Path(worker["data_dir"]) / "inputs" / src.relative_to(inputs)] = src
    return pairs


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_ctrl_c_during_the_copy_to_the_worker_raises_within_2s_and_the_rerun_sends_only_the_rest(testbed):
    """ConfigureWorkerStorage in copy mode over a fabric slowed to ~1 MB/s (a tbf qdisc on the
    testbed's fabric bridge: the testbed-scale files would otherwise cross in a few ms)."""
    config = testbed.config
    dep = spark_deploy.Deployment(config)
    dep.stop()
    spark_deploy.Plan.from_steps(config, ["Preflight", "FetchCheckpoint", "BuildRankCache"]).run()
    d = config.to_dict()
    assert d["deployment"]["worker_storage"] == "copy"
    worker = d["nodes"][1]
    for top in (worker["hf_cache"], worker["data_dir"]):
        shutil.rmtree(top, ignore_errors=True)  # the worker starts with nothing
    pairs = worker_copies(d)
    manifest = pathlib.Path(worker["data_dir"]) / ".spark-deploy-received.tsv"
    copy = spark_deploy.Plan.from_steps(config, ["ConfigureWorkerStorage"])
    try:
        tc("qdisc", "replace", "dev", FABRIC_BRIDGE, "root", "tbf", "rate", FABRIC_RATE, "burst", "32kb", "latency", "400ms")
        fired: list[float] = []
        progress: list[int] = []

        def sigint() -> None:
            fired.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        def on_event(e):
            # Copy progress comes as files land: SIGINT a second after the first one.
            if e["event"] == "progress" and e["source"].get("step") == "configure_worker_storage":
                progress.append(e["bytes_done"])
                if len(progress) == 1:
                    threading.Timer(1.0, sigint).start()

        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            copy.run(on_event=on_event)
        raised = time.monotonic()
        assert fired, f"no file landed on the worker within {raised - t0:.1f} s"
        latency = raised - fired[0]
        print(f"\nSIGINT {fired[0] - t0:.2f} s into the copy; KeyboardInterrupt {latency * 1000:.0f} ms later")
        assert latency < 2.0, latency

        # Resumable: whole files are correct and in the manifest, partial bytes only in `.partial`
        # files that are prefixes of their source; and no pull outlived the run.
        recorded = {pathlib.Path(line.split("\t")[0]) for line in manifest.read_text().splitlines() if line}
        finished, partial = {}, {}
        for dst, src in pairs.items():
            part = dst.with_name(dst.name + ".partial")
            if dst.exists():
                assert sha256(dst) == sha256(src), f"{dst}: a partial or wrong file under a final name"
                assert dst in recorded, f"{dst} arrived but is not in the manifest"
                finished[dst] = dst.stat()
            if part.exists():
                partial[dst] = part.read_bytes()
                # A prefix of its source; all of it when the interrupt came between the last byte
                # and the check-and-rename (the re-run then only checks and renames it).
                assert len(partial[dst]) <= src.stat().st_size and src.read_bytes().startswith(partial[dst]), part
        assert finished, "no file arrived before the interrupt"
        assert any(partial.values()), f"no partial file: {sorted(map(str, partial))}"
        # Bytes already queued on the throttled link (the tbf queue) still reach the worker's
        # socket after the head's reset, and curl writes them before it sees the reset: let that
        # drain, then no partial may grow any more.
        time.sleep(1.0)
        sizes = {p: p.with_name(p.name + ".partial").stat().st_size for p in partial}
        time.sleep(1.0)
        assert {p: p.with_name(p.name + ".partial").stat().st_size for p in partial} == sizes, "a pull kept writing after the run ended"

        # The re-run (fabric unthrottled, its bytes counted by a plain qdisc) sends only the rest.
        tc("qdisc", "replace", "dev", FABRIC_BRIDGE, "root", "pfifo", "limit", "10000")
        before = fabric_bytes_sent()
        report = copy.run()
        on_fabric = fabric_bytes_sent() - before
    finally:
        tc("qdisc", "del", "dev", FABRIC_BRIDGE, "root", check=False)
    missing = {dst: src.stat().st_size for dst, src in pairs.items() if dst not in finished}
    remainder = sum(missing.values()) - sum(sizes.values())
    print(f"{len(finished)} files arrived before the interrupt, {len(partial)} partial ({sum(sizes.values())} bytes kept); "
          f"the re-run moved {on_fabric} bytes over the fabric for a remainder of {remainder}")
    assert report.ok and report[0]["status"] == "ran", report
    assert report[0]["bytes"] == sum(missing.values())  # the files it sent (finished ones are not)
    for dst, st in finished.items():
        assert (dst.stat().st_ino, dst.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns), f"{dst} was sent again"
    for dst, src in pairs.items():
        assert sha256(dst) == sha256(src), dst
        assert not dst.with_name(dst.name + ".partial").exists()
    # TCP/IP and HTTP headers add ~5 %; a partial sent again from its start would add far more.
    assert remainder <= on_fabric <= remainder * 1.08 + 64 * 1024, (on_fabric, remainder)
