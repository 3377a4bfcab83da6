"""Part: influx. Retention policies and downsampling of an InfluxDB 1.x database: ``gpuprobe collector --init-db``.

What :func:`init_db` sets up, idempotently (run it again: it changes only what differs, and says so):

- the **raw** retention policy (the one the collector writes into: ``--influx-rp``, else ``autogen``)
  with a finite duration (default 7 days), made the database's default;
- ``rollup_10s`` (default 90 days) and ``rollup_1m`` (default 400 days);
- continuous queries that downsample the ``gpu`` and ``node`` measurements into them (10 s windows
  from the raw data, 1 min windows from the 10 s rollup for ``gpu`` and from the raw data for
  ``node``), every tag kept (``GROUP BY time(...), *``);
- ``forever`` (infinite) holding the ``rp_config`` measurement: which policy a dashboard reads for a
  time range of a given length (the dashboards' ``$rp`` variable, docs/dashboards.md);
- ``events`` (default 400 days) for the rare points worth keeping as long as the 1 min rollup:
  :data:`EVENT_MEASUREMENTS` (probes, trainer progress, GPU inventory and events, model results).
  When it is created, what the raw policy holds of them is copied into it. Writers find it with
  :func:`events_policy` and write those points into it *as well as* into the database's default
  policy. ``gpuprobe model`` and ``study`` read both and merge them (:mod:`.eventreads`); the
  dashboards read ``events`` through their ``$erp`` variable.

A continuous query is a scheduled ``SELECT ... INTO``: :func:`backfill` runs the same statements over
a time range, for data that arrived after its windows were computed (an agent's spool replayed after
an outage) and for tests. The rollup schema is in docs/schema.md ("Rollups").
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from gpuprobe.config import format_duration
from gpuprobe.errors import ConfigError
from gpuprobe.fields import GPU_FIELDS
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.influxql import InfluxError, quote_identifier

log = logging.getLogger(__name__)

ROLLUP_10S = "rollup_10s"
ROLLUP_1M = "rollup_1m"
CONFIG_RP = "forever"
CONFIG_MEASUREMENT = "rp_config"
DEFAULT_RAW_RP = "autogen"
EVENTS_RP = "events"
#: Measurements that are rare and worth keeping longer than the raw 10 Hz telemetry: written into
#: ``events`` too once ``--init-db`` created it (the collector writes the first four, ``gpuprobe
#: model`` and ``study`` the last).
EVENT_MEASUREMENTS = ("probe", "trainer", "gpu_info", "gpu_event", "model")

#: Range lengths (ms) up to which a dashboard reads each policy: raw up to 3 h (about 10 s per pixel
#: of a 1 000-pixel panel), the 10 s rollup up to 2 days, the 1 min rollup beyond.
RAW_MAX_RANGE_MS = 3 * 3600 * 1000
ROLLUP_10S_MAX_RANGE_MS = 2 * 86400 * 1000
UNBOUNDED_MS = 2**62

#: How far back each run of a continuous query recomputes (RESAMPLE ... FOR): late lines (agent
#: batches, the collector's WAL, the 10 s rollup itself for the 1 min one) are caught up to this.
RESAMPLE_FOR = {ROLLUP_10S: "30s", ROLLUP_1M: "5m"}

_NAME = re.compile(r"^[A-Za-z0-9_]+$")

# --- the rollup schema --------------------------------------------------------------------------
# (rollup field, aggregate, raw field), from the field catalogue (gpuprobe/fields.py). A rollup field
# named like the raw field holds the window's mean (a gauge), last value (a counter or a setting) or
# max (the clock-event bitmask), so the dashboards' mean()/last()/max()/spread() queries read a rollup
# as they read raw data.

GPU_10S: tuple[tuple[str, str, str], ...] = (
    *(rollup for f in GPU_FIELDS for rollup in f.rollup_fields()),
    ("samples", "count", "temp_c"),
)


def _coarser(fields: tuple[tuple[str, str, str], ...]) -> tuple[tuple[str, str, str], ...]:
    """The 1 min rollup of the 10 s rollup: the same aggregate of each rollup field (a sum of counts)."""
    return tuple((name, "sum" if agg == "count" else agg, name) for name, agg, _ in fields)


GPU_1M = _coarser(GPU_10S)
#: the 10 s rollup of the agent's aggregate points (``res`` tag, docs/schema.md): they carry their own
#: ``_min``/``_max`` fields and ``samples``, so each is combined as the 1 min rollup combines 10 s ones
#: (the min of the minima, the sum of the counts), never the min of the means
GPU_10S_FROM_AGGREGATES = GPU_1M
RAW_ONLY = "\"res\" = ''"
AGGREGATES_ONLY = "\"res\" != ''"
NODE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("cpu_pct", "mean", "cpu_pct"),
    ("load1", "mean", "load1"),
    ("mem_used_bytes", "mean", "mem_used_bytes"),
    ("mem_total_bytes", "last", "mem_total_bytes"),
)
#: hwmon fields are named per machine, so they are selected by regex; InfluxDB names the results
#: ``mean_hwmon_<sensor>_c`` (an alias cannot rename a regex), in both rollups.
NODE_REGEX = "/^hwmon_.*_c$/"


class InitDbError(ConfigError):
    """The database cannot be set up (unreachable, not an admin, a bad name): the message says why."""


@dataclass(frozen=True)
class RetentionPlan:
    """What ``--init-db`` creates. A duration of None or 0 seconds is infinite."""

    database: str
    raw_rp: str = DEFAULT_RAW_RP
    raw_s: float | None = 7 * 86400.0
    rollup_10s_s: float | None = 90 * 86400.0
    rollup_1m_s: float | None = 400 * 86400.0
    events_s: float | None = 400 * 86400.0

    def check(self) -> None:
        if not self.database:
            raise InitDbError("--init-db needs --influx-db")
        if not _NAME.match(self.raw_rp):
            raise InitDbError(
                f"retention policy {self.raw_rp!r}: use letters, digits and _ only (the dashboards put the name "
                "in their queries as it is)"
            )
        if self.raw_rp in (ROLLUP_10S, ROLLUP_1M, CONFIG_RP, EVENTS_RP):
            raise InitDbError(f"the raw retention policy cannot be named {self.raw_rp!r} (--init-db uses that name)")

    def durations(self) -> dict[str, float | None]:
        return {
            self.raw_rp: self.raw_s,
            ROLLUP_10S: self.rollup_10s_s,
            ROLLUP_1M: self.rollup_1m_s,
            CONFIG_RP: None,
            EVENTS_RP: self.events_s,
        }


@dataclass(frozen=True)
class ContinuousQuery:
    name: str
    select: str  # SELECT ... INTO ... FROM ... [WHERE condition] GROUP BY time(...), * fill(none)
    every: str
    resample_for: str

    def create(self, database: str) -> str:
        return (
            f"CREATE CONTINUOUS QUERY {quote_identifier(self.name)} ON {quote_identifier(database)} "
            f"RESAMPLE EVERY {self.every} FOR {self.resample_for} BEGIN {self.select} END"
        )

    def over(self, start_ns: int, end_ns: int) -> str:
        """The query's SELECT INTO for ``start_ns <= time < end_ns``: what the CQ computes for those windows."""
        head, sep, tail = self.select.partition(" GROUP BY ")
        head, where, condition = head.partition(" WHERE ")
        window = f"time >= {start_ns} AND time < {end_ns}"
        return f"{head} WHERE {condition + ' AND ' if where else ''}{window}{sep}{tail}"


def _select(fields: tuple[tuple[str, str, str], ...], regex: str = "") -> str:
    parts = [f"{agg}({quote_identifier(raw)}) AS {quote_identifier(name)}" for name, agg, raw in fields]
    if regex:
        parts.append(f"mean({regex})")
    return ", ".join(parts)


def continuous_queries(plan: RetentionPlan) -> list[ContinuousQuery]:
    db = quote_identifier(plan.database)

    def path(rp: str, measurement: str) -> str:
        return f"{db}.{quote_identifier(rp)}.{quote_identifier(measurement)}"

    def cq(
        name: str, fields: str, into_rp: str, from_rp: str, measurement: str, window: str, where: str = ""
    ) -> ContinuousQuery:
        select = (
            f"SELECT {fields} INTO {path(into_rp, measurement)} FROM {path(from_rp, measurement)} "
            f"{'WHERE ' + where + ' ' if where else ''}GROUP BY time({window}), * fill(none)"
        )
        return ContinuousQuery(name, select, window, RESAMPLE_FOR[into_rp])

    return [
        # raw 10 Hz points and the agent's aggregates (res tag) each into their own rollup series
        cq("gpu_rollup_10s", _select(GPU_10S), ROLLUP_10S, plan.raw_rp, "gpu", "10s", RAW_ONLY),
        cq(
            "gpu_aggregates_rollup_10s",
            _select(GPU_10S_FROM_AGGREGATES),
            ROLLUP_10S,
            plan.raw_rp,
            "gpu",
            "10s",
            AGGREGATES_ONLY,
        ),
        cq("gpu_rollup_1m", _select(GPU_1M), ROLLUP_1M, ROLLUP_10S, "gpu", "1m"),
        cq("node_rollup_10s", _select(NODE_FIELDS, NODE_REGEX), ROLLUP_10S, plan.raw_rp, "node", "10s"),
        cq("node_rollup_1m", _select(NODE_FIELDS, NODE_REGEX), ROLLUP_1M, plan.raw_rp, "node", "1m"),
    ]


def rp_config_lines(plan: RetentionPlan) -> list[str]:
    """The ``rp_config`` points: the policy a dashboard reads for a range of ``min_range_ms`` (exclusive)
    to ``max_range_ms`` (inclusive), one per ``level`` tag, stamped at time 0 (they never expire)."""
    resolutions = ("raw", "10s", "1m")
    return [
        f'{CONFIG_MEASUREMENT},level={i} rp="{rp}",resolution="{resolutions[i]}",'
        f"min_range_ms={lo}i,max_range_ms={hi}i 0"
        for i, (rp, lo, hi) in enumerate(_levels(plan))
    ]


def rp_variable_query() -> str:
    """The dashboards' ``$rp`` variable: the policy for the length of the chosen time range."""
    span = "${__to} - ${__from}"
    return (
        f'SELECT "rp" FROM {quote_identifier(CONFIG_RP)}.{quote_identifier(CONFIG_MEASUREMENT)} '
        f'WHERE "min_range_ms" < {span} AND "max_range_ms" >= {span}'
    )


def shard_duration_s(seconds: float | None) -> float:
    """InfluxDB's own shard group duration for a retention policy this long (what CREATE picks; set
    again when ALTER changes the duration, so a 7-day policy drops data a day at a time, not a week)."""
    if not seconds:
        return 7 * 86400.0
    if seconds < 2 * 86400:
        return 3600.0
    if seconds <= 182 * 86400:
        return 86400.0
    return 7 * 86400.0


def _influx_duration(seconds: float | None) -> str:
    return "INF" if not seconds else format_duration(seconds)


def _parse_go_duration(text: str) -> float:
    """InfluxDB's ``168h0m0s`` (SHOW RETENTION POLICIES) in seconds; ``0s`` is infinite."""
    total = 0.0
    for number, unit in re.findall(r"([0-9.]+)(h|m|s|ms|us|µs|ns)", text):
        total += float(number) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}[unit]
    return total


def _normalized(statement: str) -> str:
    return " ".join(statement.replace('"', "").split())


@dataclass
class InitReport:
    """What :func:`init_db` did, one line per thing: ``created``, ``changed`` or ``unchanged``."""

    lines: list[str] = field(default_factory=list)

    def add(self, what: str, outcome: str) -> None:
        self.lines.append(f"{outcome:9} {what}")

    @property
    def changed(self) -> bool:
        return any(not line.startswith("unchanged") for line in self.lines)


def create_database_statement(database: str) -> str:
    """The one ``CREATE DATABASE`` statement, for ``--init-db`` and the collector's ``--influx-create-db``."""
    return f"CREATE DATABASE {quote_identifier(database)}"


def create_policy_statement(database: str, policy: str, duration: str, *, default: bool = False) -> str:
    """The one ``CREATE RETENTION POLICY`` statement (``duration``: an InfluxQL duration literal or ``INF``),
    for ``--init-db`` and the collector's ``--influx-create-db``."""
    return (
        f"CREATE RETENTION POLICY {quote_identifier(policy)} ON {quote_identifier(database)} "
        f"DURATION {duration} REPLICATION 1{' DEFAULT' if default else ''}"
    )


def _run(client: InfluxClient, statement: str, database: str | None = None) -> None:
    client.execute(statement, database=database if database is not None else "")


def init_db(client: InfluxClient, plan: RetentionPlan) -> InitReport:
    """Create or update the database, its retention policies, continuous queries and ``rp_config``.

    :class:`InitDbError` when InfluxDB cannot be reached or refuses (no admin rights, for instance)."""
    plan.check()
    try:
        return _init_db(client, plan)
    except InfluxError as exc:
        if exc.status is None:
            raise InitDbError(f"{exc}") from exc
        if exc.status in (401, 403) or "authoriz" in exc.message.lower():
            raise InitDbError(
                f"InfluxDB refused: {exc.message}. --init-db creates databases, retention policies and "
                "continuous queries: give an admin user (--influx-username/--influx-password)"
            ) from exc
        raise InitDbError(str(exc)) from exc


def _init_db(client: InfluxClient, plan: RetentionPlan) -> InitReport:
    report = InitReport()
    db = plan.database
    qdb = quote_identifier(db)
    existing_dbs = {str(row[0]) for s in client.query("SHOW DATABASES", database="") for row in s.values}
    if db not in existing_dbs:
        _run(client, create_database_statement(db))
        report.add(f"database {db}", "created")
    else:
        report.add(f"database {db}", "unchanged")

    policies = {
        str(row[0]): (_parse_go_duration(str(row[1])), bool(row[4]), _parse_go_duration(str(row[2])))
        for s in client.query(f"SHOW RETENTION POLICIES ON {qdb}", database="")
        for row in s.values
    }
    for name, seconds in plan.durations().items():
        want = float(seconds or 0.0)
        make_default = name == plan.raw_rp
        literal = _influx_duration(seconds)
        what = f"retention policy {name} (duration {literal}{', default' if make_default else ''})"
        qname = quote_identifier(name)
        if name not in policies:
            _run(client, create_policy_statement(db, name, literal, default=make_default))
            report.add(what, "created")
            if name == EVENTS_RP and plan.raw_rp in policies:
                copied = copy_events(client, plan)
                report.add(f"{copied} points of {', '.join(EVENT_MEASUREMENTS)} copied from {plan.raw_rp}", "changed")
            continue
        have, is_default, shard = policies[name]
        changes = []
        if abs(have - want) > 1e-6:
            changes.append(f"DURATION {literal}")
        if abs(shard - shard_duration_s(seconds)) > 1e-6:
            changes.append(f"SHARD DURATION {format_duration(shard_duration_s(seconds))}")
        if make_default and not is_default:
            changes.append("DEFAULT")
        if changes:
            _run(client, f"ALTER RETENTION POLICY {qname} ON {qdb} {' '.join(changes)}")
            report.add(what, "changed")
        else:
            report.add(what, "unchanged")

    present = {
        str(row[0]): str(row[1])
        for s in client.query("SHOW CONTINUOUS QUERIES", database="")
        if s.name == db
        for row in s.values
    }
    for cq in continuous_queries(plan):
        statement = cq.create(db)
        what = f"continuous query {cq.name} (every {cq.every}, for {cq.resample_for})"
        if cq.name in present:
            if _normalized(present[cq.name]) == _normalized(statement):
                report.add(what, "unchanged")
                continue
            _run(client, f"DROP CONTINUOUS QUERY {quote_identifier(cq.name)} ON {qdb}")
            _run(client, statement)
            report.add(what, "changed")
        else:
            _run(client, statement)
            report.add(what, "created")

    wanted = rp_config_lines(plan)
    current = client.query(f"SELECT * FROM {quote_identifier(CONFIG_RP)}.{quote_identifier(CONFIG_MEASUREMENT)}", db)
    have_rows = sorted(
        (str(r.get("level")), r.get("rp"), r.get("min_range_ms"), r.get("max_range_ms"))
        for s in current
        for r in s.rows()
    )
    want_rows = sorted((str(i), rp, lo, hi) for i, (rp, lo, hi) in enumerate(_levels(plan)))
    if have_rows != want_rows:
        client.write(wanted, database=db, retention_policy=CONFIG_RP)
        report.add(
            f"{CONFIG_RP}.{CONFIG_MEASUREMENT} (dashboards' $rp by range length)", "changed" if current else "created"
        )
    else:
        report.add(f"{CONFIG_RP}.{CONFIG_MEASUREMENT} (dashboards' $rp by range length)", "unchanged")
    return report


def copy_events(client: InfluxClient, plan: RetentionPlan) -> int:
    """Copies the :data:`EVENT_MEASUREMENTS` points of the raw policy into ``events`` (every tag kept);
    returns how many were written. Idempotent: a point copied twice overwrites itself."""
    db = quote_identifier(plan.database)
    names = "|".join(EVENT_MEASUREMENTS)
    statement = (
        f"SELECT * INTO {db}.{quote_identifier(EVENTS_RP)}.:MEASUREMENT "
        f"FROM {db}.{quote_identifier(plan.raw_rp)}./^({names})$/ GROUP BY *"
    )
    return sum(int(row[1]) for s in client.execute(statement, database=plan.database) for row in s.values)


def events_policy(client: InfluxClient, database: str | None = None) -> str | None:
    """``events`` when the database has that retention policy (``--init-db`` made it), else None.

    Raises :class:`.influxql.InfluxError` when InfluxDB cannot answer."""
    db = client.settings.database if database is None else database
    answer = client.query(f"SHOW RETENTION POLICIES ON {quote_identifier(db)}", database="")
    return EVENTS_RP if any(str(row[0]) == EVENTS_RP for s in answer for row in s.values) else None


def write_with_events(client: InfluxClient, lines: str) -> int:
    """Writes ``lines`` (points of :data:`EVENT_MEASUREMENTS`) as configured, and into ``events`` too
    when the database has it; returns how many lines were written (once counted)."""
    written = client.write(lines)
    if not written:
        return 0
    try:
        policy = events_policy(client)
    except InfluxError as exc:  # a user who may write but not list policies: the default policy has them
        log.warning("cannot list the retention policies (%s): the points are in the default policy only", exc)
        return written
    if policy is not None:
        client.write(lines, retention_policy=policy)
    return written


def _levels(plan: RetentionPlan) -> list[tuple[str, int, int]]:
    return [
        (plan.raw_rp, 0, RAW_MAX_RANGE_MS),
        (ROLLUP_10S, RAW_MAX_RANGE_MS, ROLLUP_10S_MAX_RANGE_MS),
        (ROLLUP_1M, ROLLUP_10S_MAX_RANGE_MS, UNBOUNDED_MS),
    ]


def backfill(client: InfluxClient, plan: RetentionPlan, start_ns: int, end_ns: int) -> None:
    """Run every continuous query's ``SELECT ... INTO`` over ``[start_ns, end_ns)``, 10 s rollups first
    (the 1 min rollup of ``gpu`` reads them). Windows are aligned by InfluxDB: widen the range to whole
    minutes to recompute them completely."""
    for cq in continuous_queries(plan):
        client.execute(cq.over(start_ns, end_ns), database=plan.database)
