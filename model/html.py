"""Part: model. The pieces of a self-contained HTML report, shared by ``gpuprobe model`` (model/report.py)
and ``gpuprobe study report`` (study/report.py): matplotlib figures as inline PNG, numbers as cells,
tables, images and times. Each report keeps its own sections and style sheet."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

# One function per section of a report, in the order they appear; each returns its HTML fragments, and
# page() joins all of them with newlines (so the sections stay independent of each other's markup).
Section = list[str]


def page(sections: Iterable[Section]) -> str:
    return "\n".join(fragment for section in sections for fragment in section)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display), imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> str:
    """The figure as base64 PNG (for ``img``), and closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    pyplot().close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def fmt(value: Any, digits: int = 4) -> str:
    """A cell: ``—`` for nothing (None, NaN, infinities), yes/no, integers whole, large floats rounded,
    the rest to ``digits`` significant digits; text escaped."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if abs(value) >= 10_000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        return f"{value:.{digits}g}"
    return html.escape(str(value))


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    left: int = 1,
    sim: Sequence[bool] = (),
    headings: Sequence[str | None] = (),
) -> str:
    """A table, the first ``left`` columns left-aligned; ``sim[n]`` marks row ``n`` as simulated (a cell
    that says "simulated" is marked too), ``headings[n]``, where not None, is a line across the table
    above row ``n``. Wrapped so that a wide table scrolls rather than the page."""
    head = "".join(f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>' for i, h in enumerate(headers))
    body = []
    for n, row in enumerate(rows):
        if n < len(headings) and headings[n] is not None:
            body.append(f'<tr class="config"><td class="l" colspan="{len(headers)}">{fmt(headings[n])}</td></tr>')
        cells = []
        for i, v in enumerate(row):
            cls = "l" if i < left else ""
            if v == "simulated":
                cls += " sim"
            cells.append(f'<td class="{cls.strip()}">{fmt(v)}</td>')
        marker = ' class="sim"' if n < len(sim) and sim[n] else ""
        body.append(f"<tr{marker}>{''.join(cells)}</tr>")
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def img(b64: str | None, alt: str) -> str:
    if not b64:
        return ""
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def utc_text(ns: int, *, milliseconds: bool = False) -> str:
    """A timestamp (ns) as the reports write it, ``2026-12-04 01:02:03 UTC`` (``.456`` with ``milliseconds``)."""
    text = datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return (text[:-3] if milliseconds else text[:-7]) + " UTC"
