"""Part: collector. Routing: which destination each line of the WAL goes to.

Lines go by their ``cluster`` tag to the ``--influx-route`` destinations (the rest to ``--influx-url``), and
the :data:`~gpuprobe.influx.retention.EVENT_MEASUREMENTS` lines also to a destination's ``events``
retention policy where it has one. A *selector* takes one WAL row's body and returns the lines of one
lane; the sink (:mod:`gpuprobe.collector.sink`) drains each lane with its own retries.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuprobe.collector.backends import Backend, V1Backend, make_backend
from gpuprobe.collector.settings import CollectorSettings, InfluxRoute
from gpuprobe.influx.retention import EVENT_MEASUREMENTS, EVENTS_RP

log = logging.getLogger(__name__)

_EVENTS_PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Destination:
    """Where the lines of some ``cluster`` tag values go (``--influx-route``): one InfluxDB server and
    database (v1) or bucket (v2), drained by its own lane."""

    name: str  # the metrics label and the log lines' name: the route's URL (and database)
    backend: Backend
    clusters: frozenset[str]


_MEASUREMENT_TEXT = rb"(?:[^\\, ]|\\.)*"  # escaped commas and spaces are part of the name
_TAG_VALUE = rb"(?:[^\\, ]|\\.)*"
_MEASUREMENT = re.compile(_MEASUREMENT_TEXT)
_TAG = re.compile(rb",((?:[^\\=, ]|\\.)*)=(" + _TAG_VALUE + rb")")


def cluster_of(line: bytes) -> bytes | None:
    """The ``cluster`` tag's value of one line of line protocol, escaped as written; None without one.

    Tags are read one by one from the start (escapes skipped), so an escaped ``\\,cluster\\=`` inside
    another tag's value is not taken for the tag."""
    match = _MEASUREMENT.match(line)
    position = match.end() if match is not None else 0
    while True:
        tag = _TAG.match(line, position)
        if tag is None:
            return None
        if tag.group(1) == b"cluster":
            return tag.group(2)
        position = tag.end()


def cluster_tag_text(cluster: str) -> bytes:
    """A cluster name as its tag value is written in line protocol (``,``, ``=`` and space escaped)."""
    return cluster.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ").encode()


def lane_selector(lane: object, where: Mapping[bytes, object], default: object) -> Callable[[bytes], tuple[bytes, int]]:
    """``select(body) -> (lines, count)``: the lines of ``body`` (one WAL row) that go to ``lane`` (a
    line whose cluster no route names goes to ``default``)."""

    def select(body: bytes) -> tuple[bytes, int]:
        lines = body.count(b"\n")
        whole = _row_cluster(body, lines)
        if whole is not None:  # the common case: one agent's batch, every line with the agent's tags
            return (body, lines) if where.get(whole, default) is lane else (b"", 0)
        mine = [line for line in body.splitlines(keepends=True) if where.get(cluster_of(line) or b"", default) is lane]
        return b"".join(mine), len(mine)

    return select


def _row_cluster(body: bytes, lines: int) -> bytes | None:
    """The cluster of every line of ``body`` when they all have the same (``b""``: none has the tag);
    None when that takes reading the lines one by one (a mix, or a lookalike in another value).

    A WAL row is one agent batch, and each of its lines carries the agent's tags: so the cluster of
    the first line that has the tag is counted as text over the whole body, at memchr speed, rather
    than by parsing ~5 000 lines in Python."""
    at = body.find(b",cluster=")
    if at < 0:
        return b""
    start = body.rfind(b"\n", 0, at) + 1
    end = body.find(b"\n", at)
    cluster = cluster_of(body[start : end + 1 if end >= 0 else len(body)])
    if cluster is None:
        return None
    tag = b",cluster=" + cluster
    return cluster if body.count(tag + b",") + body.count(tag + b" ") == lines else None


# a line of an events measurement, found after the newline that ends the line before it (the body
# gets one in front): a literal first character lets the regex engine skip along at memchr speed
_EVENT_LINE = re.compile(rb"\n((?:" + b"|".join(name.encode() for name in EVENT_MEASUREMENTS) + rb")[, ][^\n]*)")


def events_selector(
    inner: Callable[[bytes], tuple[bytes, int]] | None,
) -> Callable[[bytes], tuple[bytes, int]]:
    """``select(body)``: the :data:`EVENT_MEASUREMENTS` lines of ``body`` that ``inner`` selects (None:
    all of them). The measurement is the line's start, so a regex over the body finds them."""

    def select(body: bytes) -> tuple[bytes, int]:
        found = _EVENT_LINE.findall(b"\n" + body)
        if not found:
            return b"", 0
        mine = b"\n".join(found) + b"\n"
        return inner(mine) if inner is not None else (mine, len(found))

    return select


def _route_groups(config: CollectorSettings) -> list[tuple[str, InfluxRoute, frozenset[str]]]:
    """``(name, route, clusters)`` per InfluxDB server and database the routes name (routes to the same
    one share it)."""
    grouped: dict[tuple[str, str], list[InfluxRoute]] = {}
    for route in config.routes:
        grouped.setdefault((route.url.rstrip("/"), route.database), []).append(route)
    return [
        (f"{url}/{database}" if database else url, routes[0], frozenset(route.cluster for route in routes))
        for (url, database), routes in grouped.items()
    ]


def make_destinations(config: CollectorSettings) -> list[Destination]:
    """One :class:`Destination` per InfluxDB server and database the routes name (routes to the same
    one share it, and its lane)."""
    return [Destination(name, make_backend(config, route), clusters) for name, route, clusters in _route_groups(config)]


async def events_backends(config: CollectorSettings) -> dict[str, Backend]:
    """For each v1 destination (``default``: ``--influx-url``) whose database has the ``events``
    retention policy (``--init-db`` creates it), a backend that writes into it. Asked once at start:
    a collector started before ``--init-db`` writes into ``events`` after its next restart."""
    if config.influx.api != "v1":
        return {}
    targets: list[tuple[str, InfluxRoute | None]] = [("default", None)]
    targets += [(name, route) for name, route, _ in _route_groups(config)]
    found: dict[str, Backend] = {}
    for name, route in targets:
        probe = make_backend(config, route)
        assert isinstance(probe, V1Backend)
        try:
            # an InfluxDB that does not answer must not hold the collector's start for --influx-timeout
            policies, cause = await asyncio.wait_for(probe.retention_policies_or_cause(), _EVENTS_PROBE_TIMEOUT_S)
        except TimeoutError:
            policies, cause = (
                None,
                (
                    f"InfluxDB at {probe.settings.base_url} did not answer within {_EVENTS_PROBE_TIMEOUT_S:g} s:"
                    " check --influx-url and InfluxDB's load; the agents' data waits in the WAL"
                ),
            )
        finally:
            await probe.close()
        if policies is None:
            if cause and not (probe.settings.create_database and "database not found" in cause):
                # the cause first, on a line of its own: it is what the operator has to fix
                log.error("%s: %s", name, cause)
            log.warning(
                "cannot list the retention policies of %s: its %s points go to the default policy only "
                "until the next restart",
                name,
                ", ".join(EVENT_MEASUREMENTS[:4]),
            )
        elif EVENTS_RP in policies:
            found[name] = make_backend(config, route, EVENTS_RP)
            log.info("%s: the %s points are written into %r too", name, ", ".join(EVENT_MEASUREMENTS[:4]), EVENTS_RP)
    return found
