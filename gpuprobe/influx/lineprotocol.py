"""Part: influx. InfluxDB line protocol, written exactly: the one place that knows how names and values are escaped.

A line is ``measurement,tag=value,... field=value,... timestamp_ns``. The rules (InfluxDB line
protocol reference, checked against the real InfluxDB 1.6 in the tests):

==================  =====================================================================
element             how it is written
==================  =====================================================================
measurement         ``,`` and space escaped with a backslash
tag key, field key  ``,``, ``=`` and space escaped
tag value           ``,``, ``=`` and space escaped; other characters as they are. A value
                    with control characters (a newline would end the point), lone
                    surrogates or a trailing backslash (InfluxDB reads it as escaping the
                    separator after it) cannot be stored and is refused
                    (:func:`.storable.tag_value_problem`), so no input can inject a second
                    point.
                    Empty values: the tag is left out.
float field         the shortest text that reads back as the same double (``0.1``,
                    ``1e+16``, ``5e-324``; orjson's Ryu, what InfluxDB parses back bit for
                    bit); NaN and infinities are never written
integer field       decimal with the ``i`` suffix, within int64 (InfluxDB has no uint64 by
                    default); larger values are refused
boolean field       ``true`` / ``false``
string field        in double quotes, ``"`` and ``\\`` escaped with a backslash
timestamp           integer ns since the epoch
==================  =====================================================================

Tags are written sorted by key, as InfluxDB recommends. :func:`encode_line` ends every line with
``\\n``. The collector's hot path (:mod:`gpuprobe.collector.encode`) builds its templates from
:func:`series_prefix` and formats whole columns with orjson itself; everything else writes through
:func:`encode_line`, so both writers produce the same text for the same value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import orjson

from gpuprobe.errors import DataError
from gpuprobe.influx.storable import CONTROL_CHARS, INT64_MAX, tag_value_problem

FieldValue = float | int | bool | str


class UnrepresentableError(DataError, ValueError):
    """A name or value that line protocol cannot carry exactly (the message says why)."""


def escape_measurement(name: str) -> str:
    """A measurement name with ``,`` and space escaped."""
    _refuse_control(name, "measurement")
    if not name:
        raise UnrepresentableError("measurement name is empty")
    return name.replace(",", "\\,").replace(" ", "\\ ")


def escape_key(key: str) -> str:
    """A tag or field key with ``,``, ``=`` and space escaped."""
    _refuse_control(key, "key")
    if not key or key.endswith("\\"):
        raise UnrepresentableError(f"key {key!r} is empty or ends with a backslash")
    return key.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def escape_tag_value(value: str) -> str:
    """A tag value with ``,``, ``=`` and space escaped; :class:`UnrepresentableError` if it cannot be
    written exactly (empty, control characters, lone surrogates, a trailing backslash)."""
    problem = tag_value_problem(value, max_bytes=1 << 30)
    if problem is not None:
        raise UnrepresentableError(f"tag value {value[:80]!r} {problem}")
    return value.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def quote_string_field(value: str) -> str:
    """A string field value in double quotes with ``"`` and ``\\`` escaped (no control characters)."""
    _refuse_control(value, "string field")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _refuse_control(text: str, what: str) -> None:
    match = CONTROL_CHARS.search(text)
    if match is not None:
        raise UnrepresentableError(f"{what} {text[:80]!r} contains {match.group()!r}")


def float_text(value: float) -> str:
    """The shortest decimal text that reads back as ``value`` (finite values of type float only)."""
    return orjson.dumps(value).decode()


def field_text(value: FieldValue) -> str:
    """One field value: shortest round-trip float, ``<n>i``, ``true``/``false`` or a quoted string.

    numpy scalars (what fits return) are written as the Python value they hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise UnrepresentableError(f"integer {value} is outside the int64 range")
        return f"{value}i"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UnrepresentableError(f"float {value!r} is not finite")
        # float(): numpy's float64 is a float subclass that orjson refuses
        return float_text(value if type(value) is float else float(value))
    if isinstance(value, str):
        return quote_string_field(value)
    item = getattr(value, "item", None)
    if callable(item):  # numpy's int64 and bool_ are no int or bool subclasses
        held = item()
        if isinstance(held, bool | int | float | str):
            return field_text(held)
    raise UnrepresentableError(f"{type(value).__name__} {value!r} is not a line-protocol field type")


def series_prefix(measurement: str, tags: Mapping[str, str]) -> str:
    """``measurement,k=v,... `` (with the trailing space): tags sorted by key, empty values left out."""
    parts = [escape_measurement(measurement)]
    for key in sorted(tags):
        value = tags[key]
        if value:
            parts.append(f"{escape_key(key)}={escape_tag_value(value)}")
    return ",".join(parts) + " "


def encode_line(measurement: str, tags: Mapping[str, str], fields: Mapping[str, FieldValue], time_ns: int) -> str:
    """One exact line (with its ``\\n``); :class:`UnrepresentableError` if anything cannot be written."""
    if not fields:
        raise UnrepresentableError("a point needs at least one field")
    body = ",".join(f"{escape_key(key)}={field_text(value)}" for key, value in fields.items())
    return f"{series_prefix(measurement, tags)}{body} {int(time_ns)}\n"
