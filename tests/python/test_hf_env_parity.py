"""The Hugging Face environment variables mean to spark-deploy what they mean to huggingface_hub.

For each variable (HF_HOME, HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, XDG_CACHE_HOME, HF_TOKEN_PATH,
HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE, and some of their combinations), with nothing else in the
environment but PATH and a temporary HOME:

- huggingface_hub (its `constants`, `get_token()`, read in a fresh interpreter) and
  `spark-deploy --json config check` resolve the same hub cache, token file, endpoint and offline
  flag; where huggingface_hub finds a token in the environment, spark-deploy says so too (it never
  prints the token). Decoy token files hold a wrong token wherever a weaker rule would look.
- the token each resolves is the one the testbed hub accepts for a gated repository: `spark-deploy
  fetch` with ABLIT=1 fetches the gated overlay, `hf_hub_download` fetches a gated file;
- a file fetched by one is found by the other, both ways: everything `spark-deploy fetch` put in
  the cache is found by `try_to_load_from_cache` and by `hf_hub_download` under HF_HUB_OFFLINE=1
  (same paths); after emptying the cache, `snapshot_download` fills it and `spark-deploy fetch`
  under HF_HUB_OFFLINE=1 uses it, with HF_ENDPOINT pointing at a loopback listener that records
  every connection: none is made.

And offline mode names what is missing: with one shard removed, `spark-deploy fetch` under
HF_HUB_OFFLINE=1 fails naming that file and a remedy, again without a connection.
"""

import json
import os
import pathlib
import random
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import GATED_TOKEN, generate_hub_tree, safetensors_bytes, spark_deploy_binary, start_hub
from hub_cache import KIT, MODEL, ORIGINAL, OVERLAY, PATTERNS, repo_folder, write_fetch_config

WRONG_TOKEN = "hf_decoy_token_the_hub_refuses_00000"


@pytest.fixture(scope="module")
def testbed_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-env-repos")
    assert set(generate_hub_tree(root, "small", 13)) == {MODEL, ORIGINAL, KIT}
    overlay = root / OVERLAY
    overlay.mkdir(parents=True)
    rng = random.Random(43)
    (overlay / "overlay.safetensors").write_bytes(safetensors_bytes(rng, {"w": ("BF16", (256, 256))}))
    (overlay / "config.json").write_text('{"abliterated": true}')
    hub = start_hub(root, gated=(OVERLAY,))
    yield root, hub
    hub.proc.terminate()
    hub.proc.wait(timeout=10)


class ConnectionRecorder:
    """A loopback listener that accepts and records every connection, answering none."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.endpoint = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def count(self) -> int:
        """Connections so far, after giving one still in the accept queue time to be seen."""
        time.sleep(0.3)
        return self.connections

    def close(self):
        self.sock.close()


@pytest.fixture
def recorder():
    r = ConnectionRecorder()
    yield r
    r.close()


# What huggingface_hub resolves, in an interpreter that sees only `env`.
PY_VIEW = """
import json
from huggingface_hub import constants, get_token
print(json.dumps({
    "hub_cache": constants.HF_HUB_CACHE,
    "token_path": constants.HF_TOKEN_PATH,
    "token": get_token(),
    "endpoint": constants.ENDPOINT,
    "offline": constants.HF_HUB_OFFLINE,
}))
"""

# Every file given is found in the cache by huggingface_hub with no network.
PY_FIND = """
import json, sys
from huggingface_hub import hf_hub_download, try_to_load_from_cache
found = {}
for repo, revision, files in json.loads(sys.argv[1]):
    for f in files:
        cached = try_to_load_from_cache(repo, f, revision=revision)
        downloaded = hf_hub_download(repo, f, revision=revision)
        found[repo + "/" + f] = [cached if isinstance(cached, str) else None, downloaded]
print(json.dumps(found))
"""

# snapshot_download of each (repo, revision, patterns) into the cache the environment names.
PY_FETCH = """
import json, sys
from huggingface_hub import snapshot_download
for repo, revision, patterns in json.loads(sys.argv[1]):
    snapshot_download(repo, revision=revision, allow_patterns=patterns)
"""


def python(env, script, *args):
    run = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def spark(env, cfg, *args):
    return subprocess.run(
        [str(spark_deploy_binary()), "--config", str(cfg), "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def spark_view(env, cfg):
    run = spark(env, cfg, "config", "check")
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout)


def write_config(d: pathlib.Path, revisions: dict, ablit: bool) -> pathlib.Path:
    """A fetch config naming the testbed repos, and nothing of the hub but the ABLIT cache: the
    cache, token file and endpoint come from the environment."""
    return write_fetch_config(d, None, revisions, ablit=ablit)


def token_file(path: pathlib.Path, token: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")


# name -> (environment below the test's directory `t`, files to write {path: token}, whether the
# right token is reachable). Decoys hold WRONG_TOKEN where a weaker rule would look.
def cases(t: pathlib.Path):
    home = t / "home"
    default_token = home / ".cache/huggingface/token"
    return {
        "defaults": ({}, {default_token: GATED_TOKEN}, True),
        "HF_HOME": ({"HF_HOME": str(t / "hfhome")}, {t / "hfhome/token": GATED_TOKEN, default_token: WRONG_TOKEN}, True),
        "HF_HUB_CACHE": ({"HF_HUB_CACHE": str(t / "cache/hub")}, {default_token: GATED_TOKEN}, True),
        "HUGGINGFACE_HUB_CACHE": ({"HUGGINGFACE_HUB_CACHE": str(t / "legacy/hub")}, {}, False),
        "HF_HUB_CACHE over HF_HOME": (
            {"HF_HOME": str(t / "hfhome"), "HF_HUB_CACHE": str(t / "cache/hub")},
            {t / "hfhome/token": GATED_TOKEN},
            True,
        ),
        "XDG_CACHE_HOME": (
            {"XDG_CACHE_HOME": str(t / "xdg")},
            {t / "xdg/huggingface/token": GATED_TOKEN, default_token: WRONG_TOKEN},
            True,
        ),
        "HF_TOKEN_PATH": (
            {"HF_HOME": str(t / "hfhome"), "HF_TOKEN_PATH": str(t / "secret/tok")},
            {t / "secret/tok": GATED_TOKEN, t / "hfhome/token": WRONG_TOKEN},
            True,
        ),
        "HF_TOKEN": ({"HF_TOKEN": GATED_TOKEN}, {default_token: WRONG_TOKEN}, True),
        "HF_HOME with $VAR and ~": ({"HF_HOME": "~/$SUB/hf", "SUB": "nested"}, {}, False),
    }


CASES = list(cases(pathlib.Path("/")))


def base_env(t: pathlib.Path, endpoint: str, extra: dict) -> dict:
    env = {"PATH": os.environ["PATH"], "HOME": str(t / "home"), "HF_ENDPOINT": endpoint}
    env.update(extra)
    return env


def snapshot_files(snapshot: pathlib.Path) -> list:
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir())


@pytest.mark.parametrize("case", CASES)
def test_same_cache_token_and_files_both_ways(testbed_hub, tmp_path, recorder, case):
    root, hub = testbed_hub
    extra, files, has_token = cases(tmp_path)[case]
    for path, token in files.items():
        token_file(path, token)
    env = base_env(tmp_path, hub.endpoint, extra)
    revisions = {MODEL: "main", ORIGINAL: hub.commits[ORIGINAL], KIT: "main"}
    cfg = write_config(tmp_path, revisions, ablit=has_token)

    # Same cache, token file, endpoint and offline flag; the same token.
    py = json.loads(python(env, PY_VIEW))
    sd = spark_view(env, cfg)["hub"]
    assert os.path.realpath(sd["hub_cache"]) == os.path.realpath(py["hub_cache"]), (sd, py)
    assert py["hub_cache"].startswith(str(tmp_path)), py
    assert sd["token_file"] == py["token_path"]
    assert sd["endpoint"] == py["endpoint"] == hub.endpoint
    assert sd["offline"] is py["offline"] is False
    if "HF_TOKEN" in extra:
        assert sd["token"] == {"from": "environment"}
    elif has_token:
        assert sd["token"] == {"from": "file", "path": py["token_path"]}
    else:
        assert sd["token"] == {"from": "absent", "looked_in": py["token_path"]}
    assert py["token"] == (GATED_TOKEN if has_token else None)

    # spark-deploy fetches (the gated overlay too, which the hub serves only for GATED_TOKEN) ...
    run = spark(env, cfg, "fetch")
    assert run.returncode == 0, run.stdout + run.stderr
    assert GATED_TOKEN not in run.stdout + run.stderr
    hub_cache = pathlib.Path(py["hub_cache"])
    wanted = []
    for repo in (MODEL, ORIGINAL, KIT):
        commit = hub.commits[repo]
        snap = hub_cache / repo_folder(repo) / "snapshots" / commit
        names = snapshot_files(snap)
        assert names, f"spark-deploy fetched nothing of {repo} into {hub_cache}"
        wanted.append([repo, revisions[repo], names])
    if has_token:
        assert list((tmp_path / "hf-ablit/hub" / repo_folder(OVERLAY) / "snapshots").iterdir())

    # ... and huggingface_hub finds every file in the same place with no network.
    found = json.loads(python(dict(env, HF_HUB_OFFLINE="1", HF_ENDPOINT=recorder.endpoint), PY_FIND, json.dumps(wanted)))
    for repo, _, names in wanted:
        snap = hub_cache / repo_folder(repo) / "snapshots" / hub.commits[repo]
        for name in names:
            cached, downloaded = found[f"{repo}/{name}"]
            assert cached == downloaded == str(snap / name), (repo, name, cached, downloaded)
    if has_token:
        # huggingface_hub's own token opens the gated repo too.
        got = python(
            env,
            "from huggingface_hub import hf_hub_download; print(hf_hub_download(%r, 'config.json'))" % OVERLAY,
        )
        assert pathlib.Path(got.strip()).read_text() == '{"abliterated": true}'

    # The other way: an empty cache filled by snapshot_download, used by spark-deploy offline.
    shutil.rmtree(hub_cache)
    python(env, PY_FETCH, json.dumps([[repo, revisions[repo], PATTERNS[repo]] for repo in (MODEL, ORIGINAL, KIT)]))
    plain = write_config(tmp_path, revisions, ablit=False)
    offline_env = dict(env, HF_HUB_OFFLINE="1", HF_ENDPOINT=recorder.endpoint)
    run = spark(offline_env, plain, "fetch")
    assert run.returncode == 0, run.stdout + run.stderr
    (step,) = json.loads(run.stdout.strip().splitlines()[-1])["report"]["steps"]
    assert step["status"] == "skipped", step
    assert recorder.count() == 0, "offline spark-deploy connected to HF_ENDPOINT"


@pytest.mark.parametrize(
    "extra",
    [
        {"HF_HUB_OFFLINE": "1"},
        {"HF_HUB_OFFLINE": "true"},
        {"HF_HUB_OFFLINE": "0"},
        {"HF_HUB_OFFLINE": "no"},
        {"TRANSFORMERS_OFFLINE": "YES"},
        {"TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "0"},
        {"TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": ""},
        {"HF_ENDPOINT": "http://127.0.0.1:9/"},
    ],
    ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()),
)
def test_offline_flag_and_endpoint_read_alike(tmp_path, extra):
    env = dict(base_env(tmp_path, "http://127.0.0.1:9", {}), **extra)
    cfg = write_config(tmp_path, {MODEL: "main", ORIGINAL: "main", KIT: "main"}, ablit=False)
    py = json.loads(python(env, PY_VIEW))
    sd = spark_view(env, cfg)
    assert sd["hub"]["offline"] is py["offline"]
    assert sd["hub"]["endpoint"] == py["endpoint"]
    # config check names each variable that set a key.
    shown = {(o["var"], o["key"]) for o in sd["overrides"]}
    for var, value in extra.items():
        if value:
            key = "hub.endpoint" if var == "HF_ENDPOINT" else "hub.offline"
            assert (var, key) in shown, sd["overrides"]


def test_offline_names_the_missing_file_without_a_connection(testbed_hub, tmp_path, recorder):
    root, hub = testbed_hub
    env = base_env(tmp_path, hub.endpoint, {"HF_HOME": str(tmp_path / "hf")})
    revisions = {MODEL: hub.commits[MODEL], ORIGINAL: hub.commits[ORIGINAL], KIT: hub.commits[KIT]}
    cfg = write_config(tmp_path, revisions, ablit=False)
    run = spark(env, cfg, "fetch")
    assert run.returncode == 0, run.stdout + run.stderr
    snap = tmp_path / "hf/hub" / repo_folder(MODEL) / "snapshots" / hub.commits[MODEL]
    index = json.loads((snap / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (snap / shard).unlink()

    offline = dict(env, HF_HUB_OFFLINE="1", HF_ENDPOINT=recorder.endpoint)
    run = spark(offline, cfg, "fetch")
    assert run.returncode != 0, run.stdout
    out = json.loads(run.stdout.strip().splitlines()[-1])
    text = json.dumps(out)
    assert f"{shard} is missing" in text, text
    assert "HF_HUB_OFFLINE unset" in text, text
    assert recorder.count() == 0
    # Online again, the same fetch puts back exactly that file.
    run = spark(env, cfg, "fetch")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (snap / shard).is_file()


def test_the_recorder_sees_a_fetch_that_is_not_offline(tmp_path, recorder):
    """The control of the zero-connection checks: the same fetch, not offline, does connect."""
    env = base_env(tmp_path, recorder.endpoint, {"HF_HOME": str(tmp_path / "hf")})
    cfg = write_config(tmp_path, {MODEL: "main", ORIGINAL: "main", KIT: "main"}, ablit=False)
    run = spark(env, cfg, "fetch")
    assert run.returncode != 0, run.stdout
    assert recorder.count() > 0
