"""What an InfluxDB answer means (gpuprobe.influx.answers): verdicts, InfluxDB's error text, the
lines a partial write names, Retry-After. The sink's behaviour on each verdict is tested with real
requests in tests/collector/test_collector_sink.py."""

from __future__ import annotations

import email.utils
import json

import pytest

from gpuprobe.influx import answers
from gpuprobe.influx.answers import Answer, Verdict, classify


def influx_error(message: str) -> str:
    return json.dumps({"error": message})


@pytest.mark.parametrize(
    ("status", "body", "verdict"),
    [
        (204, "", Verdict.WRITTEN),
        (200, "", Verdict.WRITTEN),
        (None, "ConnectError: connection refused", Verdict.RETRY),
        (408, "", Verdict.RETRY),
        (
            400,
            influx_error("partial write: unable to parse 'm v=x 1': invalid field format dropped=1"),
            Verdict.REFUSED_LINES,
        ),
        (422, influx_error("partial write: points beyond retention policy dropped=3"), Verdict.REFUSED_LINES),
        (413, influx_error("Request Entity Too Large"), Verdict.TOO_LARGE),
        (429, influx_error("too many requests"), Verdict.THROTTLED),
        (503, influx_error("service unavailable"), Verdict.THROTTLED),
        (500, influx_error("max series per database exceeded: m,host=a (1000000)"), Verdict.SERIES_LIMIT),
        (500, influx_error("max-series-per-database limit exceeded"), Verdict.SERIES_LIMIT),
        (500, influx_error("timeout"), Verdict.RETRY),
        (502, "<html>Bad Gateway</html>", Verdict.RETRY),
        (401, influx_error("authorization failed"), Verdict.ALERT),
        (403, influx_error("insufficient permissions"), Verdict.ALERT),
        (404, influx_error('database not found: "gpuprobe"'), Verdict.ALERT),
        (405, "", Verdict.ALERT),
    ],
)
def test_every_answer_gets_one_verdict(status: int | None, body: str, verdict: Verdict) -> None:
    assert classify(Answer(status, body)) is verdict


DISK_FULL_BODIES = [
    # InfluxDB 1.x, the WAL or a TSM file on a full disk
    influx_error(
        "engine: error writing WAL entry: write /var/lib/influxdb/wal/gpuprobe/autogen/3/_00042.wal: "
        "no space left on device"
    ),
    influx_error("partial write: write /var/lib/influxdb/data/x.tsm.tmp: No Space Left On Device dropped=12"),
    "disk full",
    influx_error("write failed: ENOSPC"),
    influx_error("open /var/lib/influxdb/wal/_00001.wal: disk quota exceeded"),
]


@pytest.mark.parametrize("status", [400, 401, 404, 413, 422, 500, 503, 507, 204])
@pytest.mark.parametrize("body", DISK_FULL_BODIES)
def test_a_full_disk_is_retried_whatever_the_status_so_nothing_is_quarantined(status: int, body: str) -> None:
    assert classify(Answer(status, body)) is Verdict.RETRY


def test_words_that_only_look_like_a_full_disk_are_not_taken_for_one() -> None:
    assert (
        classify(Answer(400, influx_error("partial write: field diskfull_pct type conflict"))) is Verdict.REFUSED_LINES
    )
    assert classify(Answer(400, influx_error("unable to parse 'ENOSPCX v=1': bad timestamp"))) is Verdict.REFUSED_LINES


def test_error_text_is_influxdbs_own_message() -> None:
    assert answers.error_text(influx_error("database not found: x")) == "database not found: x"
    assert answers.error_text("", "authorization failed") == "authorization failed"  # the X-Influxdb-Error header
    assert answers.error_text("  upstream timed out \n") == "upstream timed out"
    assert answers.error_text("") == "(empty answer)"
    assert (
        answers.reason(Answer(400, influx_error("partial write: x dropped=1")))
        == "refused_lines: partial write: x dropped=1"
    )
    assert answers.reason(Answer(413)) == "too_large"


def test_refused_lines_named_by_text_by_line_number_and_counted() -> None:
    lines = [b"m v=1i 1", b"m v=x 2", b"m v=3i 3", b"m v=y 4"]
    named, unnamed = answers.refused_lines_named(
        Answer(400, influx_error("partial write: unable to parse 'm v=x 2': invalid boolean dropped=2")), lines
    )
    assert named == {1} and unnamed == 2  # 1.x names the first unparseable line only
    document = {"error": "partial write", "data": [{"line_number": 2}, {"line_number": 4}, {"line_number": 9}]}
    assert answers.refused_lines_named(Answer(400, json.dumps(document)), lines) == ({1, 3}, 0)  # 3.x: by number
    assert answers.refused_lines_named(Answer(400, influx_error("field type conflict dropped=1")), lines) == (set(), 1)
    assert answers.refused_lines_named(Answer(400, "not json at all"), lines) == (set(), None)


def test_parse_retry_after() -> None:
    assert answers.parse_retry_after("3") == 3.0
    assert answers.parse_retry_after(email.utils.formatdate(1000.0, usegmt=True), now_s=990.0) == 10.0
    assert answers.parse_retry_after(email.utils.formatdate(900.0, usegmt=True), now_s=990.0) == 0.0
    assert (
        answers.parse_retry_after("soon") is None
        and answers.parse_retry_after(None) is None
        and answers.parse_retry_after("") is None
    )


def test_a_refused_line_that_quotes_disk_full_words_is_still_a_refused_line_not_an_endless_retry() -> None:
    body = influx_error("""unable to parse 'probe,host=a message="no space left on device" 12x': bad timestamp""")
    assert classify(Answer(400, body)) is Verdict.REFUSED_LINES
