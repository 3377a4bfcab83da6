"""Part: core (ground floor). Plain-text tables, what a terminal and a log both read: the operator
commands' tables (control/render.py), ``study report``'s and ``gpuprobe model predict``'s."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int | None = None, rule: bool = False
) -> list[str]:
    """The lines of a table whose columns are as wide as their widest cell, two spaces apart: the first
    ``left`` columns left-aligned and the rest right-aligned (None: all left), a line of dashes under
    the header with ``rule``; no trailing spaces."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    aligned_left = len(headers) if left is None else left

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < aligned_left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    head = line(headers)
    return [head, *(["-" * len(head)] if rule else []), *(line(r) for r in rows)]
