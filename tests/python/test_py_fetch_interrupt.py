"""Ctrl-C during a download: the FetchCheckpoint step against the testbed hub.

``sd-hub generate`` writes the testbed's test-scale checkpoint (the three repositories a deployment
fetches) and ``sd-hub serve --rate-limit`` serves it on loopback, pacing every transfer so the
download takes several seconds. SIGINT arrives from a timer thread once progress events show
bytes arriving; the run must raise ``KeyboardInterrupt`` within 2 s and leave resumable state (a
``.incomplete`` partial that is a prefix of its file, every blob under a final name complete and
correct). A second run, against an unpaced hub over the same tree, must transfer exactly the
remainder: the hub's own request log counts the body bytes it sent.

Traffic goes only to the ``sd-hub`` this test starts on 127.0.0.1; no Docker, no testbed.
"""

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

import spark_deploy
from conftest import sd_hub_binary, start_hub

MODEL, ORIGINAL, KIT = "testbed/dsv41-exl3", "testbed/dsv41-original", "testbed/dsv41-kit"
RATE = 256 * 1024  # bytes per second per transfer: the 2.6 MB shards take ~10 s each
SIGINT_AFTER = 512 * 1024  # bytes the progress events must show before SIGINT
SLACK = 64 * 1024  # bytes the second run may send beyond the exact remainder


@pytest.fixture(scope="module")
def checkpoint_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("testbed-repos")
    subprocess.run([str(sd_hub_binary()), "generate", str(root)], check=True, capture_output=True)
    return root


def fetch_config(hub, tmp: pathlib.Path) -> spark_deploy.Config:
    """The default config fetching the testbed repos from ``hub`` into ``tmp/hf``; the worker
    (never contacted by FetchCheckpoint) is at ``127.0.0.1`` port 1."""
    d = spark_deploy.Config.load(None, env={}).to_dict()
    d["deployment"].update(name="pytest-py-fetch", state_dir=str(tmp / "state"))
    d["hub"].update(
        endpoint=hub.endpoint,
        cache=str(tmp / "hf"),
        ablit_cache=str(tmp / "hf-ablit"),
        token_file=str(tmp / "no-token"),
    )
    d["model"].update(
        id=MODEL,
        revision=hub.commits[MODEL],
        engram_repo=ORIGINAL,
        engram_revision=hub.commits[ORIGINAL],
        engram_files=["*.safetensors"],
        kit_repo=KIT,
        kit_revision=hub.commits[KIT],
    )
    d["nodes"][1].update(ssh="root@127.0.0.1", ssh_port=1)
    return spark_deploy.Config.from_dict(d)


def cache_dir(tmp: pathlib.Path, repo: str) -> pathlib.Path:
    """Where the hub cache under ``tmp/hf`` keeps ``repo``."""
    return tmp / "hf" / "hub" / ("models--" + repo.replace("/", "--"))


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def contents_by_etag(repo_dir: pathlib.Path) -> dict[str, bytes]:
    """Every file of a served repo under both names the hub may give it (sha256, git sha1)."""
    out = {}
    for p in repo_dir.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            out[hashlib.sha256(data).hexdigest()] = data
            out[git_sha1(data)] = data
    return out


def unique_bytes(repo_dir: pathlib.Path) -> int:
    """Bytes a fetch of the whole repo transfers (identical files are one blob)."""
    return sum(len(d) for d in {p.read_bytes() for p in repo_dir.rglob("*") if p.is_file()})


def served_bytes(endpoint: str) -> int:
    with urllib.request.urlopen(f"{endpoint}/_testbed/requests", timeout=10) as r:
        log = json.load(r)
    return sum(rec["body_bytes"] for rec in log if rec["method"] == "GET")


def stop(hub) -> None:
    hub.proc.terminate()
    hub.proc.wait(timeout=10)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_sigint_during_a_download_raises_within_2s_and_the_rerun_fetches_only_the_rest(checkpoint_tree, tmp_path):
    paced = start_hub(checkpoint_tree, ["--rate-limit", str(RATE)], gated=())
    try:
        plan = spark_deploy.Plan.from_steps(fetch_config(paced, tmp_path), ["FetchCheckpoint"])
        progress: list[int] = []
        fired: list[float] = []

        def sigint() -> None:
            fired.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        def on_event(e):
            if e["event"] == "progress":
                progress.append(e["bytes_done"])
                if e["bytes_done"] >= SIGINT_AFTER and not fired:
                    threading.Timer(0.0, sigint).start()

        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            plan.run(on_event=on_event)
        raised = time.monotonic()
    finally:
        stop(paced)
    assert fired, f"no SIGINT sent; progress seen: {progress[-5:]}"
    latency = raised - fired[0]
    print(f"\nSIGINT after {fired[0] - t0:.2f} s of download at {progress[-1]} bytes; KeyboardInterrupt {latency * 1000:.0f} ms later")
    assert latency < 2.0, latency
    assert len(progress) > 1 and progress == sorted(progress) and progress[-1] > progress[0]

    # Resumable: partial bytes only in `.incomplete` files, each a prefix of its file; every blob
    # under a final name is complete and correct. The step fetches the kit first, so the partial
    # may sit in any of the three repositories' caches.
    partial, final = {}, {}
    for repo in (MODEL, ORIGINAL, KIT):
        blobs = cache_dir(tmp_path, repo) / "blobs"
        sources = contents_by_etag(checkpoint_tree / repo)
        for p in blobs.iterdir() if blobs.is_dir() else ():
            data = p.read_bytes()
            if p.name.endswith(".incomplete"):
                etag = p.name.removesuffix(".incomplete")
                assert etag in sources, f"{repo}: {etag}"
                assert len(data) < len(sources[etag]) and sources[etag].startswith(data), f"{repo}: {etag}"
                partial[(repo, etag)] = data
            else:
                assert sources.get(p.name) == data, f"{repo}: {p.name}: a partial or wrong file under a final name"
                final[(repo, p.name)] = data
    assert any(partial.values()), f"no partial download left: {sorted(partial)} {sorted(final)}"
    present = sum(map(len, partial.values())) + sum(map(len, final.values()))

    # The re-run (unpaced hub, same tree, same commits) moves exactly the remainder.
    hub = start_hub(checkpoint_tree, gated=())
    try:
        report = spark_deploy.Plan.from_steps(fetch_config(hub, tmp_path), ["FetchCheckpoint"]).run(on_event=lambda e: None)
        served = served_bytes(hub.endpoint)
    finally:
        stop(hub)
    total = sum(unique_bytes(checkpoint_tree / r) for r in (MODEL, ORIGINAL, KIT))
    remainder = total - present
    print(f"kept {present} of {total} bytes; the re-run transferred {served} (remainder {remainder})")
    assert report.ok and report[0]["status"] == "ran", report
    assert report[0]["bytes"] == served
    assert remainder <= served <= remainder + SLACK, (served, remainder)
    for repo in (MODEL, ORIGINAL, KIT):
        assert not list((cache_dir(tmp_path, repo) / "blobs").glob("*.incomplete")), repo
    snapshot = cache_dir(tmp_path, MODEL) / "snapshots" / paced.commits[MODEL]
    for src in (checkpoint_tree / MODEL).iterdir():
        assert (snapshot / src.name).read_bytes() == src.read_bytes(), src.name
