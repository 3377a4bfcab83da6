"""Part: influx. The ``--influx-*`` options, declared once for every command that talks to InfluxDB.

:func:`connection_options` are what every one takes (``gpuprobe collector``, ``model``, ``import``,
``study``: where InfluxDB is and how to log in); :data:`WRITE_OPTIONS` what only the collector adds,
which writes through either API. The defaults are :class:`~gpuprobe.influx.settings.InfluxSettings`'
own, so an option and the settings it fills cannot disagree.
"""

from __future__ import annotations

from gpuprobe.config import Option, parse_duration, parse_duration_or_none
from gpuprobe.influx.settings import InfluxSettings

_DEFAULT = InfluxSettings()


def connection_options(*, timeout_s: float = _DEFAULT.timeout_s) -> list[Option]:
    """Where InfluxDB is and how to log in; ``timeout_s``: the default of one request (a query for the
    analysis commands, a write for the collector)."""
    return [
        Option(
            "influx_url",
            "InfluxDB base URL (1.x; 2.x and 3.x through their v1 API, /query and /write)",
            default=_DEFAULT.url,
            metavar="URL",
        ),
        Option(
            "influx_db",
            "database (v1; on 2.x the database mapped to the bucket)",
            default=_DEFAULT.database,
            metavar="NAME",
        ),
        Option(
            "influx_rp",
            "retention policy (v1; empty: the database default)",
            default=_DEFAULT.retention_policy,
            metavar="NAME",
        ),
        Option(
            "influx_username", "user name for basic authentication (1.x)", default=_DEFAULT.username, metavar="NAME"
        ),
        Option(
            "influx_password", "password for basic authentication (1.x)", default=_DEFAULT.password, metavar="SECRET"
        ),
        Option(
            "influx_token",
            "API token, sent as `Authorization: Token ...` (2.x and 3.x; the v2 API needs one)",
            default=_DEFAULT.token,
            metavar="SECRET",
        ),
        Option("influx_timeout", "timeout of one request", parse_duration, default=timeout_s),
    ]


WRITE_OPTIONS = [
    Option(
        "influx_api",
        "write API: v1 (/write: InfluxDB 1.x, and the v1 compatibility API of 2.x/3.x) or v2 "
        "(/api/v2/write via influxdb-client, with org, bucket and token)",
        default=_DEFAULT.api,
        choices=["v1", "v2"],
    ),
    Option("influx_org", "organization (v2)", default=_DEFAULT.org, metavar="NAME"),
    Option("influx_bucket", "bucket (v2)", default=_DEFAULT.bucket, metavar="NAME"),
    Option(
        "influx_create_db",
        "create the database (and --influx-rp with --influx-retention) at start and after a 404 (v1)",
        default=_DEFAULT.create_database,
        is_flag=True,
    ),
    Option(
        "influx_retention",
        "how long a created retention policy keeps data (0 or empty: infinite)",
        parse_duration_or_none,
    ),
    Option("influx_ca", "CA certificate file to verify an https InfluxDB", default=_DEFAULT.ca_file, metavar="FILE"),
    Option(
        "influx_gzip_level",
        "gzip level of write requests (0: no compression)",
        type=int,
        default=_DEFAULT.gzip_level,
        metavar="0-9",
    ),
]
