"""Part: importer. Times in the logs: time zones, timestamps to exact ns since the epoch, ``--freeze-after`` durations.

nvidia-smi writes ``YYYY/MM/DD HH:MM:SS.mmm``: the machine's local time, without a zone. Such a time
is read in the zone given by ``--timezone`` (UTC by default; an IANA name such as ``Europe/Berlin`` or a
fixed offset ``+02:00``). In an IANA zone the hour that repeats when clocks go back is read as its
first occurrence, and a wall time that does not exist (when clocks go forward) with the offset before
the change; a log that crosses a change is best written in UTC.

Every timestamp becomes an integer of ns without going through a float: fractions of a second are
kept digit for digit (up to 9 digits), unix times are read as decimals.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

NS_PER_S = 1_000_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_OFFSET = re.compile(r"^([+-])(\d{2})(?::?(\d{2}))?$")
# 2024/10/30 18:42:33.189 (nvidia-smi), 2024-10-30T18:42:33.189+02:00 (ISO 8601), with or without zone
_DATETIME = re.compile(
    r"^(\d{4})[/-](\d{1,2})[/-](\d{1,2})[ T_](\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d+))?"
    r"\s*(Z|z|UTC|[+-]\d{2}(?::?\d{2})?)?$"
)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")

#: ``--time-format`` values besides a strptime format
NAMED_TIME_FORMATS = ("auto", "iso", "unix", "unix_ms", "unix_us", "unix_ns")
_UNIX_SCALE = {"unix": NS_PER_S, "unix_ms": 1_000_000, "unix_us": 1_000, "unix_ns": 1}


def parse_timezone(text: str) -> tzinfo:
    """``UTC``, an IANA name (``Europe/Berlin``, from the system's or the ``tzdata`` package's zone
    database) or a fixed offset ``±HH:MM`` / ``±HHMM`` / ``±HH``; ValueError otherwise."""
    value = text.strip()
    if value.upper() in ("UTC", "Z", "GMT", "ETC/UTC"):
        return UTC
    match = _OFFSET.match(value)
    if match:
        hours, minutes = int(match.group(2)), int(match.group(3) or 0)
        if hours > 23 or minutes > 59:
            raise ValueError(f"not a UTC offset: {text!r} (hours 00-23, minutes 00-59)")
        delta = timedelta(hours=hours, minutes=minutes)
        return timezone(-delta if match.group(1) == "-" else delta)
    try:
        if not value or value.startswith(("/", ".")) or ".." in value:
            raise ValueError(value)
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"not a time zone: {text!r} (use UTC, an IANA name such as Europe/Berlin, or an offset such as +02:00)"
        ) from None


def check_timezone(text: str) -> str:
    """The ``--timezone`` option's type: the text, once it is known to be a zone."""
    parse_timezone(text)
    return text.strip()


def epoch_ns(moment: datetime) -> int:
    """An aware datetime as integer ns since the epoch (exact, microseconds included)."""
    delta = moment - EPOCH
    return (delta.days * 86400 + delta.seconds) * NS_PER_S + delta.microseconds * 1000


@lru_cache(maxsize=8192)
def _minute_start_s(zone: tzinfo, year: int, month: int, day: int, hour: int, minute: int) -> int:
    # zone changes happen on whole minutes, so the start of each minute is enough (and cached)
    return (datetime(year, month, day, hour, minute, tzinfo=zone) - EPOCH) // timedelta(seconds=1)


def wall_time_ns(
    zone: tzinfo, year: int, month: int, day: int, hour: int, minute: int, second: int, fraction_ns: int = 0
) -> int:
    """A wall-clock time in ``zone`` as ns since the epoch; ValueError for a date that does not exist."""
    if not 0 <= second <= 59:
        raise ValueError(f"second {second} out of range")
    return (_minute_start_s(zone, year, month, day, hour, minute) + second) * NS_PER_S + fraction_ns


def _fraction_ns(digits: str | None) -> int:
    if not digits:
        return 0
    if len(digits) > 9:
        raise ValueError(f"more than 9 digits of a second: .{digits}")
    return int(digits.ljust(9, "0"))


def _zone_of(text: str | None, default: tzinfo) -> tzinfo:
    if text is None:
        return default
    if text in ("Z", "z", "UTC"):
        return UTC
    return parse_timezone(text)


def parse_datetime_ns(text: str, zone: tzinfo) -> int:
    """nvidia-smi's ``YYYY/MM/DD HH:MM:SS.fff`` or ISO 8601 (``T`` or space, ``-`` or ``/``, up to 9
    digits of a second, an optional zone); without a zone the time is in ``zone``."""
    match = _DATETIME.match(text.strip())
    if not match:
        raise ValueError(f"not a date and time: {text!r}")
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    return wall_time_ns(
        _zone_of(match.group(8), zone), year, month, day, hour, minute, second, _fraction_ns(match.group(7))
    )


def parse_unix_ns(text: str, scale: int) -> int:
    """A unix time (seconds, or ms/µs/ns by ``scale``) read as a decimal, rounded to the ns."""
    value = text.strip()
    if not _NUMBER.match(value):
        raise ValueError(f"not a unix time: {text!r}")
    try:
        return int((Decimal(value) * scale).to_integral_value())
    except InvalidOperation:
        raise ValueError(f"not a unix time: {text!r}") from None


def _auto_unix_scale(text: str) -> int:
    # by magnitude: seconds until the year 5138, then ms, µs, ns
    magnitude = abs(Decimal(text.strip()))
    if magnitude < Decimal("1e11"):
        return NS_PER_S
    if magnitude < Decimal("1e14"):
        return 1_000_000
    if magnitude < Decimal("1e17"):
        return 1_000
    return 1


class TimeReader:
    """Reads one column of timestamps: ``auto`` (nvidia-smi's format, ISO 8601, or unix time whose unit
    follows from its magnitude), ``iso``, ``unix``/``unix_ms``/``unix_us``/``unix_ns``, or a strptime
    format. Times without a zone are in ``zone``. Calling it gives ns since the epoch or ValueError."""

    def __init__(self, time_format: str, zone: tzinfo) -> None:
        self.time_format = time_format
        self.zone = zone

    def __call__(self, text: str) -> int:
        fmt = self.time_format
        if fmt in ("auto", "iso"):
            value = text.strip()
            if fmt == "auto" and _NUMBER.match(value):
                return parse_unix_ns(value, _auto_unix_scale(value))
            return parse_datetime_ns(value, self.zone)
        if fmt in _UNIX_SCALE:
            return parse_unix_ns(text, _UNIX_SCALE[fmt])
        moment = datetime.strptime(text.strip(), fmt)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=self.zone)
        return epoch_ns(moment)


def check_time_format(text: str) -> str:
    """The ``--time-format`` option's type: a named format, or a strptime format with a ``%`` field."""
    value = text.strip()
    if value in NAMED_TIME_FORMATS:
        return value
    if "%" not in value:
        raise ValueError(f"not a time format: {text!r} (use {', '.join(NAMED_TIME_FORMATS)} or a strptime format)")
    try:
        datetime.now().strftime(value)
    except ValueError as e:
        raise ValueError(f"not a strptime format: {text!r} ({e})") from None
    return value
