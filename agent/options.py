"""Part: agent. The agent's options, declared once: ``gpuprobe agent``'s (:data:`AGENT_OPTIONS`), from
which ``gpuprobe install agent`` takes those it writes into the agent's config (agent/install.py).

Imported by every ``gpuprobe`` invocation (through agent/cli.py, to list the commands): it stays light.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gpuprobe.config import Option, parse_duration
from gpuprobe.control.mqtt import MQTT_OPTIONS
from gpuprobe.control.settings import CONTROL_DIR, CONTROL_OPTIONS, RETRY_OPTIONS, RETRY_PREFIX

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str) -> int:
    """``536870912``, ``512MiB``, ``2GiB``, ``64K`` -> bytes (binary multiples)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (for example 512MiB)")
    unit = (m.group(2) or "").upper()[:1]
    return int(float(m.group(1)) * _UNITS[unit])


DEFAULT_SPOOL = "/var/lib/gpuprobe/agent/spool"


def _fleet_options() -> list[Option]:
    """The control plane's options (gpuprobe.control.settings), as `gpuprobe agent` takes them: the broker is
    off by default, the control directory defaults to the spool's, and the reconnect pauses towards the
    broker get an ``mqtt_`` prefix (``--reconnect-max`` / ``--auth-retry`` are the collector's here)."""
    out: list[Option] = []
    for opt in MQTT_OPTIONS:
        if opt.name == "broker":
            opt = dataclasses.replace(
                opt,
                default="",
                help="MQTT broker of the fleet control plane (probes): mqtt://HOST[:PORT] or mqtts://HOST[:PORT]"
                " (TLS); turns fleet probes on (default: off)",
                doc="MQTT broker of the control plane, `mqtt://HOST[:1883]` or `mqtts://HOST[:8883]` (TLS); turns"
                " fleet probes on",
                default_text="off",
            )
        out.append(opt)
    for opt in CONTROL_OPTIONS:
        if opt is CONTROL_DIR:
            opt = dataclasses.replace(
                opt,
                default=None,
                help=f"{opt.help} (default: SPOOL/control)",
                default_text="`SPOOL/control`",
            )
        out.append(opt)
    for opt in RETRY_OPTIONS:
        out.append(dataclasses.replace(opt, name=RETRY_PREFIX + opt.name, help=f"MQTT: {opt.help}", doc=None))
    return out


AGENT_OPTIONS = [
    Option(
        "collector",
        "collector address HOST[:PORT] (port 7447 when not given); several (comma-separated or repeated) for"
        " failover, tried in order",
        multiple=True,
        default=[],
        metavar="HOST[:PORT][,HOST[:PORT]...]",
        default_text="— (required)",
        doc=(
            "collector address HOST[:PORT] (port 7447, the collector's default, when not "
            "given; IPv6 as `[ADDR]` or `[ADDR]:PORT`); several (comma-separated or repeated) "
            "to spread a fleet and fail over: the first tried is the one a stable hash "
            "(SHA-256) of the agent id picks, then the others in the given order after it "
            "([Several collectors](#several-collectors))"
        ),
    ),
    Option("interval", "GPU sampling interval (100ms = 10 Hz; 20ms = 50 Hz at most)", parse_duration, 0.1),
    Option(
        "spool", "spool directory (durable queue of unacknowledged batches)", Path, Path(DEFAULT_SPOOL), metavar="DIR"
    ),
    Option(
        "spool_max_bytes",
        "spool size cap (e.g. 512MiB); beyond it the oldest batches are dropped and counted",
        parse_size,
        512 * 2**20,
        metavar="SIZE",
        default_text="512MiB",
    ),
    Option("spool_max_age", "drop spooled batches older than this (0: no age cap)", parse_duration, 7 * 86400.0),
    Option(
        "spool_memory_max_bytes",
        "while the spool's disk is full, hold at most this much in memory (e.g. 16MiB); beyond it the oldest"
        " batches are dropped and counted",
        parse_size,
        16 * 2**20,
        metavar="SIZE",
        default_text="16MiB",
    ),
    Option(
        "host",
        "host name: the `host` tag and MQTT topic segment (default: the system's host name)",
        default="",
        default_text="system host name",
    ),
    Option("agent_id", "agent id, unique in the fleet (default: --host)", default="", default_text="`--host`"),
    Option("cluster", "cluster or fleet name (`cluster` tag)", default=""),
    Option("cloud", "cloud provider, e.g. aws (default: detected from DMI)", default="", default_text="from DMI"),
    Option(
        "instance_type",
        "instance type, e.g. p5.48xlarge (default: detected from DMI on AWS)",
        default="",
        default_text="from DMI (AWS)",
    ),
    Option("region", "region or site name (`region` tag)", default=""),
    Option(
        "virt",
        "GPU virtualization (`virt` tag); auto: from NVML and the CPU's hypervisor flag",
        default="auto",
        choices=["auto", "bare_metal", "passthrough", "vgpu", "host_vgpu", "unknown"],
    ),
    Option(
        "tls",
        "use TLS with the system's root certificates (implied by --tls-ca / --tls-cert)",
        is_flag=True,
        default=False,
    ),
    Option("tls_ca", "CA certificate (PEM) that signed the collector's certificate", Path, metavar="FILE"),
    Option("tls_cert", "client certificate (PEM) for mutual TLS", Path, metavar="FILE"),
    Option("tls_key", "client private key (PEM) for mutual TLS", Path, metavar="FILE"),
    Option("tls_server_name", "name expected in the collector's certificate, when it differs from HOST", default=""),
    Option("token", "bearer token sent as `authorization: Bearer TOKEN` (prefer --token-file)", default=""),
    Option("token_file", "file holding the bearer token", Path, metavar="FILE"),
    Option(
        "metrics_listen",
        "serve Prometheus metrics on HOST:PORT, port 0: any free port, logged (default: off)",
        default="",
        metavar="HOST:PORT",
        default_text="off",
    ),
    Option(
        "prometheus_listen",
        "serve the GPUs' newest readings under dcgm-exporter's metric names on HOST:PORT/metrics (default: off;"
        " a separate endpoint, or the same one as --metrics-listen when both name the same HOST:PORT)",
        default="",
        metavar="HOST:PORT",
        default_text="off",
        doc=(
            "serve the GPUs' newest readings under dcgm-exporter's metric names on "
            "HOST:PORT/metrics ([GPU metrics for "
            "Prometheus](#gpu-metrics-for-prometheus-dcgm-exporter-names)); a separate "
            "endpoint, or the `--metrics-listen` one when both name the same HOST:PORT"
        ),
    ),
    Option(
        "pod_resources_socket",
        "the kubelet's pod-resources socket (e.g. /var/lib/kubelet/pod-resources/kubelet.sock): pod, namespace"
        " and container of each GPU, as labels on --prometheus-listen and tags of its InfluxDB points (default: off)",
        default="",
        metavar="PATH",
        default_text="off",
        doc=(
            "the kubelet's pod-resources socket "
            "(`/var/lib/kubelet/pod-resources/kubelet.sock`): `pod`, `namespace`, `container` "
            "of each GPU, labels on `--prometheus-listen` and tags of its InfluxDB points "
            "([schema](schema.md))"
        ),
    ),
    Option(
        "pod_resources_interval",
        "ask the kubelet's pod-resources API which pod holds which GPU this often (at least 1 s)",
        parse_duration,
        10.0,
    ),
    Option(
        "trainer_socket",
        "unix socket where the local trainer reports progress (default: off; with --broker SPOOL/trainer.sock)",
        default="",
        metavar="PATH",
        default_text="off; with `--broker` `SPOOL/trainer.sock`",
    ),
    Option(
        "mic_device",
        "microphone: input device name (or part of it) for PortAudio (default: none)",
        default="",
        default_text="none",
    ),
    Option(
        "mic_calibration_db",
        "microphone calibration: dB SPL of a full-scale (mean square 1) signal; 94 - dBFS(rms) of a 94 dB calibrator",
        float,
        123.0,
        metavar="DB",
    ),
    Option("mic_samplerate", "microphone sample rate in Hz", int, 48000, metavar="HZ"),
    Option("proxy_fan_rated_dba", "acoustic proxy: dBA of a GPU's own fans at 100 %% duty", float, 50.0, metavar="DBA"),
    Option(
        "proxy_floor_dba",
        "acoustic proxy: background level summed with every estimate",
        float,
        35.0,
        metavar="DBA",
    ),
    Option(
        "proxy_tdp_fraction",
        "acoustic proxy: tdp_flag when power > this fraction of the TDP",
        float,
        0.8,
        metavar="K",
    ),
    Option(
        "proxy_air_rise_c",
        "acoustic proxy (passive GPUs): allowed air temperature rise in K",
        float,
        15.0,
        metavar="K",
    ),
    Option(
        "proxy_chassis_airflow_m3_per_s",
        "acoustic proxy (passive GPUs): chassis airflow per GPU at full fan speed, m^3/s",
        float,
        0.05,
        metavar="M3S",
    ),
    Option(
        "proxy_chassis_rated_dba",
        "acoustic proxy (passive GPUs): dBA of one GPU's share of the chassis fans at full speed",
        float,
        75.0,
        metavar="DBA",
    ),
    Option("proxy_chassis_min_pct", "acoustic proxy (passive GPUs): chassis fans' minimum speed in %%", float, 30.0),
    Option(
        "grace",
        "on SIGTERM, keep delivering spooled batches for this long; the rest stays spooled",
        parse_duration,
        10.0,
    ),
    Option("flush_interval", "close a batch after this long even if it is not full", parse_duration, 1.0),
    Option("batch_max_samples", "close a batch when it holds this many samples (>= 100)", int, 2000, metavar="N"),
    Option("max_in_flight", "batches sent but not yet acknowledged, at most (and 16 MiB)", int, 64, metavar="N"),
    Option("keepalive", "gRPC keepalive ping interval (10 s timeout)", parse_duration, 30.0),
    Option("reconnect_min", "first reconnect pause (doubles per failed round, with jitter)", parse_duration, 0.5),
    Option("reconnect_max", "longest reconnect pause", parse_duration, 30.0),
    Option(
        "auth_retry", "pause after the collector refused the credentials or the agent's identity", parse_duration, 60.0
    ),
    Option("pcie_interval", "read each GPU's PCIe throughput this often (0: every sample)", parse_duration, 1.0),
    Option(
        "health_interval",
        "read each GPU's health counters (ECC, row remapping, NVLink, GPM, MIG, processes) this often"
        " (at least 1 s; 0: off, and no GPU events)",
        parse_duration,
        1.0,
    ),
    Option(
        "resolution",
        "what GPU samples are shipped: auto = per-interval aggregates (mean, min, max, last), every sample during"
        " a probe and for --hires-after after a trigger (thermal or HW slowdown, power brake, XID, ECC, lost"
        " GPU); full = every sample",
        default="auto",
        choices=["auto", "full"],
        doc=(
            "what GPU samples are shipped: `auto` = per-interval aggregates (mean, min, max, "
            "last), every sample during a probe and for `--hires-after` after a trigger "
            "(thermal or HW slowdown, power brake, XID, ECC, lost GPU); `full` = every sample "
            "([Resolution policy](#resolution-policy))"
        ),
    ),
    Option(
        "aggregate_interval",
        "the interval of one aggregate in resolution auto (whole ms, at least the sampling interval (--interval),"
        " at most 60 s)",
        parse_duration,
        1.0,
    ),
    Option(
        "hires_after",
        "in resolution auto, ship every sample for this long after a trigger (0: triggers open no window)",
        parse_duration,
        300.0,
    ),
    Option(
        "flight_recorder",
        "in resolution auto, keep this long of every sample in the spool, shipped when a trigger or probe"
        " opens a high-resolution window (0: off)",
        parse_duration,
        300.0,
    ),
    Option(
        "nvml_retry",
        "without NVML at start (the driver not loaded yet, at boot), try it again this often; once it answers the"
        " agent stops cleanly and starts again in the same process (the same PID for systemd), with its GPUs;"
        " 0: never, the host and acoustics only",
        parse_duration,
        30.0,
    ),
    Option("hwmon_dir", "where the hwmon sensors are (sysfs)", Path, Path("/sys/class/hwmon"), metavar="DIR"),
    Option("check", "validate the configuration, print the effective settings and exit", is_flag=True, default=False),
    *_fleet_options(),
]

AGENT_OPTION = {option.name: option for option in AGENT_OPTIONS}
