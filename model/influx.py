"""InfluxQL over HTTP: ``/query`` and ``/write`` of the v1 API, which InfluxDB 2.x and 3.x also serve.

Only the standard library, so ``gpuprobe model`` needs no InfluxDB client package. Queries ask for
``epoch=ns`` and ``chunked=true`` (InfluxDB then streams one JSON document per chunk instead of
cutting a large answer at ``max-row-limit``); the chunks of one series are joined again here.

Authentication: user name and password as HTTP basic authentication (1.x), or a token sent as
``Authorization: Token …`` (the v1-compatible API of 2.x, and 1.x with JWT-less token proxies).

Errors are translated once, into :class:`InfluxQueryError` with InfluxDB's own message.
"""

from __future__ import annotations

import base64
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

CHUNK_ROWS = 20000


class InfluxQueryError(RuntimeError):
    """InfluxDB refused a query or a write, or could not be reached (the message says which)."""


@dataclass(frozen=True)
class InfluxSettings:
    """Where the telemetry is: a base URL and a database (``db``) with an optional retention policy."""

    url: str = "http://127.0.0.1:8086"
    db: str = "gpuprobe"
    rp: str = ""
    username: str = ""
    password: str = ""
    token: str = ""
    timeout_s: float = 60.0


@dataclass
class Series:
    """One series of an answer: its tags and its rows as column -> value (``time`` in ns)."""

    name: str
    tags: dict[str, str]
    columns: list[str]
    values: list[list[Any]] = field(default_factory=list)

    def column(self, name: str) -> list[Any]:
        if name not in self.columns:
            return [None] * len(self.values)
        i = self.columns.index(name)
        return [row[i] for row in self.values]


def quote_string(value: str) -> str:
    """An InfluxQL string literal: single quotes, with ``\\`` and ``'`` escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_ident(name: str) -> str:
    """An InfluxQL identifier in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def escape_tag(value: str) -> str:
    """A line-protocol tag value (``,``, ``=`` and space escaped)."""
    if not value or any(c in value for c in "\n\r\t") or value.endswith("\\"):
        raise ValueError(f"tag value {value!r} cannot be written as line protocol")
    return value.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def field_text(value: float | int | bool | str) -> str:
    """A field value: float ``repr``, ``<n>i``, ``true``/``false`` or a quoted string (numpy scalars too)."""
    item = getattr(value, "item", None)
    if callable(item):  # a numpy scalar: numpy 2 writes np.float64(1.5) as its repr
        value = item()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} cannot be written as line protocol")
        return repr(float(value))
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def line(measurement: str, tags: dict[str, str], fields: dict[str, float | int | bool | str], time_ns: int) -> str:
    """One line of line protocol; empty tag values are left out, tags sorted by key."""
    tag_text = "".join(f",{k}={escape_tag(v)}" for k, v in sorted(tags.items()) if v)
    field_part = ",".join(f"{k}={field_text(v)}" for k, v in fields.items())
    return f"{measurement}{tag_text} {field_part} {int(time_ns)}"


class InfluxClient:
    """A v1 HTTP client for one database."""

    def __init__(self, settings: InfluxSettings) -> None:
        self.settings = settings

    def _headers(self) -> dict[str, str]:
        s = self.settings
        headers = {"Accept": "application/json"}
        if s.token:
            headers["Authorization"] = f"Token {s.token}"
        elif s.username or s.password:
            pair = f"{s.username}:{s.password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        return headers

    def _open(self, request: urllib.request.Request) -> bytes:
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            text = _error_text(exc.read().decode("utf-8", errors="replace"))
            raise InfluxQueryError(
                f"InfluxDB at {self.settings.url} answered HTTP {exc.code}: {text.strip()}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise InfluxQueryError(f"cannot reach InfluxDB at {self.settings.url}: {reason}") from None

    def query(self, influxql: str) -> list[Series]:
        """Every series of every statement (``GET /query``), chunks joined."""
        params = {
            "q": influxql,
            "db": self.settings.db,
            "epoch": "ns",
            "chunked": "true",
            "chunk_size": str(CHUNK_ROWS),
        }
        if self.settings.rp:
            params["rp"] = self.settings.rp
        url = self.settings.url.rstrip("/") + "/query?" + urllib.parse.urlencode(params)
        body = self._open(urllib.request.Request(url, headers=self._headers(), method="GET"))
        return parse_chunked(body.decode("utf-8", errors="replace"), influxql)

    def write(self, lines: Iterable[str]) -> int:
        """``POST /write`` (precision ns); returns the number of lines written."""
        text = "\n".join(lines)
        if not text:
            return 0
        params = {"db": self.settings.db, "precision": "ns"}
        if self.settings.rp:
            params["rp"] = self.settings.rp
        url = self.settings.url.rstrip("/") + "/write?" + urllib.parse.urlencode(params)
        headers = dict(self._headers(), **{"Content-Type": "text/plain; charset=utf-8"})
        self._open(urllib.request.Request(url, data=text.encode(), headers=headers, method="POST"))
        return text.count("\n") + 1


def _error_text(body: str) -> str:
    """InfluxDB's ``{"error": "..."}`` message, or the body as it is."""
    try:
        document = json.loads(body)
    except ValueError:
        return body
    return str(document["error"]) if isinstance(document, dict) and "error" in document else body


def parse_chunked(text: str, what: str = "") -> list[Series]:
    """Joins the JSON documents of a chunked answer (one per line) into whole series."""
    out: dict[tuple[int, str, tuple[tuple[str, str], ...]], Series] = {}
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
            raise InfluxQueryError(
                f"InfluxDB answered something that is not JSON: {text[position : position + 200]!r}"
            ) from None
        if "error" in document:
            raise InfluxQueryError(f"InfluxDB: {document['error']} (query: {what})")
        for result in document.get("results", []):
            if "error" in result:
                raise InfluxQueryError(f"InfluxDB: {result['error']} (query: {what})")
            statement = int(result.get("statement_id", 0))
            for raw in result.get("series", []):
                tags = {k: v for k, v in (raw.get("tags") or {}).items()}
                key = (statement, str(raw.get("name", "")), tuple(sorted(tags.items())))
                series = out.get(key)
                if series is None:
                    series = out[key] = Series(str(raw.get("name", "")), tags, list(raw.get("columns", [])))
                series.values.extend(list(row) for row in raw.get("values", []))
    return list(out.values())
