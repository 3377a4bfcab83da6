"""`gpuprobe model` and `gpuprobe study report` find a probe or study that is only in the `events`
retention policy (its raw copy expired after `--retention-raw`), one split between the two policies
(the collector's `events` lane behind, or points written before the collectors were restarted after
`--init-db`), and read a database without `events` as before.

The data: the synthetic study (study_synthetic.py) written once into the default policy of a
database without `--init-db` (the reference), and again into a database set up by `--init-db`, with
its `probe` and `trainer` points written with `rp=events` only, as they are once the raw policy
dropped them; its `gpu` and `acoustic` samples stay in the default policy, where the readers look for
them. Every reading of the second database must equal the reference's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest
from study_synthetic import STUDY, StudyRun, study_lines, timeline, write_study

from gpuprobe.devservices import InfluxDBServer
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.eventreads import DEFAULT, event_sources
from gpuprobe.influx.retention import EVENTS_RP, RetentionPlan, init_db
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.model.data import NoDataError, find_probe, load
from gpuprobe.study.data import StudyData, load_study

EVENT_LINES = ("probe,", "trainer,")


def client_of(server: InfluxDBServer, db: str) -> InfluxClient:
    return InfluxClient(InfluxSettings(url=server.url, database=db))


@pytest.fixture
def events_db(influxdb_server: InfluxDBServer) -> Iterator[tuple[StudyRun, Any]]:
    """A database set up by `--init-db` (default policy autogen, 7 days; `events`, 400 days) and a
    function that writes the synthetic study's lines into it: ``write(lines, policy)``."""
    influxdb_server.start()
    db = f"events_{uuid.uuid4().hex[:10]}"
    with client_of(influxdb_server, "") as admin:
        init_db(admin, RetentionPlan(database=db))

    def write(lines: list[str], policy: str | None = None) -> None:
        for i in range(0, len(lines), 5000):
            influxdb_server.write_lines(db, lines[i : i + 5000], retention_policy=policy)

    yield StudyRun(influxdb_server, db, STUDY, 0, 0), write
    if influxdb_server.running:
        influxdb_server.drop_database(db)


@pytest.fixture(scope="module")
def reference(influxdb_server: InfluxDBServer) -> Iterator[StudyRun]:
    """The synthetic study in the default policy of a database without `events`."""
    influxdb_server.start()
    run = write_study(influxdb_server)
    yield run
    if influxdb_server.running:
        influxdb_server.drop_database(run.db)


def count(run: StudyRun, policy: str, measurement: str) -> int:
    field = {"probe": "kind", "trainer": "samples_per_s"}[measurement]
    answer = run.server.query(run.db, f'SELECT count("{field}") FROM "{policy}"."{measurement}"')
    return sum(int(row[1]) for s in answer for row in s.values)


def comparable(data: StudyData) -> dict[str, Any]:
    """What a report is made of (not the database's name)."""
    out = asdict(data)
    del out["database"]
    return out


def same_dataset(client: InfluxClient, reference_client: InfluxClient) -> None:
    """`gpuprobe model`'s reading of the study's window: the same window, trainer series and GPUs."""
    window = find_probe(client, STUDY)
    expected = find_probe(reference_client, STUDY)
    assert window == expected and window.hosts == ["node-a", "node-b"]
    data, want = load(client, window), load(reference_client, expected)
    assert len(data.trainer) == len(want.trainer) == 4
    for got, ref in zip(data.trainer, want.trainer, strict=True):
        assert (got.host, got.gpu, got.workload, got.device, got.phase) == (
            ref.host,
            ref.gpu,
            ref.workload,
            ref.device,
            ref.phase,
        )
        np.testing.assert_array_equal(got.t_ns, ref.t_ns)
        np.testing.assert_array_equal(got.samples_per_s, ref.samples_per_s)
    assert [(g.host, g.gpu) for g in data.gpus] == [(g.host, g.gpu) for g in want.gpus]


@pytest.mark.slow
def test_a_study_only_in_the_events_policy_reads_as_if_it_were_in_the_default_one(
    reference: StudyRun, events_db: tuple[StudyRun, Any]
) -> None:
    run, write = events_db
    lines = study_lines(STUDY, reference.start_ns)
    write([line for line in lines if line.startswith(EVENT_LINES)], EVENTS_RP)
    write([line for line in lines if not line.startswith(EVENT_LINES)])
    # the raw policy has no probe or trainer point left: what `--retention-raw` leaves after 7 days
    assert count(run, "autogen", "probe") == count(run, "autogen", "trainer") == 0
    assert count(run, EVENTS_RP, "probe") > 0 and count(run, EVENTS_RP, "trainer") > 0

    with client_of(run.server, run.db) as client, client_of(reference.server, reference.db) as ref:
        assert event_sources(client).policies == (EVENTS_RP, DEFAULT)
        same_dataset(client, ref)
        data, want = load_study(client, STUDY), load_study(ref, STUDY)
    assert data.measurements and all(m.has_data for m in data.measurements)
    assert comparable(data) == comparable(want)


@pytest.mark.slow
def test_a_study_split_between_the_policies_is_read_whole_and_once(
    reference: StudyRun, events_db: tuple[StudyRun, Any]
) -> None:
    """Every point in the default policy; `events` lacks the last half of the study's events and trainer
    reports (its lane of the collector behind): the readers take each point once, from either."""
    run, write = events_db
    lines = study_lines(STUDY, reference.start_ns)
    write(lines)
    events = [line for line in lines if line.startswith(EVENT_LINES)]
    _, cooldown_ns, _ = timeline(reference.start_ns)
    early = [line for line in events if int(line.rsplit(" ", 1)[1]) < cooldown_ns - 30 * 10**9]
    assert 0 < len(early) < len(events)
    write(early, EVENTS_RP)

    with client_of(run.server, run.db) as client, client_of(reference.server, reference.db) as ref:
        same_dataset(client, ref)
        assert comparable(load_study(client, STUDY)) == comparable(load_study(ref, STUDY))


@pytest.mark.slow
def test_without_the_events_policy_the_default_one_is_read(reference: StudyRun) -> None:
    with client_of(reference.server, reference.db) as client:
        sources = event_sources(client)
        assert sources.policies == (DEFAULT,)
        assert sources.source(DEFAULT, "probe") == '"probe"'  # --influx-rp still applies (the query's rp)
        assert find_probe(client, STUDY).hosts == ["node-a", "node-b"]
        with pytest.raises(NoDataError, match="in the default retention policy"):
            find_probe(client, "p-nope")
        with pytest.raises(NoDataError, match="in the default retention policy"):
            load_study(client, "s-nope")


@pytest.mark.slow
def test_an_unknown_probe_names_both_policies(events_db: tuple[StudyRun, Any]) -> None:
    run, _ = events_db
    with client_of(run.server, run.db) as client:
        with pytest.raises(NoDataError, match="in the retention policies events and the default"):
            find_probe(client, "p-nope")
        with pytest.raises(NoDataError, match="in the retention policies events and the default"):
            load_study(client, "s-nope")
