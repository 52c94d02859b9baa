"""The example notebook ``examples/testbed.ipynb`` executed headless (nbclient + ipykernel) against
the testbed: it brings the testbed up, deploys with the Jupyter progress display, chats through
both ranks, reads status and logs, stops, and tears the testbed down in its last cell (this test
tears it down again in any case).

Takes the testbed's fixed names, so it runs only when ``SPARK_DEPLOY_PY_TESTBED=1`` (scripts/test
sets it).
"""

import os
import pathlib
import subprocess

import pytest

import spark_deploy

pytestmark = pytest.mark.skipif(
    os.environ.get("SPARK_DEPLOY_PY_TESTBED") != "1", reason="set SPARK_DEPLOY_PY_TESTBED=1 (the testbed must be free)"
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "testbed.ipynb"


def outputs_text(cell) -> str:
    """Everything a cell showed: streams, plain-text and HTML results, displays."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        for mime in ("text/plain", "text/html"):
            if mime in out.get("data", {}):
                parts.append(out["data"][mime])
    return "\n".join(parts)


def cell_with(nb, snippet: str):
    return next(c for c in nb.cells if c.cell_type == "code" and snippet in c.source)


def test_example_notebook_runs_headless_against_the_testbed(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel inherits this environment: the stand-in engine built by `cargo build --bins`.
    os.environ.setdefault("SPARK_DEPLOY_STANDIN", str(ROOT / "target" / "debug" / "tf-standin"))
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    finally:
        spark_deploy.testbed_down()
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=io.spark-deploy.testbed=1"], capture_output=True, text=True, check=True
    ).stdout
    assert left.strip() == "", "the notebook left testbed containers behind"

    assert "<table>" in outputs_text(cell_with(nb, "deployment.plan()"))
    up = outputs_text(cell_with(nb, "deployment.up()"))
    # The Jupyter progress table (no callback given), then the report's HTML.
    assert "<progress value=" in up and "finished" in up, up[-2000:]
    assert "smoke" in up and "failed" not in up
    assert "'42'" in outputs_text(cell_with(nb, "chat.completions.create"))
    assert "'running'" in outputs_text(cell_with(nb, "deployment.status()"))
    assert outputs_text(cell_with(nb, "deployment.logs(")).strip()
    assert "stop" in outputs_text(cell_with(nb, "deployment.stop()"))
    assert "True" in outputs_text(cell_with(nb, "testbed_down()"))
