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


class Verdict(str, Enum):
    """A validation check's outcome; compares equal to its JSON string (``"pass"``)."""

    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"


class CheckResult:
    """One check of ``Deployment.validate()``: ``check`` (its name), ``verdict`` (a
    :class:`Verdict`), ``detail`` (what was seen) and ``seconds`` (wall time)."""

    __slots__ = ("check", "verdict", "detail", "seconds")

    def __init__(self, check, verdict, detail, seconds):
        self.check = check
        self.verdict = Verdict(verdict)
        self.detail = detail
        self.seconds = seconds

    def __repr__(self):
        return f"CheckResult({self.check!r}, {self.verdict.value!r}, {self.detail!r}, {self.seconds:.2f})"


class ValidationReport(list):
    """The results of ``Deployment.validate()``: one :class:`CheckResult` per check run, in
    order; ``ok`` is True when none failed (``unsupported`` is not a failure)."""

    def __init__(self, results, base_url="", model=""):
        super().__init__(results)
        self.base_url = base_url
        self.model = model

    @classmethod
    def from_json(cls, doc):
        results = [CheckResult(r["check"], r["verdict"], r["detail"], r["seconds"]) for r in doc.get("results", [])]
        return cls(results, doc.get("base_url", ""), doc.get("model", ""))

    @property
    def ok(self):
        return all(r.verdict != Verdict.FAIL for r in self)

    @property
    def failed(self):
        return [r.check for r in self if r.verdict == Verdict.FAIL]

    def _repr_html_(self):
        colours = {"pass": "#2e7d32", "fail": "#c62828", "unsupported": "#757575"}
        rows = [
            (
                escape(r.check),
                f"<span style='color:{colours[r.verdict.value]}'>{r.verdict.value.upper()}</span>",
                f"{r.seconds:.2f} s",
                escape(r.detail),
            )
            for r in self
        ]
        return f"<div><b>spark-deploy validate</b> {escape(self.model)}{_table(('check', 'verdict', 'time', 'detail'), rows)}</div>"


class BenchRows(list):
    """The rows of ``Deployment.bench()``: one dict per prompt kind x streams (``kind``,
    ``streams``, ``per_stream_tps``, ``per_stream_std``, ``aggregate_tps``, ``aggregate_std``,
    ``ttft_s``, ``completion_tokens``) and one per prefill length (``kind`` = ``"prefill"``,
    ``length``, ``prompt_tokens``, ``prefill_tps``, ``prefill_std``, ``ttft_s``). Medians over the
    repetitions. ``json`` is the stored JSON (llama-benchy's fields), ``table`` the markdown,
    ``html`` and ``png`` the charts, ``path`` where the run was stored, ``interrupted`` whether
    Ctrl-C stopped it. Shown as the chart in Jupyter."""

    def __init__(self, rows, json, table, html, png, path, interrupted=False):
        super().__init__(rows)
        self.json = json
        self.table = table
        self.html = html
        self.png = png
        self.path = path
        self.interrupted = interrupted

    @classmethod
    def from_json(cls, doc, table, html, png, path, interrupted=False):
        r = doc["spark_deploy"]["results"]
        rows = []
        for d in r.get("decode", []):
            rows.append({
                "kind": d["kind"],
                "streams": d["streams"],
                "per_stream_tps": d["per_stream"]["median"],
                "per_stream_std": d["per_stream"]["std"],
                "aggregate_tps": d["aggregate"]["median"],
                "aggregate_std": d["aggregate"]["std"],
                "ttft_s": d["ttft_s"]["median"],
                "completion_tokens": d["completion_tokens"],
            })
        for p in r.get("prefill", []):
            rows.append({
                "kind": "prefill",
                "length": p["length"],
                "prompt_tokens": p["prompt_tokens"],
                "prefill_tps": p["rate"]["median"],
                "prefill_std": p["rate"]["std"],
                "ttft_s": p["ttft_s"]["median"],
            })
        return cls(rows, doc, table, html, png, path, interrupted)

    def to_pandas(self):
        """The rows as a ``pandas.DataFrame`` (needs pandas)."""
        import pandas

        return pandas.DataFrame(list(self))

    def _repr_html_(self):
        return self.html

    def _repr_png_(self):
        return self.png
