"""Part: influx. What InfluxDB line protocol can store, checked without writing anything (standard library only).

The writer (:mod:`.lineprotocol`) refuses what these checks refuse; they live apart from it because
a GPU node checks its own identity labels with them (the collector's ``check_hello``) and has none
of the writer's dependencies.
"""

from __future__ import annotations

import re

#: InfluxDB integers are int64 (no uint64 by default): larger values cannot be stored.
INT64_MAX = 2**63 - 1

#: Control characters (C0, DEL, C1) and lone surrogates: never part of a tag value, a key or a
#: string field (free text is cleaned with this before it gets there).
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def tag_value_problem(value: str, max_bytes: int) -> str | None:
    """Why ``value`` cannot be stored as a tag value, or None when it can (empty counts as a problem).

    Control characters would end the line (a newline injects a second point); a trailing backslash
    is read by InfluxDB's parser (1.x and 2.x) as escaping the separator after it, so such a value
    cannot be written at all."""
    if not value:
        return "is empty"
    match = CONTROL_CHARS.search(value)
    if match is not None:
        char = match.group()
        kind = "a lone surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
        return f"contains {kind} ({char!r}) at position {match.start()}"
    # len * 4 bounds the UTF-8 size: most values skip the encode
    if len(value) * 4 > max_bytes and len(value.encode()) > max_bytes:
        return f"is {len(value.encode())} bytes long, more than the limit of {max_bytes}"
    if value.endswith("\\"):
        return "ends with a backslash, which InfluxDB line protocol cannot represent in a tag value"
    return None
