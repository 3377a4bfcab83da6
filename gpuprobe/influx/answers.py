"""Part: influx. What an InfluxDB answer means: the one place where status codes and error bodies are read.

:func:`classify` gives every write answer one :class:`Verdict`; :func:`error_text` pulls InfluxDB's
own message out of an error body (``{"error": "..."}``, the ``X-Influxdb-Error`` header, or the
text); :func:`refused_lines_named` finds the lines a partial write names; :func:`parse_retry_after`
reads ``Retry-After``. The collector's sink acts on the verdicts (docs/operations.md), the
synchronous client (:mod:`.client`) words its errors with :func:`error_text`.

=========================  ==============================================================================
answer                     verdict
=========================  ==============================================================================
body says the disk is      RETRY, whatever the status: InfluxDB refuses *everything* until an operator
full                       frees space, so quarantining the lines would throw away good data. Checked
                           first, even before 2xx: sending again is idempotent, losing points is not
no answer, 408             RETRY
2xx                        WRITTEN
400 / 422                  REFUSED_LINES (partial write: some lines refused, the others stored)
413                        TOO_LARGE
429 / 503                  THROTTLED (wait ``Retry-After``)
500 "max series per        SERIES_LIMIT (1.x ``max-series-per-database``: retrying cannot help)
database exceeded"
other 5xx                  RETRY
401 / 403 / 404, other 4xx ALERT (configuration: credentials, permissions, database, URL)
=========================  ==============================================================================
"""

from __future__ import annotations

import email.utils
import enum
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

_DISK_FULL = re.compile(r"no space left on device|disk full|\bENOSPC\b|disk quota exceeded", re.IGNORECASE)
_MAX_SERIES = re.compile(r"max[- ]series[- ]per[- ]database", re.IGNORECASE)
_UNPARSEABLE = re.compile(r"unable to parse '(.*?)': ")
_DROPPED = re.compile(r"dropped=(\d+)")
_MOST_NAMED_3X = 100  # rejected points an InfluxDB 3.x or Cloud answer lists at most


@dataclass(frozen=True)
class Answer:
    """What one request got back: the HTTP status (None: no answer), body and Retry-After.

    ``unreachable``: no answer because no connection could be made (refused, no route, no such
    host), as opposed to a request that was sent and timed out or was cut off."""

    status: int | None
    body: str = ""
    retry_after_s: float | None = None
    unreachable: bool = False


class Verdict(enum.Enum):
    WRITTEN = "written"
    REFUSED_LINES = "refused_lines"
    TOO_LARGE = "too_large"
    THROTTLED = "throttled"
    SERIES_LIMIT = "series_limit"
    RETRY = "retry"
    ALERT = "alert"


def classify(answer: Answer) -> Verdict:
    """The one place where a write answer gets its meaning (see the module docstring)."""
    status = answer.status
    if status is None or status == 408 or _says_disk_full(answer.body):
        return Verdict.RETRY
    if 200 <= status < 300:
        return Verdict.WRITTEN
    if status in (400, 422):
        return Verdict.REFUSED_LINES
    if status == 413:
        return Verdict.TOO_LARGE
    if status in (429, 503):
        return Verdict.THROTTLED
    if status >= 500:
        return Verdict.SERIES_LIMIT if _MAX_SERIES.search(answer.body) else Verdict.RETRY
    return Verdict.ALERT


def _says_disk_full(body: str) -> bool:
    # InfluxDB 1.x quotes an unparseable line in its answer: words inside a quoted line are data
    # (a hostile tag value, for example), and must not turn a refused line into endless retries
    return _DISK_FULL.search(_UNPARSEABLE.sub("", body)) is not None


def _json_document(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def error_text(body: str, header: str | None = None) -> str:
    """InfluxDB's own message: ``{"error": "..."}`` of the body, else the ``X-Influxdb-Error`` header,
    else the body as it is (``(empty answer)`` when there is nothing at all)."""
    document = _json_document(body)
    if isinstance(document, dict) and "error" in document:
        return str(document["error"])
    if header:
        return header
    return body.strip() or "(empty answer)"


def reason(answer: Answer) -> str:
    """``<verdict>: <InfluxDB's message>``: why lines were refused, as the quarantine stores it."""
    verdict = classify(answer).value
    text = answer.body.strip()
    if not text:
        return verdict
    return f"{verdict}: {error_text(text)[:1000]}"


def refused_lines_named(answer: Answer, lines: Sequence[bytes]) -> tuple[set[int], int | None]:
    """Which of ``lines`` the answer names as refused (positions), and its ``dropped=N`` count of
    refused lines it does *not* name (None when it gives no count)."""
    named: set[int] = set()
    document = _json_document(answer.body)
    if isinstance(document, dict) and isinstance(document.get("data"), list):  # InfluxDB 3.x
        for item in document["data"]:
            number = item.get("line_number") if isinstance(item, dict) else None
            if isinstance(number, int) and 1 <= number <= len(lines):
                named.add(number - 1)
        # 3.x and Cloud name "up to 100" rejected points: a full list may leave some unnamed
        complete = bool(named) and len(document["data"]) < _MOST_NAMED_3X
        return named, 0 if complete else None
    body = error_text(answer.body) if isinstance(document, dict) else answer.body
    texts = set(_UNPARSEABLE.findall(body))
    if texts:
        for position, line in enumerate(lines):
            if line.decode(errors="replace") in texts:
                named.add(position)
    dropped = _DROPPED.search(body)
    return named, int(dropped.group(1)) if dropped else None


def line_errors(answer: Answer) -> dict[int, str]:
    """InfluxDB 3.x's own message for each line a partial write names: ``{position: message}``."""
    document = _json_document(answer.body)
    errors: dict[int, str] = {}
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        for item in document["data"]:
            if isinstance(item, dict) and isinstance(item.get("line_number"), int) and item.get("error_message"):
                errors[item["line_number"] - 1] = str(item["error_message"])[:1000]
    return errors


def parse_retry_after(value: str | None, now_s: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))
