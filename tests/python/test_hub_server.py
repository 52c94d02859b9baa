"""The testbed hub serves `huggingface_hub` correctly, and the Python client and our Hub port share
one cache layout."""

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


def test_empty_files_and_unusual_names(hub, repo_tree, tmp_path):
    _, files = repo_tree
    path = snapshot_download("testorg/edge-cases", revision="main", endpoint=hub.endpoint, cache_dir=tmp_path)
    assert _snapshot_files(pathlib.Path(path)) == files["testorg/edge-cases"]
    ours = _sd_hub("fetch", "--endpoint", hub.endpoint, "--cache", str(tmp_path / "ours"), "--repo", "testorg/edge-cases")
    assert "all 3 files present and verified" in ours.stdout
    assert _snapshot_files(pathlib.Path(str(path).replace(str(tmp_path), str(tmp_path / "ours")))) == files[
        "testorg/edge-cases"
    ]


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


def _sd_hub(*args, env_extra=None, check=True):
    # Our port reads HF_TOKEN / $HF_HOME/token itself: give it an empty home unless a test says otherwise.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "HF_TOKEN")}
    env["HF_HOME"] = "/nonexistent/sd-hub-test-home"
    env.update(env_extra or {})
    return subprocess.run(
        [str(sd_hub_binary()), *args], capture_output=True, text=True, env=env, check=check, timeout=300
    )


def test_python_reads_the_cache_our_port_wrote(hub, repo_tree, tmp_path):
    """Our Hub port writes the standard layout: huggingface_hub finds every file offline."""
    _, files = repo_tree
    sha = hub.commits["testorg/tiny"]
    out = _sd_hub(
        "fetch", "--endpoint", hub.endpoint, "--cache", str(tmp_path), "--repo", "testorg/tiny", "--revision", "main"
    ).stdout
    assert f"commit={sha}" in out
    assert "all 5 files present and verified" in out

    path = snapshot_download("testorg/tiny", revision=sha, cache_dir=tmp_path, local_files_only=True)
    assert pathlib.Path(path) == tmp_path / "models--testorg--tiny" / "snapshots" / sha
    assert _snapshot_files(pathlib.Path(path)) == files["testorg/tiny"]
    # By branch, through refs/main written by our port.
    for name, data in files["testorg/tiny"].items():
        p = hf_hub_download("testorg/tiny", name, revision="main", cache_dir=tmp_path, local_files_only=True)
        assert pathlib.Path(p).read_bytes() == data
    # The Python cache scanner sees one clean repo.
    info = huggingface_hub.scan_cache_dir(tmp_path)
    assert info.warnings == []
    (repo,) = info.repos
    assert repo.repo_id == "testorg/tiny"
    assert {f.file_name for rev in repo.revisions for f in rev.files} == {
        pathlib.Path(n).name for n in files["testorg/tiny"]
    }
    # And a second online download by the Python client fetches nothing new.
    again = snapshot_download("testorg/tiny", revision=sha, endpoint=hub.endpoint, cache_dir=tmp_path)
    assert _snapshot_files(pathlib.Path(again)) == files["testorg/tiny"]


def test_our_verify_only_accepts_a_cache_written_by_snapshot_download(hub, repo_tree, tmp_path):
    sha = hub.commits["testorg/tiny"]
    snapshot_download("testorg/tiny", revision="main", endpoint=hub.endpoint, cache_dir=tmp_path)
    ok = _sd_hub("verify", "--cache", str(tmp_path), "--repo", "testorg/tiny", "--revision", sha)
    assert "all 5 files present and verified" in ok.stdout
    ok = _sd_hub("verify", "--cache", str(tmp_path), "--repo", "testorg/tiny", "--revision", "main")
    assert "all 5 files present and verified" in ok.stdout
    # Our verify reads content, not just names: flip one byte of the shard's blob.
    blob = pathlib.Path(
        os.path.realpath(tmp_path / "models--testorg--tiny" / "snapshots" / sha / "model-00001-of-00001.safetensors")
    )
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    bad = _sd_hub("verify", "--cache", str(tmp_path), "--repo", "testorg/tiny", "--revision", sha, check=False)
    assert bad.returncode == 1
    assert "model-00001-of-00001.safetensors" in bad.stdout and "sha256" in bad.stdout


def test_our_fetch_resumes_a_partial_file_left_by_python(hub, repo_tree, tmp_path):
    """A `.incomplete` blob left by an interrupted huggingface_hub download is continued, not restarted."""
    import hashlib

    _, files = repo_tree
    data = files["testorg/tiny"]["model-00001-of-00001.safetensors"]
    blobs = tmp_path / "models--testorg--tiny" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (hashlib.sha256(data).hexdigest() + ".incomplete")).write_bytes(data[: len(data) // 2])
    out = _sd_hub("fetch", "--endpoint", hub.endpoint, "--cache", str(tmp_path), "--repo", "testorg/tiny",
                  "--revision", hub.commits["testorg/tiny"], "--include", "*.safetensors").stdout
    assert f"{len(data) - len(data) // 2} bytes transferred" in out, out
    assert (blobs / hashlib.sha256(data).hexdigest()).read_bytes() == data
    assert not list(blobs.glob("*.incomplete"))


def test_gated_fetch_by_our_port_names_the_repo_and_hides_the_token(hub, tmp_path):
    args = ["fetch", "--endpoint", hub.endpoint, "--cache", str(tmp_path), "--repo", "testorg/gated"]
    no = _sd_hub(*args, env_extra={"HF_HOME": str(tmp_path / "home")}, check=False)
    assert no.returncode != 0
    assert "testorg/gated" in no.stderr and "HF_TOKEN" in no.stderr and "no token" in no.stderr
    bad = _sd_hub(*args, env_extra={"HF_TOKEN": "hf_wrong_secret_xyz"}, check=False)
    assert bad.returncode != 0 and "rejected" in bad.stderr
    assert "hf_wrong_secret_xyz" not in bad.stderr + bad.stdout
    # The token file of `hf auth login` is honoured, token never in argv.
    home = tmp_path / "home2"
    home.mkdir()
    (home / "token").write_text(GATED_TOKEN)
    env = {"HF_HOME": str(home)}
    good = _sd_hub(*args, env_extra=env)
    assert "all 2 files present and verified" in good.stdout
    assert GATED_TOKEN not in good.stdout + good.stderr


def _layout(cache: pathlib.Path, repo: str) -> dict:
    """Everything the standard layout says about a repo: snapshot links, blob names and sizes, refs."""
    base = cache / ("models--" + repo.replace("/", "--"))
    links = {
        p.relative_to(base / "snapshots").as_posix(): os.readlink(p)
        for p in (base / "snapshots").rglob("*")
        if p.is_symlink()
    }
    blobs = {p.name: p.stat().st_size for p in (base / "blobs").iterdir()}
    refs = {p.name: p.read_text() for p in (base / "refs").iterdir()} if (base / "refs").exists() else {}
    return {"links": links, "blobs": blobs, "refs": refs}


def test_our_cache_has_the_same_layout_as_pythons(hub, tmp_path):
    for repo in ("testorg/tiny", "testorg/edge-cases"):
        snapshot_download(repo, revision="main", endpoint=hub.endpoint, cache_dir=tmp_path / "py")
        _sd_hub("fetch", "--endpoint", hub.endpoint, "--cache", str(tmp_path / "ours"), "--repo", repo)
        assert _layout(tmp_path / "ours", repo) == _layout(tmp_path / "py", repo)
