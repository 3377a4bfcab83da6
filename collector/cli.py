"""Part: collector. ``gpuprobe collector`` and ``gpuprobe install collector``: their options (flags, ``GPUPROBE_*``,
TOML)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprobe.collector import certs
from gpuprobe.collector.install import INSTALL_OPTIONS
from gpuprobe.collector.options import OPTIONS
from gpuprobe.config import Command, Option, format_duration

if TYPE_CHECKING:  # imported when run: `gpuprobe --help` must not need the collector's dependencies
    from gpuprobe.collector.settings import CollectorSettings

log = logging.getLogger(__name__)


def config_from_options(values: dict[str, Any]) -> CollectorSettings:
    """The :class:`CollectorSettings` of resolved option values (checked)."""
    from gpuprobe.collector.settings import (
        CollectorConfigError,
        CollectorSettings,
        SinkSettings,
        default_collector_id,
        parse_route,
    )
    from gpuprobe.influx.settings import InfluxSettings
    from gpuprobe.wire.validate import Limits

    try:
        limits = Limits(
            max_clock_skew_s=values["max_clock_skew"],
            max_sample_age_s=values["max_sample_age"],
            timestamp_policy=values["timestamp_policy"],
            max_tag_bytes=values["max_tag_bytes"],
            max_message_bytes=values["max_message_bytes"],
        )
    except ValueError as exc:
        raise CollectorConfigError(str(exc)) from None
    config = CollectorSettings(
        listen=values["listen"],
        wal_dir=values["wal"],
        wal_max_bytes=values["wal_max_bytes"],
        quarantine_max_lines=values["quarantine_max_lines"],
        workers=values["workers"],
        collector_id=values["collector_id"] or default_collector_id(),
        tls_cert=values["tls_cert"],
        tls_key=values["tls_key"],
        tls_client_ca=values["tls_client_ca"],
        tls_bind_agent_id=values["tls_bind_agent_id"],
        tokens_file=values["tokens_file"],
        insecure=values["insecure"],
        metrics_listen=values["metrics_listen"],
        ack_after=values["ack_after"],
        drain_timeout_s=values["drain_timeout"],
        limits=limits,
        influx=InfluxSettings.from_option_values(
            values,
            api=values["influx_api"],
            org=values["influx_org"],
            bucket=values["influx_bucket"],
            create_database=values["influx_create_db"],
            # an InfluxQL duration literal (format_duration writes one); 0 or unset: infinite
            retention=format_duration(values["influx_retention"]) if values["influx_retention"] else "",
            ca_file=values["influx_ca"],
            gzip_level=values["influx_gzip_level"],
        ),
        routes=tuple(parse_route(text) for text in values["influx_route"] or ()),
        sink=SinkSettings(
            batch_lines=values["sink_batch_lines"],
            concurrency=values["sink_concurrency"],
            linger_s=values["sink_linger"],
            backoff_max_s=max(values["sink_max_backoff"], 0.01),
            backoff_initial_s=min(0.5, max(values["sink_max_backoff"], 0.01)),
        ),
    )
    config.check()
    return config


def run(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.collector.auth import AuthConfigError
    from gpuprobe.collector.runner import run as run_collector
    from gpuprobe.collector.settings import CollectorConfigError
    from gpuprobe.collector.wal import WalError

    if values["init_db"]:
        return _init_db(values)
    try:
        config = config_from_options(values)
        return run_collector(config)
    except (CollectorConfigError, AuthConfigError, WalError) as exc:
        print(f"gpuprobe collector: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1


def _init_db(values: dict[str, Any]) -> int:
    """``--init-db``: set up retention policies, rollups and continuous queries, say what changed, exit."""
    from gpuprobe.influx.client import InfluxClient
    from gpuprobe.influx.retention import InitDbError, RetentionPlan, backfill, init_db
    from gpuprobe.influx.settings import InfluxSettings

    if values["influx_api"] != "v1":
        print(
            "gpuprobe collector: error: --init-db sets up InfluxDB 1.x (--influx-api v1); for 2.x and 3.x see "
            "docs/operations.md, Retention and rollups",
            file=sys.stderr,
        )
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here
    settings = InfluxSettings.from_option_values(values, ca_file=values["influx_ca"])
    plan = RetentionPlan(
        database=values["influx_db"],
        raw_rp=values["influx_rp"] or "autogen",
        raw_s=values["retention_raw"],
        rollup_10s_s=values["retention_10s"],
        rollup_1m_s=values["retention_1m"],
        events_s=values["retention_events"],
    )
    try:
        # the settings' retention policy is where the collector writes; --init-db's statements name theirs
        with InfluxClient(dataclasses.replace(settings, retention_policy=""), user_agent="gpuprobe-init-db") as client:
            report = init_db(client, plan)
            if values["backfill"] > 0:
                minute = 60 * 10**9
                end = (time.time_ns() // minute + 1) * minute
                start = (end - int(values["backfill"] * 1e9)) // minute * minute
                backfill(client, plan, start, end)
                report.add(f"rollups of the last {format_duration(values['backfill'])} (computed again)", "changed")
    except InitDbError as exc:
        print(f"gpuprobe collector: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"InfluxDB {settings.base_url}, database {plan.database}:")
    for line in report.lines:
        print("  " + line)
    print("done: " + ("changes made" if report.changed else "nothing to change"), flush=True)
    return 0


def _run_install(values: dict[str, Any], args: argparse.Namespace) -> int:
    from gpuprobe.collector import install

    return install.run(values, args, check_config_text)


def check_config_text(config_text: str) -> str | None:
    """What the collector would say when it read ``config_text`` (its own option parsers and settings
    checks, and the tokens and TLS files where they exist), or None when it accepts it. The secrets of
    install.ENV_PATH are not known here: a v2 token is taken as given."""
    import tomllib

    from gpuprobe.collector import install
    from gpuprobe.collector.auth import AuthConfigError, TokenStore, server_credentials
    from gpuprobe.config import ConfigError, resolve

    try:
        data = tomllib.loads(config_text)
        # the unit adds only install.ENV_PATH's secrets to this file: stand in for the v2 token kept there
        environ = {"GPUPROBE_INFLUX_TOKEN": "from-" + install.ENV_PATH}
        values = resolve("collector", OPTIONS, argparse.Namespace(), data, Path(install.CONFIG_PATH), environ=environ)
        config = config_from_options(values)
        if config.tokens_file is not None and config.tokens_file.exists():
            TokenStore(config.tokens_file)
        tls_files = [config.tls_cert, config.tls_key, config.tls_client_ca]
        if (
            config.tls_cert is not None
            and config.tls_key is not None
            and all(p is None or p.exists() for p in tls_files)
        ):
            server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
    except (ConfigError, AuthConfigError) as e:
        return str(e)
    return None


def _run_certs(values: dict[str, Any], args: argparse.Namespace) -> int:
    return certs.run(values)


CERTS_OPTIONS = [
    Option("out", "folder to write the files into (made if missing)", Path, metavar="DIR"),
    Option(
        "server_name",
        "a DNS name or IP address clients connect to (the collector's, the broker's); repeatable",
        multiple=True,
        default=[],
        metavar="NAME",
    ),
    Option(
        "node",
        "a node name (its agent's --host): a client certificate and a token; repeatable",
        multiple=True,
        default=[],
        metavar="NAME",
    ),
    Option("days", "how long the certificates are valid, in days", float, 365.0, metavar="DAYS"),
    Option(
        "force",
        "replace existing files (the certificates and tokens in use stop working)",
        is_flag=True,
        default=False,
        flag_only=True,
    ),
]

CERTS_DESCRIPTION = f"""\
Makes the certificates and tokens of a TLS set-up in --out DIR:

{certs.help_table()}

Keys and tokens belong to whoever runs this, which is what a service started by that user reads.
A service that runs as its own user needs its own copy, owned by it; for Mosquitto:
  install -o mosquitto -m 0600 DIR/server.key /etc/mosquitto/gpuprobe/server.key
(likewise -o influxdb); the gpuprobe services read theirs as their group:
  install -o root -g gpuprobe -m 0640 DIR/nodes/NODE.key /etc/gpuprobe/agent.key
Refuses to replace existing files without --force. See docs/setup.md."""

COMMANDS = [
    Command(
        name="certs",
        help="make a CA, a server certificate, and a client certificate and token per node",
        description=CERTS_DESCRIPTION,
        raw_description=True,
        run=_run_certs,
        options=CERTS_OPTIONS,
    ),
    Command(
        name="collector",
        help="run the collector: authenticated gRPC ingest from agents into InfluxDB",
        description=(
            "Receives the agents' telemetry streams (gRPC, TLS and/or tokens), validates and encodes the "
            "samples as InfluxDB line protocol, acknowledges each batch once it is durable in the "
            "write-ahead log (--wal; with --ack-after sink: once InfluxDB has it) and writes the log into "
            "InfluxDB in gzip batches. SIGTERM drains it: streams end, the WAL is written into InfluxDB. "
            "See docs/operations.md and docs/schema.md."
        ),
        run=run,
        options=OPTIONS,
    ),
    Command(
        name="install.collector",
        help="install the collector as a systemd service (unit + /etc/gpuprobe/collector.toml)",
        description=(
            "Writes the hardened systemd unit gpuprobe-collector.service, /etc/gpuprobe/collector.toml and a "
            "sysusers.d entry (under --root DIR to stage them). Refuses to overwrite files without --force."
        ),
        run=_run_install,
        options=INSTALL_OPTIONS,
    ),
]
