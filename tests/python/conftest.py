"""Shared fixtures: the `sd-inputs` driver (built on demand) and a generated small checkpoint."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def sd_inputs():
    path = os.environ.get("SD_INPUTS")
    if path:
        return Path(path)
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
