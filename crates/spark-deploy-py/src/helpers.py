"""Pure-Python parts of ``spark_deploy``: the report type and the HTML renderings for Jupyter."""

from enum import Enum
from html import escape


class StepStatus(str, Enum):
    """What happened to a step in a run; compares equal to its JSON string (``"ran"``)."""

    RAN = "ran"
    SKIPPED = "skipped"
    FAILED = "failed"


def _source_name(source):
    """An event's source as one name: the plan step, the command or the supervisor."""
    if isinstance(source, dict) and source:
        return str(next(iter(source.values())))
    return ""


def _table(header, rows):
    head = "".join(f"<th style='text-align:left'>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:left;vertical-align:top'>{c}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def plan_html(desc):
    """The plan description (``Plan.describe()``) as an HTML table: step, summary, actions per node."""
    rows = []
    for s in desc.get("steps", []):
        actions = "<br>".join(
            f"<b>{escape(str(a.get('node', '')))}</b>: {escape(str(a.get('action', '')))}" for a in s.get("actions", [])
        )
        rows.append((escape(str(s.get("step", ""))), escape(str(s.get("summary", ""))), actions))
    name = escape(str(desc.get("deployment", {}).get("name", "")))
    return f"<div><b>spark-deploy plan</b> {name}{_table(('step', 'summary', 'actions'), rows)}</div>"


_COLOURS = {"ran": "#2e7d32", "skipped": "#757575", "failed": "#c62828"}


class Report(list):
    """The report of a plan run: one dict per step that started, in order.

    Each dict has ``step`` (``"fetch_checkpoint"``), ``status`` (a :class:`StepStatus`, equal to
    ``"ran"``, ``"skipped"`` or ``"failed"``), ``duration_ms``, and when known ``detail`` (skip
    reason or error) and ``bytes``.
    """

    def __init__(self, steps=()):
        super().__init__(
            {**s, "status": StepStatus(s["status"])} if isinstance(s, dict) and "status" in s else s
            for s in steps
        )

    @property
    def ok(self):
        """True when no step failed."""
        return all(s.get("status") != StepStatus.FAILED for s in self)

    def _repr_html_(self):
        rows = []
        for s in self:
            status = str(getattr(s.get("status"), "value", s.get("status", "")))
            colour = _COLOURS.get(status, "inherit")
            b = s.get("bytes")
            rows.append(
                (
                    escape(str(s.get("step", ""))),
                    f"<span style='color:{colour}'>{escape(status)}</span>",
                    f"{s.get('duration_ms', 0) / 1000:.1f} s",
                    "" if b is None else f"{b:,}",
                    escape(str(s.get("detail") or "")),
                )
            )
        return _table(("step", "status", "duration", "bytes", "detail"), rows)

    def __repr__(self):
        return f"Report({list.__repr__(self)})"


async def run_async(plan, on_event=None):
    """``plan.run()`` on a worker thread; events delivered on the loop's thread; task
    cancellation cancels the run and waits for its cleanup."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    cancel = threading.Event()

    def deliver(event):
        if on_event is not None:
            loop.call_soon_threadsafe(on_event, event)

    future = loop.run_in_executor(None, lambda: plan.run(on_event=deliver, cancel=cancel))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancel.set()
        try:
            await future
        except Exception:
            pass
        raise


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class _JupyterProgress:
    """Per-step rows with a bar, bytes, rate and ETA, updated in place in the notebook."""

    def __init__(self, display, html_type):
        self._html = html_type
        self._rows = {}
        self._last = 0.0
        self._handle = display(html_type(self._render()), display_id=True)

    def _render(self):
        rows = []
        for step, r in self._rows.items():
            done, total = r.get("done"), r.get("total")
            bar = ""
            if total:
                bar = f"<progress value='{done}' max='{total}' style='width:12em'></progress>"
            amount = "" if done is None else _human(done) + (f" / {_human(total)}" if total else "")
            rate = f"{_human(r['rate'])}/s" if r.get("rate") else ""
            eta = f"{r['eta']:.0f} s" if r.get("eta") is not None and r.get("state") == "running" else ""
            colour = _COLOURS.get({"finished": "ran"}.get(r["state"], r["state"]), "inherit")
            rows.append(
                (
                    escape(step),
                    f"<span style='color:{colour}'>{escape(r['state'])}</span>",
                    bar,
                    escape(amount),
                    escape(rate),
                    escape(eta),
                    escape(r.get("note", ""))[:300],
                )
            )
        return _table(("step", "state", "", "bytes", "rate", "ETA", ""), rows)

    def __call__(self, event):
        import time

        step, kind = _source_name(event.get("source")), event.get("event")
        r = self._rows.setdefault(step, {"state": "running"})
        force = kind != "progress"
        if kind == "started":
            r.update(state="running", note=event.get("message", ""))
        elif kind == "progress":
            r.update(done=event.get("bytes_done"), total=event.get("bytes_total"), rate=event.get("rate_bps"), eta=event.get("eta_s"))
            r["note"] = event.get("label", "")
        elif kind == "skipped":
            r.update(state="skipped", note=event.get("reason", ""))
        elif kind == "finished":
            r.update(state="finished", note=f"{event.get('duration_ms', 0) / 1000:.1f} s")
        elif kind == "failed":
            r.update(state="failed", note=event.get("error", ""))
        elif kind == "log" and event.get("level") in ("warn", "error"):
            r["note"] = event.get("line", "")
            force = True
        now = time.monotonic()
        if force or now - self._last > 0.2:
            self._last = now
            self._handle.update(self._html(self._render()))


def default_progress():
    """A progress display when running in a Jupyter kernel, else None."""
    import sys

    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None
    return _JupyterProgress(display, HTML)
