"""Deploy onto the testbed from Python: bring it up, show the plan, run it with a progress
callback, stop it. Needs root and a running Docker daemon (like ``spark-deploy demo``).

    python examples/testbed_deploy.py
"""

from __future__ import annotations

from typing import Any

import spark_deploy


def _source(event: dict[str, Any]) -> str:
    """Who speaks: a plan step's name (``{"step": ...}``), a command or a supervisor."""
    source: dict[str, str] = event["source"]
    return next(iter(source.values()), "")


def show(event: dict[str, Any]) -> None:
    """Print one line per interesting event."""
    kind = event["event"]
    if kind == "progress":
        total = event.get("bytes_total")
        print(f"  {_source(event)}: {event['label']} {event['bytes_done']}/{total or '?'} bytes")
    elif kind in ("started", "skipped", "finished", "failed"):
        print(f"{_source(event)}: {kind} {event.get('message') or event.get('reason') or event.get('error') or ''}")


def main() -> int:
    testbed = spark_deploy.testbed_up()
    try:
        deployment = spark_deploy.Deployment(testbed.config)
        print(deployment.plan().steps())
        try:
            report = deployment.up(on_event=show)
        except spark_deploy.StepError as e:
            print(f"{e.step} failed: {e.error}\nremedy: {e.remedy}")
            return 1
        for step in report:
            print(step["step"], step["status"], step["duration_ms"], "ms")
        deployment.stop()
        return 0
    finally:
        testbed.close()
        spark_deploy.testbed_down()


if __name__ == "__main__":
    raise SystemExit(main())
