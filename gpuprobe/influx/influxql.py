"""Part: influx. InfluxQL text and answers: quoting identifiers and string literals, and reading ``/query`` results.

Queries are asked with ``epoch=ns`` and ``chunked=true`` (InfluxDB then streams one JSON document
per chunk instead of cutting a large answer at ``max-row-limit``); :func:`parse_results` joins the
chunks of one series again, and turns an error of the answer or of any statement into
:class:`InfluxError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuprobe.errors import DataError


class InfluxError(DataError, RuntimeError):
    """InfluxDB refused a request or a statement, or could not be reached.

    ``status`` is the HTTP status (None when no answer came back, e.g. the server is down) and
    ``message`` InfluxDB's own text (for a 400 on a write, e.g. ``partial write: field type
    conflict: ...``); ``str()`` says it all in one sentence.
    """

    def __init__(self, sentence: str, *, status: int | None = None, message: str = "") -> None:
        super().__init__(sentence)
        self.status = status
        self.message = message or sentence


def quote_identifier(name: str) -> str:
    """An InfluxQL identifier (database, retention policy, measurement, field) in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_string(value: str) -> str:
    """An InfluxQL string literal (a tag value in ``WHERE``): single quotes, ``\\`` and ``'`` escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Series:
    """One series of a query result, as InfluxDB's JSON gives it (times in ns since the epoch)."""

    name: str
    columns: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]
    tags: Mapping[str, str] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """Each row as a dict of column to value, with the series' GROUP BY tags added."""
        return [{**self.tags, **dict(zip(self.columns, row, strict=True))} for row in self.values]

    def column(self, name: str) -> list[Any]:
        """One column's values, row by row (all None when the series has no such column)."""
        if name not in self.columns:
            return [None] * len(self.values)
        i = self.columns.index(name)
        return [row[i] for row in self.values]


def parse_results(text: str, query: str = "", *, status: int | None = 200) -> list[Series]:
    """Every series of every statement of a ``/query`` answer (one JSON document, or one per chunk),
    in order, chunks of one series joined; :class:`InfluxError` for an error anywhere in it."""
    joined: dict[tuple[int, str, tuple[tuple[str, str], ...]], tuple[str, tuple[str, ...], dict[str, str], list[Any]]]
    joined = {}
    decoder = json.JSONDecoder()
    position = 0
    while position < len(text):
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            break
        try:
            document, position = decoder.raw_decode(text, position)
        except ValueError:
            shown = text[position : position + 200]
            raise InfluxError(f"InfluxDB answered something that is not JSON: {shown!r}", status=status) from None
        if not isinstance(document, dict):
            raise InfluxError(f"InfluxDB answered JSON that is not an object: {document!r:.200}", status=status)
        if "error" in document:
            _raise_statement_error(str(document["error"]), query, status)
        for result in document.get("results", []):
            if "error" in result:
                _raise_statement_error(f"statement {result.get('statement_id', '?')}: {result['error']}", query, status)
            statement = int(result.get("statement_id", 0))
            for raw in result.get("series", []):
                name = str(raw.get("name", ""))
                tags = dict(raw.get("tags") or {})
                key = (statement, name, tuple(sorted(tags.items())))
                entry = joined.get(key)
                if entry is None:
                    entry = joined[key] = (name, tuple(raw.get("columns", ())), tags, [])
                entry[3].extend(tuple(row) for row in raw.get("values", ()))
    return [Series(name, columns, tuple(rows), tags) for name, columns, tags, rows in joined.values()]


def _raise_statement_error(message: str, query: str, status: int | None) -> None:
    where = f" (query: {query})" if query else ""
    raise InfluxError(f"InfluxDB: {message}{where}", status=status, message=message)
