"""Part: collector. ``gpuprobe install collector``: the hardened systemd unit, ``/etc/gpuprobe/collector.toml`` and the
user.

Files (under ``--root DIR`` when staging an image or a test tree):

- ``/etc/systemd/system/gpuprobe-collector.service``: rendered by :func:`gpuprobe.systemd.render_unit`
  (Type=notify with WatchdogSec, Restart=on-failure, an unprivileged user, StateDirectory
  ``/var/lib/gpuprobe/collector`` for the WAL, ProtectSystem=strict and the rest of the shared
  hardening), plus ``EnvironmentFile=-/etc/gpuprobe/collector.env`` for secrets
  (``GPUPROBE_INFLUX_TOKEN=...``, ``GPUPROBE_INFLUX_PASSWORD=...``) and a higher file limit;
- ``/etc/gpuprobe/collector.toml``: the ``[collector]`` options given here (TLS and authentication
  on by default); every other option keeps its default (``gpuprobe collector --help``);
- ``/etc/sysusers.d/gpuprobe-collector.conf``: the unprivileged user, created by ``systemd-sysusers``.

Nothing is overwritten without ``--force``. Imported to list the commands: imports little.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprobe.collector.options import OPTION
from gpuprobe.config import Option, parse_whole_seconds
from gpuprobe.systemd import (
    UnitSpec,
    default_executable,
    hidden_executable_warning,
    render_unit,
    secret_files_note,
    staged_path,
    staging_root,
    toml_value,
    write_install_files,
    written_to_config,
)

UNIT_PATH = "/etc/systemd/system/gpuprobe-collector.service"
CONFIG_PATH = "/etc/gpuprobe/collector.toml"
ENV_PATH = "/etc/gpuprobe/collector.env"
SYSUSERS_PATH = "/etc/sysusers.d/gpuprobe-collector.conf"
STATE_DIRECTORY = "gpuprobe/collector"
WAL_DIR = "/var/lib/gpuprobe/collector"


INSTALL_OPTIONS = [
    Option("root", "stage the files under DIR instead of / (for images and tests)", Path, metavar="DIR"),
    Option("force", "overwrite files that exist", is_flag=True, default=False, flag_only=True),
    Option("executable", "the gpuprobe program the unit runs (default: this installation's)", Path, metavar="PATH"),
    Option("user", "unprivileged user (and group) the collector runs as", default="gpuprobe"),
    *(
        written_to_config(OPTION[name])
        for name in ("listen", "influx_url", "influx_db", "influx_api", "influx_org", "influx_bucket", "tokens_file")
    ),
    written_to_config(OPTION["tls_cert"], default=Path("/etc/gpuprobe/tls/collector.crt")),
    written_to_config(OPTION["tls_key"], default=Path("/etc/gpuprobe/tls/collector.key")),
    Option(
        "tls_client_ca",
        "agents' CA (mutual TLS) written to the config; 'none' to rely on tokens",
        default="/etc/gpuprobe/tls/agents-ca.crt",
        metavar="FILE",
    ),
    written_to_config(
        OPTION["metrics_listen"],
        "; the metrics have no authentication, so the default is this host only: give an address Prometheus"
        " reaches (0.0.0.0:9447) where a firewall keeps the others out",
        default="127.0.0.1:9447",
    ),
    written_to_config(OPTION["workers"]),
    Option("watchdog", "systemd watchdog timeout, in whole seconds", parse_whole_seconds, 30),
]


def render_config(values: dict[str, Any]) -> str:
    entries: dict[str, Any] = {
        "listen": values["listen"],
        "influx_url": values["influx_url"],
        "influx_api": values["influx_api"],
    }
    if values["influx_api"] == "v2":
        entries["influx_org"] = values["influx_org"]
        entries["influx_bucket"] = values["influx_bucket"]
    else:
        entries["influx_db"] = values["influx_db"]
    entries["wal"] = WAL_DIR
    entries["tls_cert"] = str(values["tls_cert"])
    entries["tls_key"] = str(values["tls_key"])
    if values["tls_client_ca"] and values["tls_client_ca"] != "none":
        entries["tls_client_ca"] = str(values["tls_client_ca"])
    if values["tokens_file"] is not None:
        entries["tokens_file"] = str(values["tokens_file"])
    if values["metrics_listen"]:
        entries["metrics_listen"] = values["metrics_listen"]
    if values["workers"] != 1:
        entries["workers"] = int(values["workers"])
    lines = [
        "# gpuprobe collector configuration, written by `gpuprobe install collector`.",
        "# Any option of `gpuprobe collector --help` can be set here (keys use underscores).",
        "# GPUPROBE_* environment variables (for secrets: " + ENV_PATH + ") and flags override this file.",
        "# docs/operations.md: TLS and tokens, scaling, WAL sizing, InfluxDB errors, metrics.",
        "",
        "[collector]",
        *(f"{key} = {toml_value(value)}" for key, value in entries.items()),
        "",
    ]
    return "\n".join(lines)


def render_collector_unit(values: dict[str, Any], executable: Path) -> str:
    spec = UnitSpec(
        description="gpuprobe collector: agents' telemetry into InfluxDB",
        exec_start=[str(executable), "--config", CONFIG_PATH, "collector"],
        user=values["user"],
        state_directory=STATE_DIRECTORY,
        watchdog_s=int(values["watchdog"]),
        timeout_stop_s=30,
    )
    unit = render_unit(spec)
    return unit.replace("[Service]\n", f"[Service]\nEnvironmentFile=-{ENV_PATH}\nLimitNOFILE=65536\n", 1)


def render_sysusers(user: str) -> str:
    return f'u {user} - "gpuprobe telemetry" /var/lib/gpuprobe\n'


def run(values: dict[str, Any], args: argparse.Namespace, check_config: Callable[[str], str | None]) -> int:
    """Install the collector; ``check_config`` says what the collector would refuse in a config file
    (its own parsers, passed in by ``collector/cli.py`` so this module need not import its caller)."""

    def fail(message: str) -> int:
        print(f"gpuprobe install collector: error: {message}", file=sys.stderr)
        return 2

    executable = Path(values["executable"]) if values["executable"] else default_executable()
    if not executable.is_absolute():
        return fail(f"--executable must be an absolute path, not {executable}")
    if values["workers"] < 1:
        return fail("--workers must be at least 1")
    if values["influx_api"] == "v2" and not (values["influx_org"] and values["influx_bucket"]):
        return fail("--influx-api v2 needs --influx-org and --influx-bucket (the token goes into " + ENV_PATH + ")")
    config_text = render_config(values)
    refused = check_config(config_text)
    if refused is not None:
        # what the collector would refuse at every start (and systemd restart without end): refused here
        return fail(f"the collector would refuse this configuration: {refused}")
    unit_text = render_collector_unit(values, executable)
    root = staging_root(values["root"])
    files = {
        staged_path(root, UNIT_PATH): (unit_text, 0o644),
        staged_path(root, CONFIG_PATH): (config_text, 0o644),
        staged_path(root, SYSUSERS_PATH): (render_sysusers(values["user"]), 0o644),
    }
    written = write_install_files(files, values["force"], "install collector")
    if written != 0:
        return written
    where = f" (staged under {root}: copy that tree onto the host first)" if root is not None else ""
    user = values["user"]
    print(f"\nnext steps{where}:")
    print(f"  put the server certificate and key at {values['tls_cert']} and {values['tls_key']}")
    if values["tls_client_ca"] and values["tls_client_ca"] != "none":
        print(f"  put the CA that signs the agents' certificates at {values['tls_client_ca']}")
    print(f"  secrets (GPUPROBE_INFLUX_TOKEN=..., GPUPROBE_INFLUX_PASSWORD=...) go into {ENV_PATH} (mode 0600)")
    print(f"  systemd-sysusers                          # creates the user {user}")
    print("  systemctl daemon-reload")
    print("  systemctl enable --now gpuprobe-collector")
    print("  journalctl -u gpuprobe-collector -f")
    files_read: list[tuple[str, Path, bool]] = [
        ("tls_cert", Path(values["tls_cert"]), False),
        ("tls_key", Path(values["tls_key"]), True),
    ]
    if values["tls_client_ca"] and values["tls_client_ca"] != "none":
        files_read.append(("tls_client_ca", Path(values["tls_client_ca"]), False))
    if values["tokens_file"] is not None:
        files_read.append(("tokens_file", Path(values["tokens_file"]), True))
    print("\n" + secret_files_note(files_read, user))
    print(f"  {ENV_PATH}  0600 root:root (systemd reads it before dropping to {user})")
    warning = hidden_executable_warning(executable, unit_text)
    if warning:
        print(f"\n{warning}")
    return 0
