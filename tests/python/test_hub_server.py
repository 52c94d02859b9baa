"""The testbed hub serves `huggingface_hub` correctly (issue 3 item 3), and the Python client and our
Hub port share one cache layout (issue 5)."""

import os
import pathlib
import subprocess

import pytest
from conftest import GATED_TOKEN, sd_hub_binary

import huggingface_hub
from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError


def _snapshot_files(snapshot: pathlib.Path) -> dict:
    return {
        p.relative_to(snapshot).as_posix(): p.read_bytes()
        for p in snapshot.rglob("*")
        if p.is_file()
    }


@pytest.mark.parametrize("fixture", ["hub", "hub_redirect"])
def test_snapshot_download_is_byte_identical(request, repo_tree, tmp_path, fixture):
    hub = request.getfixturevalue(fixture)
    _, files = repo_tree
    sha = hub.commits["testorg/tiny"]
    path = snapshot_download(
        "testorg/tiny", revision=sha, endpoint=hub.endpoint, cache_dir=tmp_path
    )
    snapshot = pathlib.Path(path)
    assert snapshot == tmp_path / "models--testorg--tiny" / "snapshots" / sha
    assert _snapshot_files(snapshot) == files["testorg/tiny"]
    # Standard layout: snapshot entries are relative symlinks into blobs/, LFS blobs named by sha256.
    import hashlib

    st = snapshot / "model-00001-of-00001.safetensors"
    assert st.is_symlink()
    target = os.readlink(st)
    assert target.startswith("../../blobs/")
    data = files["testorg/tiny"]["model-00001-of-00001.safetensors"]
    assert pathlib.Path(target).name == hashlib.sha256(data).hexdigest()
    nested = snapshot / "nested/deeper/extra.bin"
    assert os.readlink(nested).startswith("../../../../blobs/")
    assert not list((tmp_path / "models--testorg--tiny" / "blobs").glob("*.incomplete"))


def test_branch_resolves_to_the_pinned_commit(hub, repo_tree, tmp_path):
    _, files = repo_tree
    path = snapshot_download("testorg/tiny", revision="main", endpoint=hub.endpoint, cache_dir=tmp_path)
    assert pathlib.Path(path).name == hub.commits["testorg/tiny"]
    ref = tmp_path / "models--testorg--tiny" / "refs" / "main"
    assert ref.read_text() == hub.commits["testorg/tiny"]
    assert _snapshot_files(pathlib.Path(path)) == files["testorg/tiny"]


def test_unknown_revision_is_refused(hub, tmp_path):
    with pytest.raises(huggingface_hub.errors.RevisionNotFoundError):
        snapshot_download("testorg/tiny", revision="nope", endpoint=hub.endpoint, cache_dir=tmp_path)


def test_gated_repo_refuses_without_token_and_works_with_it(hub, repo_tree, tmp_path):
    _, files = repo_tree
    sha = hub.commits["testorg/gated"]
    with pytest.raises(GatedRepoError) as no_token:
        snapshot_download("testorg/gated", revision=sha, endpoint=hub.endpoint, cache_dir=tmp_path / "a")
    assert no_token.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as bad_token:
        snapshot_download(
            "testorg/gated", revision=sha, endpoint=hub.endpoint, cache_dir=tmp_path / "b", token="hf_wrong"
        )
    assert bad_token.value.response.status_code == 403
    path = snapshot_download(
        "testorg/gated", revision=sha, endpoint=hub.endpoint, cache_dir=tmp_path / "c", token=GATED_TOKEN
    )
    assert _snapshot_files(pathlib.Path(path)) == files["testorg/gated"]


def test_python_resumes_from_incomplete_file_with_a_range(hub, repo_tree, tmp_path):
    """huggingface_hub continues `blobs/<etag>.incomplete` with a Range request; our server answers 206."""
    import hashlib

    _, files = repo_tree
    sha = hub.commits["testorg/tiny"]
    data = files["testorg/tiny"]["model-00001-of-00001.safetensors"]
    blobs = tmp_path / "models--testorg--tiny" / "blobs"
    blobs.mkdir(parents=True)
    partial = blobs / (hashlib.sha256(data).hexdigest() + ".incomplete")
    partial.write_bytes(data[: len(data) // 3])
    path = hf_hub_download(
        "testorg/tiny", "model-00001-of-00001.safetensors", revision=sha, endpoint=hub.endpoint, cache_dir=tmp_path
    )
    assert pathlib.Path(path).read_bytes() == data
