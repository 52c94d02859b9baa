"""Fixtures for the testbed hub tests: the `sd-hub` binary, a generated repo tree, a running hub."""

import json
import os
import pathlib
import queue
import random
import struct
import subprocess
import threading

import pytest

# Keep the developer's token, cache and telemetry out of the tests. Must happen before
# huggingface_hub is imported (it reads its constants at import time).
os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
for _var in (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
):
    os.environ.pop(_var, None)

WORKSPACE = pathlib.Path(__file__).resolve().parents[2]
GATED_TOKEN = "hf_testbed_gated_token_0123456789"


def _cargo_binary(package: str, name: str, env_var: str, profile: str) -> pathlib.Path:
    """`$env_var` when set, else `name` of `package` built (if needed) in cargo profile `profile`."""
    env = os.environ.get(env_var)
    if env:
        return pathlib.Path(env)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", WORKSPACE / "target"))
    subprocess.run(
        ["cargo", "build", "-q", "--profile", profile, "-p", package, "--bin", name],
        cwd=WORKSPACE,
        check=True,
    )
    return target / ("debug" if profile == "dev" else profile) / name


def sd_hub_binary(profile: str = "dev") -> pathlib.Path:
    """The testbed hub and Hub-port driver `sd-hub` (`SD_HUB_BIN` overrides)."""
    return _cargo_binary("spark-deploy-testbed", "sd-hub", "SD_HUB_BIN", profile)


def spark_deploy_binary(profile: str = "dev") -> pathlib.Path:
    """The `spark-deploy` CLI (`SPARK_DEPLOY_BIN` overrides)."""
    return _cargo_binary("spark-deploy-cli", "spark-deploy", "SPARK_DEPLOY_BIN", profile)


def generate_hub_tree(root: pathlib.Path, size: str = "small", seed: int = 5, binary=None) -> dict:
    """The testbed's hub repos (`sd-hub generate`: the test-scale checkpoint, its original model
    with the Engram shards, the kit) below `root`, once. Returns {repo_id: (files, bytes)}."""
    out = subprocess.run(
        [str(binary or sd_hub_binary()), "generate", str(root), "--size", size, "--seed", str(seed)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    repos = {}
    for line in out.splitlines():
        parts = dict(kv.split("=", 1) for kv in line.split())
        repos[parts["repo"]] = (int(parts["files"]), int(parts["bytes"]))
    return repos


def safetensors_bytes(rng: random.Random, tensors: dict) -> bytes:
    """A valid safetensors file: header (padded to 8) + data, tensors given as name -> (dtype, shape)."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I16": 2, "U8": 1}
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        blobs.append(rng.randbytes(n))
        offset += n
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def make_repo_tree(root: pathlib.Path, seed: int = 7) -> dict:
    """Two repos: testorg/tiny (public) and testorg/gated. Returns {repo_id: {path: bytes}}."""
    rng = random.Random(seed)
    repos = {
        "testorg/tiny": {
            "config.json": json.dumps({"model_type": "dsv41-test", "hidden_size": 64}).encode(),
            "README.md": b"# tiny test repo\n",
            # > 10 MB, LFS-like, a parseable safetensors file.
            "model-00001-of-00001.safetensors": safetensors_bytes(
                rng, {"a.weight": ("BF16", (2048, 2600)), "b.bias": ("F32", (1000,))}
            ),
            "nested/deeper/extra.bin": rng.randbytes(300_001),
            "nested/notes.txt": b"nested text file\n",
        },
        "testorg/edge-cases": {
            "empty.txt": b"",
            "dir with space/a b#1.json": b'{"x": 1}',
            "weights/100%.bin": rng.randbytes(4096),
        },
        "testorg/gated": {
            "config.json": b'{"gated": true}',
            "overlay.safetensors": safetensors_bytes(rng, {"x": ("F16", (64, 64))}),
        },
    }
    for repo_id, files in repos.items():
        for rel, data in files.items():
            p = root / repo_id / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    return repos


class Hub:
    def __init__(self, proc, endpoint, commits):
        self.proc, self.endpoint, self.commits = proc, endpoint, commits


def start_hub(root: pathlib.Path, extra_args=(), gated=("testorg/gated",), binary=None) -> Hub:
    args = [str(binary or sd_hub_binary()), "serve", str(root), "--addr", "127.0.0.1:0"]
    for g in gated:
        args += ["--gated", g]
    args += list(extra_args)
    env = dict(os.environ, SD_HUB_TOKEN=GATED_TOKEN)  # the token goes through env, never argv
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    lines: "queue.Queue[str]" = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line.strip())

    threading.Thread(target=pump, daemon=True).start()
    endpoint, commits = None, {}
    first = lines.get(timeout=120)
    assert first.startswith("endpoint="), first
    endpoint = first.split("=", 1)[1]
    expected = len([p for p in root.glob("*/*") if p.is_dir()])
    while len(commits) < expected:
        line = lines.get(timeout=30)
        parts = dict(kv.split("=", 1) for kv in line.split())
        commits[parts["repo"]] = parts["commit"]
    assert endpoint.startswith("http://127.0.0.1:")
    return Hub(proc, endpoint, commits)


@pytest.fixture(scope="session")
def repo_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubroot")
    files = make_repo_tree(root)
    return root, files


@pytest.fixture(scope="session")
def hub(repo_tree):
    root, _ = repo_tree
    h = start_hub(root)
    yield h
    h.proc.terminate()
    h.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def hub_redirect(repo_tree):
    root, _ = repo_tree
    h = start_hub(root, extra_args=["--lfs-redirect"])
    yield h
    h.proc.terminate()
    h.proc.wait(timeout=10)


# --- rank-cache cross-checks: the sd-inputs driver and a generated small checkpoint ---
ROOT = WORKSPACE
HERE = pathlib.Path(__file__).resolve().parent



@pytest.fixture(scope="session")
def sd_inputs():
    path = os.environ.get("SD_INPUTS")
    if path:
        return pathlib.Path(path)
    subprocess.run(
        ["cargo", "build", "-q", "-p", "spark-deploy-testbed", "--bin", "sd-inputs"],
        cwd=ROOT, check=True,
    )
    return ROOT / "target" / "debug" / "sd-inputs"


def run(*args, check=True):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="session")
def small_checkpoint(sd_inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    info = json.loads(run(sd_inputs, "generate", "small", 11, out).stdout)
    return info
