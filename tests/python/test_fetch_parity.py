"""An EMPTY cache filled by `spark-deploy fetch` (the FetchCheckpoint
step, through the real CLI and a config file) holds files byte-identical to what
`huggingface_hub.snapshot_download` fetches from the same testbed hub into another cache, in the
same layout.

The hub serves the generated test-scale repos (`sd-hub generate`: testbed/dsv41-exl3, the original
model testbed/dsv41-original with the Engram shards, the kit testbed/dsv41-kit) and a gated ABLIT
overlay (testbed/dsv41-ablit) that both clients fetch with its token.

What is compared, per repository: the step fetches a *subset* of each repo (its patterns,
`hub_cache.PATTERNS`: e.g. no README, in the overlay only `*.safetensors` and `*.json`), so
`snapshot_download` is given the same patterns as `allow_patterns`, and then
- `refs/`: the same names with the same content (a branch revision writes `refs/main`; a commit
  revision writes no ref, in both clients),
- `snapshots/`: the same commit directories, the same set of relative paths, each entry a symlink
  with the same relative target, resolving to an existing file in that repo's `blobs/`,
- `blobs/`: the same names, the same bytes (and those equal the hub's source files),
- besides, the folder holds only each client's bookkeeping: our `.sd-verified/` (stamps and
  manifest), huggingface_hub's `trees/<commit>.json` listing cache (version 2 writes it, ours does
  not); no `.incomplete` file is left on either side.
The overlay lands in the ABLIT cache only; the genuine cache holds the three other repos only.
Every file the step fetches is whole: it fetches no `bias_vl` byte ranges (the kit ships
`vision/gate_bias_vl.safetensors`; the Hub port's range reads are tested in hub_port.rs).
"""

import json
import os
import pathlib
import random
import subprocess

import pytest
from conftest import GATED_TOKEN, generate_hub_tree, safetensors_bytes, spark_deploy_binary, start_hub
from hub_cache import KIT, MODEL, ORIGINAL, OVERLAY, PATTERNS, cache_layout, repo_folder, sha256_file, write_fetch_config

from huggingface_hub import snapshot_download


@pytest.fixture(scope="module")
def testbed_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("testbed-repos")
    generated = generate_hub_tree(root, "small", 9)
    assert set(generated) == {MODEL, ORIGINAL, KIT}
    # Files neither client may fetch (outside the step's patterns).
    (root / MODEL / "README.md").write_text("# not part of a deployment\n")
    overlay = root / OVERLAY
    overlay.mkdir(parents=True)
    rng = random.Random(41)
    (overlay / "overlay.safetensors").write_bytes(
        safetensors_bytes(rng, {"layers.0.attn.o_proj.weight": ("BF16", (1024, 1536))})
    )
    (overlay / "config.json").write_text('{"abliterated": true}')
    (overlay / "README.md").write_text("# gated overlay\n")
    hub = start_hub(root, gated=(OVERLAY,))
    yield root, hub
    hub.proc.terminate()
    hub.proc.wait(timeout=10)


def test_empty_cache_fetch_matches_snapshot_download(testbed_hub, tmp_path):
    root, hub = testbed_hub
    # Branch revisions for two repos (so `refs/main` is compared), pinned commits for the others.
    revisions = {MODEL: "main", ORIGINAL: hub.commits[ORIGINAL], KIT: hub.commits[KIT], OVERLAY: "main"}
    ours = tmp_path / "ours"
    ours.mkdir()
    cfg = write_fetch_config(ours, hub.endpoint, revisions)
    # The token reaches the CLI through the environment only; HOME keeps `~` away from the user's.
    env = {"PATH": os.environ["PATH"], "HOME": str(ours / "home"), "HF_TOKEN": GATED_TOKEN}
    run = subprocess.run(
        [str(spark_deploy_binary()), "--config", str(cfg), "--json", "fetch"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert GATED_TOKEN not in run.stdout + run.stderr
    (step,) = json.loads(run.stdout.strip().splitlines()[-1])["report"]["steps"]
    assert (step["step"], step["status"]) == ("fetch_checkpoint", "ran"), step

    py = tmp_path / "python"
    py_cache = {repo: py / "hf" for repo in (MODEL, ORIGINAL, KIT)} | {OVERLAY: py / "hf-ablit"}
    for repo, rev in revisions.items():
        snapshot_download(
            repo,
            revision=rev,
            endpoint=hub.endpoint,
            cache_dir=py_cache[repo],
            allow_patterns=PATTERNS[repo],
            token=GATED_TOKEN if repo == OVERLAY else None,
        )

    ours_hub = {repo: ours / "hf" / "hub" for repo in (MODEL, ORIGINAL, KIT)} | {OVERLAY: ours / "hf-ablit" / "hub"}
    for repo, rev in revisions.items():
        mine, theirs = ours_hub[repo] / repo_folder(repo), py_cache[repo] / repo_folder(repo)
        a, b = cache_layout(mine), cache_layout(theirs)
        assert a == b, f"{repo}: our cache and snapshot_download's differ"
        commit = hub.commits[repo]
        assert list(a["snapshots"]) == [commit]
        assert a["refs"] == ({"main": commit} if rev == "main" else {})
        # Byte-identical to the hub's source, and a proper subset where the patterns say so.
        files = a["snapshots"][commit]
        assert files, f"{repo}: nothing fetched"
        for rel, (_, blob) in files.items():
            assert sha256_file(root / repo / rel) == a["blobs"][blob], f"{repo}/{rel} differs from the hub's file"
        source = {p.relative_to(root / repo).as_posix() for p in (root / repo).rglob("*") if p.is_file()}
        if repo in (MODEL, OVERLAY):
            assert "README.md" in source and "README.md" not in files
        if repo in (MODEL, ORIGINAL):
            index = json.loads((root / repo / "model.safetensors.index.json").read_text())
            assert set(index["weight_map"].values()) <= set(files), f"{repo}: a shard of the index is missing"
        # Beside the layout, each client keeps only its own bookkeeping: our verification stamps
        # and manifest; huggingface_hub (>= 2) its tree-listing cache `trees/<commit>.json`.
        assert {p.name for p in mine.iterdir()} - {"blobs", "snapshots", "refs"} == {".sd-verified"}
        assert {p.name for p in theirs.iterdir()} - {"blobs", "snapshots", "refs", "trees"} == set()

    # An empty cache: every byte in the blobs came over the network, as the step reports.
    blob_bytes = sum(p.stat().st_size for h in set(ours_hub.values()) for p in h.glob("models--*/blobs/*"))
    assert step["bytes"] == blob_bytes

    # The overlay is in the ABLIT cache and nowhere in the genuine one (and vice versa).
    folders = lambda d: sorted(p.name for p in d.iterdir() if p.name.startswith("models--"))  # noqa: E731
    assert folders(ours / "hf" / "hub") == sorted(repo_folder(r) for r in (MODEL, ORIGINAL, KIT))
    assert folders(ours / "hf-ablit" / "hub") == [repo_folder(OVERLAY)]
    assert folders(py / "hf") == folders(ours / "hf" / "hub")
    assert folders(py / "hf-ablit") == folders(ours / "hf-ablit" / "hub")
    # The token is written nowhere by our run (caches, stamps, state).
    for p in ours.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert GATED_TOKEN.encode() not in p.read_bytes(), p
