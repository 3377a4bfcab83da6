"""Part: influx. Reading the event measurements (``probe``, ``trainer``, ``gpu_info``, ``gpu_event``, ``model``:
:data:`.retention.EVENT_MEASUREMENTS`) from every retention policy that keeps them.

Where ``gpuprobe collector --init-db`` made the ``events`` policy, the collector and ``gpuprobe
model``/``study`` write these points into it as well as into the default policy, and ``events``
keeps them for 400 days where the default (raw) policy keeps them for 7. Neither copy alone is
complete: ``events`` lacks what was written before the collectors were restarted after the first
``--init-db``, and what its lane of the collector has not delivered yet (a lane that is behind or
whose destination refuses); the default policy lacks what is older than its retention. So a reader
asks both, and the answers are merged: a point in both (the same time, tags and values) counts once.
A database without ``events`` (an older collector, no ``--init-db``) is read exactly as before, from
the default policy only.

``gpuprobe model`` (:mod:`gpuprobe.model.data`) and ``gpuprobe study report``
(:mod:`gpuprobe.study.data`) read through :func:`query_events`; the dashboards choose with their
``$erp`` variable instead (docs/dashboards.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.influxql import InfluxError, Series, quote_identifier
from gpuprobe.influx.retention import EVENT_MEASUREMENTS, EVENTS_RP, events_policy

log = logging.getLogger(__name__)

DEFAULT = ""  # the database's default policy, or the client's --influx-rp: a FROM without a policy


@dataclass(frozen=True)
class EventSources:
    """The retention policies a reader asks for the event measurements, ``events`` first when the
    database has it; :data:`DEFAULT` is the policy a FROM without one reads."""

    policies: tuple[str, ...] = (DEFAULT,)

    def source(self, policy: str, measurement: str) -> str:
        """The FROM of ``measurement`` in ``policy``: ``"events"."probe"``, or ``"probe"``."""
        if policy == DEFAULT:
            return quote_identifier(measurement)
        return f"{quote_identifier(policy)}.{quote_identifier(measurement)}"

    def describe(self) -> str:
        """The policies asked, for a message: ``the retention policies events and the default``."""
        if self.policies == (DEFAULT,):
            return "the default retention policy"
        names = [p if p != DEFAULT else "the default" for p in self.policies]
        return "the retention policies " + " and ".join(names)


def event_sources(client: InfluxClient, database: str | None = None) -> EventSources:
    """Where to read the event measurements of ``database`` (None: the client's): ``events`` and the
    default policy when the database has ``events``, else the default policy only.

    A server that answers ``SHOW RETENTION POLICIES`` with an error (InfluxDB 3.x, a user without the
    right) is read from the default policy, with a warning; one that cannot be reached raises
    :class:`.influxql.InfluxError`, as the reads that follow would."""
    try:
        policy = events_policy(client, database)
    except InfluxError as exc:
        if exc.status is None:
            raise
        log.warning("cannot list the retention policies (%s): reading the default policy only", exc)
        return EventSources()
    return EventSources((EVENTS_RP, DEFAULT)) if policy is not None else EventSources()


def query_events(
    client: InfluxClient, select: str, measurement: str, rest: str = "", sources: EventSources | None = None
) -> list[Series]:
    """``SELECT {select} FROM <measurement> {rest}`` in every policy of ``sources`` (None: asked with
    :func:`event_sources`), merged: one series per name and tags, its rows in time order, a row that
    both policies hold (the same time and values) once. ``rest`` is the WHERE and GROUP BY."""
    if measurement not in EVENT_MEASUREMENTS:
        raise ValueError(f"{measurement!r} is not one of the event measurements {', '.join(EVENT_MEASUREMENTS)}")
    where = event_sources(client) if sources is None else sources
    answers = [
        client.query(f"SELECT {select} FROM {where.source(policy, measurement)} {rest}".rstrip())
        for policy in where.policies
    ]
    if len(answers) == 1:
        return answers[0]
    return merge(answers)


def merge(answers: list[list[Series]]) -> list[Series]:
    """The series of several answers to one statement as one answer (see :func:`query_events`); the
    series keep InfluxDB's order (by tags)."""
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Series, list[tuple[Any, ...]]]] = {}
    for answer in answers:
        for s in answer:
            key = (s.name, tuple(sorted(s.tags.items())))
            if key not in merged:
                merged[key] = (s, list(s.values))
                continue
            first, rows = merged[key]
            if s.columns != first.columns:  # the same statement: only a changed schema could do this
                raise InfluxError(f"the {s.name!r} series of two retention policies have different columns")
            rows.extend(s.values)
    out = []
    for key in sorted(merged):
        first, rows = merged[key]
        unique = list(dict.fromkeys(rows))
        if "time" in first.columns:
            at = first.columns.index("time")
            unique.sort(key=lambda row: (row[at] is None, row[at] or 0))
        out.append(Series(first.name, first.columns, tuple(unique), first.tags))
    return out
