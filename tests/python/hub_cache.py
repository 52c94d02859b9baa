"""Shared by test_fetch_parity.py and bench_fetch.py: the FetchCheckpoint step's repos and patterns,
a `spark-deploy` config pointing at the testbed hub, and the HF cache layout of one repo reduced to
comparable data."""

import hashlib
import os
import pathlib

MODEL, ORIGINAL, KIT, OVERLAY = (
    "testbed/dsv41-exl3",
    "testbed/dsv41-original",
    "testbed/dsv41-kit",
    "testbed/dsv41-ablit",
)

# The patterns of FetchCheckpoint (crates/spark-deploy-core/src/steps/fetch.rs) for a config with
# `engram_files = ["*.safetensors"]`: what `snapshot_download` gets as `allow_patterns`.
PATTERNS = {
    MODEL: [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
        "*.safetensors",
    ],
    ORIGINAL: ["config.json", "model.safetensors.index.json", "*.safetensors"],
    KIT: ["kit/**"],
    OVERLAY: ["*.safetensors", "*.json"],
}


def repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def cache_layout(repo_dir: pathlib.Path) -> dict:
    """One repo folder of an HF cache, checked and reduced to comparable data:
    `blobs` {name: sha256 of the bytes}, `snapshots` {commit: {relative path: (link target, blob)}},
    `refs` {name: content}. Asserts no `.incomplete` blob is left and that every snapshot entry
    is a symlink resolving to an existing file in this folder's `blobs/`."""
    blobs_dir = repo_dir / "blobs"
    blobs = {p.name: sha256_file(p) for p in sorted(blobs_dir.iterdir())}
    assert not [b for b in blobs if b.endswith(".incomplete")], f"partial blob left in {blobs_dir}"
    snapshots = {}
    for commit_dir in sorted((repo_dir / "snapshots").iterdir()):
        entries = {}
        for p in sorted(commit_dir.rglob("*")):
            if p.is_dir() and not p.is_symlink():
                continue
            assert p.is_symlink(), f"{p} is not a symlink"
            target = os.readlink(p)
            resolved = pathlib.Path(os.path.realpath(p))
            assert resolved.parent == blobs_dir.resolve(), f"{p} -> {target} is not in {blobs_dir}"
            assert resolved.is_file(), f"{p} -> {target} dangles"
            entries[p.relative_to(commit_dir).as_posix()] = (target, resolved.name)
        snapshots[commit_dir.name] = entries
    refs_dir = repo_dir / "refs"
    refs = (
        {p.relative_to(refs_dir).as_posix(): p.read_text() for p in refs_dir.rglob("*") if p.is_file()}
        if refs_dir.exists()
        else {}
    )
    return {"blobs": blobs, "snapshots": snapshots, "refs": refs}


def write_fetch_config(
    dir_: pathlib.Path, endpoint: str | None, revisions: dict, ablit: bool | None = None
) -> pathlib.Path:
    """`dir_/spark-deploy.toml` fetching the testbed repos at `revisions` ({repo: revision}; the
    overlay, with ABLIT on, only when it is a key unless `ablit` says) from `endpoint` into
    `dir_/hf` (`dir_/hf-ablit`). With `endpoint` None the hub's endpoint, cache and token file are
    left to the environment (only the ABLIT cache is set)."""
    ablit = OVERLAY in revisions if ablit is None else ablit
    hub = (
        f"""ablit_cache = "{dir_ / 'hf-ablit'}"
"""
        if endpoint is None
        else f"""endpoint = "{endpoint}"
cache = "{dir_ / 'hf'}"
ablit_cache = "{dir_ / 'hf-ablit'}"
token_file = "{dir_ / 'no-token-file'}"
"""
    )
    cfg = dir_ / "spark-deploy.toml"
    cfg.write_text(
        f"""
[deployment]
state_dir = "{dir_ / 'state'}"

[model]
id = "{MODEL}"
revision = "{revisions[MODEL]}"
engram_repo = "{ORIGINAL}"
engram_revision = "{revisions[ORIGINAL]}"
engram_files = ["*.safetensors"]
kit_repo = "{KIT}"
kit_revision = "{revisions[KIT]}"
ablit = {"true" if ablit else "false"}
ablit_id = "{OVERLAY}"
ablit_revision = "{revisions.get(OVERLAY, 'main')}"

[hub]
{hub}
[[nodes]]
name = "head"
ssh = "local"

[[nodes]]
name = "worker-1"
ssh = "root@127.0.0.1"
"""
    )
    return cfg
