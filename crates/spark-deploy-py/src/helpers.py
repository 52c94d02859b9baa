"""Pure-Python parts of ``spark_deploy``: the report type and the HTML renderings for Jupyter."""

from html import escape


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

    Each dict has ``step`` (``"fetch_checkpoint"``), ``status`` (``"ran"``, ``"skipped"`` or
    ``"failed"``), ``duration_ms``, and when known ``detail`` (skip reason or error) and ``bytes``.
    """

    @property
    def ok(self):
        """True when no step failed."""
        return all(s.get("status") != "failed" for s in self)

    def _repr_html_(self):
        rows = []
        for s in self:
            status = str(s.get("status", ""))
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
