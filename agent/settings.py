"""Part: agent. The agent's configuration, validated once at start (bad values fail fast with a message naming the
option)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprobe.agent import identity
from gpuprobe.agent.options import AGENT_OPTION
from gpuprobe.agent.sensors.proxy import ProxyParams
from gpuprobe.config import ConfigError
from gpuprobe.v1 import common_pb2

if TYPE_CHECKING:
    from gpuprobe.control.settings import ControlSettings

MIN_INTERVAL_S = 0.02  # 50 Hz
MAX_INTERVAL_S = 60.0
MiB = 2**20
DEFAULT_COLLECTOR_PORT = 7447  # the collector's default --listen port
MAX_SOCKET_PATH_BYTES = 107  # sun_path holds 108 bytes with the terminating NUL


@dataclass(frozen=True)
class TlsSettings:
    ca_path: Path | None = None  # None: the system's roots
    cert_path: Path | None = None  # client certificate, for mutual TLS
    key_path: Path | None = None
    server_name: str | None = None  # expected name in the collector's certificate, when not the host


# The defaults that are options' are the options' own (agent/options.py): written once.
@dataclass(frozen=True)
class UplinkSettings:
    targets: list[str]
    agent_id: str = ""  # picks the first of several targets (uplink.first_choice); "" : the first
    tls: TlsSettings | None = None
    token: str | None = None
    keepalive_s: float = AGENT_OPTION["keepalive"].default
    max_in_flight_batches: int = AGENT_OPTION["max_in_flight"].default
    max_in_flight_bytes: int = 16 * MiB
    reconnect_min_s: float = AGENT_OPTION["reconnect_min"].default
    reconnect_max_s: float = AGENT_OPTION["reconnect_max"].default
    auth_retry_s: float = AGENT_OPTION["auth_retry"].default
    welcome_timeout_s: float = 10.0


def parse_address(text: str, allow_port_zero: bool = False) -> str:
    """``HOST:PORT`` or ``[IPv6]:PORT``, checked; returned as given."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if allow_port_zero else 1) <= int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {text!r}")
    return text.strip()


def parse_collector(text: str) -> str:
    """``HOST[:PORT]`` or ``[IPv6][:PORT]``; without a port, the collector's default (7447)."""
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    if sep and scheme and scheme.replace("+", "").isalpha():
        # checked first: a URL has colons too, and the IPv6 hint below would name the wrong cause
        host = rest.split("/", 1)[0]
        tls = " (TLS is --tls or --tls-ca, not a scheme)" if scheme.lower() in ("https", "grpcs") else ""
        raise ValueError(f"{text!r} is a URL: give HOST[:PORT] without the {scheme}:// scheme, e.g. {host!r}{tls}")
    if (text.startswith("[") and text.endswith("]")) or (text and ":" not in text):
        return f"{text}:{DEFAULT_COLLECTOR_PORT}"
    if not text.startswith("[") and text.count(":") > 1:
        raise ValueError(f"write an IPv6 address in brackets, [ADDRESS] or [ADDRESS]:PORT, not {text!r}")
    return parse_address(text)


def split_addresses(values: list[str]) -> list[str]:
    out: list[str] = []
    for value in values:
        out.extend(parse_collector(part) for part in value.split(",") if part.strip())
    return out


@dataclass(frozen=True)
class AgentSettings:
    identity: common_pb2.AgentIdentity
    virt_override: common_pb2.Virtualization | None
    interval_s: float
    flush_interval_s: float
    batch_max_samples: int
    spool_dir: Path
    spool_max_bytes: int
    spool_max_age_s: float
    spool_memory_max_bytes: int
    uplink: UplinkSettings
    grace_s: float
    metrics_listen: tuple[str, int] | None
    trainer_socket: Path | None
    mic_device: str
    mic_calibration_db: float
    mic_samplerate_hz: int
    proxy: ProxyParams
    pcie_interval_s: float
    hwmon_dir: Path
    # 0: no health reads (ECC, NVLink, GPM, MIG, processes)
    health_interval_s: float = AGENT_OPTION["health_interval"].default
    # without NVML at start: how often to try again (0: never)
    nvml_retry_s: float = AGENT_OPTION["nvml_retry"].default
    # auto: aggregates outside high-resolution windows; full: every sample
    resolution: str = AGENT_OPTION["resolution"].default
    aggregate_interval_s: float = AGENT_OPTION["aggregate_interval"].default
    hires_after_s: float = AGENT_OPTION["hires_after"].default  # a window's length after its last trigger
    # raw samples kept in the spool outside windows (0: off)
    flight_recorder_s: float = AGENT_OPTION["flight_recorder"].default
    prometheus_listen: tuple[str, int] | None = None  # the GPU readings under dcgm-exporter's names
    pod_resources_socket: Path | None = None
    pod_resources_interval_s: float = AGENT_OPTION["pod_resources_interval"].default
    control: ControlSettings | None = None  # --broker: the embedded control plane (gpuprobe.agent.embedded_control)

    @classmethod
    def from_values(cls, v: dict[str, Any], *, missing_files_ok: bool = False) -> AgentSettings:
        """The checked settings; ``missing_files_ok`` (``gpuprobe install agent``, before the operator has put
        the certificates and secrets in place) accepts file options that name no file yet, while files that
        exist are read and checked as at start."""
        _check_ranges(v)
        ident = _identity(v)
        spool_dir = Path(v["spool"])
        trainer_socket = Path(v["trainer_socket"]) if v["trainer_socket"] else None
        control: ControlSettings | None = None
        if v["broker"]:
            control, trainer_socket = _control_settings(
                v, ident, spool_dir, trainer_socket, float(v["interval"]), missing_files_ok
            )
        return cls(
            identity=ident,
            virt_override=None if v["virt"] == "auto" else identity.VIRT_NAMES[v["virt"]],
            interval_s=float(v["interval"]),
            flush_interval_s=float(v["flush_interval"]),
            batch_max_samples=int(v["batch_max_samples"]),
            spool_dir=spool_dir,
            spool_max_bytes=int(v["spool_max_bytes"]),
            spool_max_age_s=float(v["spool_max_age"]),
            spool_memory_max_bytes=int(v["spool_memory_max_bytes"]),
            uplink=_uplink_settings(v, ident.agent_id, missing_files_ok),
            grace_s=float(v["grace"]),
            metrics_listen=_listen(v, "metrics_listen"),
            prometheus_listen=_listen(v, "prometheus_listen"),
            pod_resources_socket=Path(v["pod_resources_socket"]) if v["pod_resources_socket"] else None,
            pod_resources_interval_s=float(v["pod_resources_interval"]),
            trainer_socket=trainer_socket,
            mic_device=v["mic_device"] or "",
            mic_calibration_db=float(v["mic_calibration_db"]),
            mic_samplerate_hz=int(v["mic_samplerate"]),
            proxy=ProxyParams(
                fan_rated_dba=float(v["proxy_fan_rated_dba"]),
                floor_dba=float(v["proxy_floor_dba"]),
                tdp_fraction=float(v["proxy_tdp_fraction"]),
                air_rise_c=float(v["proxy_air_rise_c"]),
                chassis_airflow_m3_per_s=float(v["proxy_chassis_airflow_m3_per_s"]),
                chassis_rated_dba=float(v["proxy_chassis_rated_dba"]),
                chassis_min_pct=float(v["proxy_chassis_min_pct"]),
            ),
            pcie_interval_s=float(v["pcie_interval"]),
            hwmon_dir=Path(v["hwmon_dir"]),
            health_interval_s=float(v["health_interval"]),
            nvml_retry_s=float(v["nvml_retry"]),
            resolution=str(v["resolution"]),
            aggregate_interval_s=float(v["aggregate_interval"]),
            hires_after_s=float(v["hires_after"]),
            flight_recorder_s=float(v["flight_recorder"]),
            control=control,
        )

    def describe(self) -> str:
        """The effective settings, one per line (``gpuprobe agent --check``)."""
        i = self.identity
        u = self.uplink
        metrics = f"{self.metrics_listen[0]}:{self.metrics_listen[1]}" if self.metrics_listen else "off"
        lines = [
            f"collector        {', '.join(u.targets)}",
            f"identity         agent_id={i.agent_id} host={i.host} cluster={i.cluster or '-'} cloud={i.cloud or '-'}"
            f" instance_type={i.instance_type or '-'} region={i.region or '-'}",
            f"sampling         every {self.interval_s:g} s ({1 / self.interval_s:g} Hz); host and acoustics every 1 s;"
            f" PCIe every {self.pcie_interval_s:g} s;"
            f" health {f'every {self.health_interval_s:g} s' if self.health_interval_s else 'off'}",
            f"resolution       {self._describe_resolution()}",
            f"batches          <= {self.batch_max_samples} samples or {self.flush_interval_s:g} s",
            f"spool            {self.spool_dir} (cap {self.spool_max_bytes} bytes"
            f"{f', {self.spool_max_age_s:g} s' if self.spool_max_age_s else ''};"
            f" {self.spool_memory_max_bytes} bytes in memory while its disk is full)",
            f"transport        {'TLS' if u.tls else 'plaintext'}"
            f"{' + client certificate' if u.tls and u.tls.cert_path else ''}"
            f"{' + bearer token' if u.token else ''}",
            f"grace on stop    {self.grace_s:g} s",
            f"metrics          {metrics}",
            f"GPU metrics      {self._describe_prometheus()}",
            f"trainer socket   {self.trainer_socket or 'off'}",
            f"microphone       {self.mic_device or 'none (proxy only)'}",
        ]
        c = self.control
        if c is None:
            lines.append("control plane    off (no --broker)")
        else:
            lines.append(
                f"control plane    broker {c.broker.url}"
                f"{f' as {c.broker.username!r}' if c.broker.username else ''}; trusted keys"
                f" {', '.join(sorted(c.trusted_keys))}; control dir {c.state_dir}"
            )
        return "\n".join(lines)

    def _describe_prometheus(self) -> str:
        listen = self.prometheus_listen
        if listen is None:
            return "off"
        where = f"{listen[0]}:{listen[1]} (dcgm-exporter names)"
        if listen == self.metrics_listen:
            where += ", the --metrics-listen endpoint"
        if self.pod_resources_socket is not None:
            where += f"; pods from {self.pod_resources_socket} every {self.pod_resources_interval_s:g} s"
        return where

    def _describe_resolution(self) -> str:
        if self.resolution == "full":
            return "full (every sample is shipped)"
        recorder = f"flight recorder {self.flight_recorder_s:g} s" if self.flight_recorder_s else "no flight recorder"
        return (
            f"auto: {self.aggregate_interval_s:g} s aggregates; every sample during a probe and for"
            f" {self.hires_after_s:g} s after a trigger; {recorder}"
        )


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_ranges(v: dict[str, Any]) -> None:
    """Every numeric option in its range, each message naming the option."""
    interval = float(v["interval"])
    _need(
        MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S,
        f"--interval must be between {MIN_INTERVAL_S} s (50 Hz) and {MAX_INTERVAL_S:g} s, not {interval:g}",
    )
    _need(
        0.05 <= v["flush_interval"] <= 10,
        f"--flush-interval must be between 0.05 and 10 s, not {v['flush_interval']}",
    )
    _need(
        v["pod_resources_interval"] >= 1,
        f"--pod-resources-interval must be at least 1 s, not {v['pod_resources_interval']}",
    )
    _need(v["batch_max_samples"] >= 100, "--batch-max-samples must be at least 100 (wire contract)")
    _need(v["spool_max_bytes"] >= 64 * 1024, "--spool-max-bytes must be at least 64KiB")
    _need(v["spool_max_age"] >= 0, "--spool-max-age must not be negative (0: no age cap)")
    _need(v["spool_memory_max_bytes"] >= 0, "--spool-memory-max-bytes must not be negative")
    _need(v["grace"] >= 0, "--grace must not be negative")
    _need(v["max_in_flight"] >= 1, "--max-in-flight must be at least 1")
    _need(0 < v["reconnect_min"] <= v["reconnect_max"], "--reconnect-min must be positive and <= --reconnect-max")
    _need(v["keepalive"] >= 1, "--keepalive must be at least 1 s")
    _need(v["proxy_tdp_fraction"] > 0, "--proxy-tdp-fraction must be positive")
    _need(v["proxy_air_rise_c"] > 0, "--proxy-air-rise-c must be positive")
    _need(v["proxy_chassis_airflow_m3_per_s"] > 0, "--proxy-chassis-airflow-m3-per-s must be positive")
    _need(0 < v["proxy_chassis_min_pct"] <= 100, "--proxy-chassis-min-pct must be in (0, 100]")
    aggregate = float(v["aggregate_interval"])
    _need(
        v["resolution"] == "full" or interval <= aggregate <= MAX_INTERVAL_S,
        f"--aggregate-interval must be at least --interval ({interval:g} s) and at most {MAX_INTERVAL_S:g} s,"
        f" not {aggregate:g} (or ship every sample: --resolution full)",
    )
    _need(
        abs(aggregate * 1000 - round(aggregate * 1000)) < 1e-6,
        f"--aggregate-interval must be a whole number of milliseconds, not {aggregate:g} s",
    )
    _need(v["hires_after"] >= 0, "--hires-after must not be negative (0: triggers open no window, only probes do)")
    _need(v["flight_recorder"] >= 0, "--flight-recorder must not be negative (0: off)")
    _need(
        v["health_interval"] == 0 or v["health_interval"] >= 1,
        f"--health-interval must be at least 1 s (0: off), not {v['health_interval']:g}",
    )


def _identity(v: dict[str, Any]) -> common_pb2.AgentIdentity:
    """The node's labels: configured, else detected; refused here when a collector would refuse them."""
    host = v["host"] or identity.default_host()
    cloud, instance_type = v["cloud"], v["instance_type"]
    if not cloud or not instance_type:
        detected_cloud, detected_type = identity.detect_cloud()
        cloud = cloud or detected_cloud
        instance_type = instance_type or detected_type
    try:
        identity.check_label("--host", host, topic_safe=True)
        ident = common_pb2.AgentIdentity(
            agent_id=identity.check_label("--agent-id", v["agent_id"] or host, topic_safe=True),
            host=host,
            cluster=identity.check_label("--cluster", v["cluster"]),
            cloud=identity.check_label("--cloud", cloud),
            instance_type=identity.check_label("--instance-type", instance_type),
            region=identity.check_label("--region", v["region"]),
        )
        identity.check_storable(ident)
    except identity.IdentityError as e:
        raise ConfigError(str(e)) from None
    return ident


def _uplink_settings(v: dict[str, Any], agent_id: str = "", missing_files_ok: bool = False) -> UplinkSettings:
    """The collectors, the credentials (token, TLS) and the stream's pacing."""
    try:
        targets = split_addresses(v["collector"])
    except ValueError as e:
        raise ConfigError(f"--collector: {e}") from None
    _need(bool(targets), "no collector: pass --collector HOST[:PORT][,HOST[:PORT]...] (or GPUPROBE_COLLECTOR)")
    return UplinkSettings(
        targets=targets,
        agent_id=agent_id,
        tls=_tls_settings(v, missing_files_ok),
        token=_token(v, missing_files_ok),
        keepalive_s=float(v["keepalive"]),
        max_in_flight_batches=int(v["max_in_flight"]),
        reconnect_min_s=float(v["reconnect_min"]),
        reconnect_max_s=float(v["reconnect_max"]),
        auth_retry_s=float(v["auth_retry"]),
    )


def _token(v: dict[str, Any], missing_files_ok: bool = False) -> str | None:
    token: str | None = v["token"] or None
    if v["token_file"] is not None:
        _need(token is None, "give either --token or --token-file, not both")
        if missing_files_ok and not Path(v["token_file"]).exists():
            return token
        try:
            token = Path(v["token_file"]).read_text().strip()
        except OSError as e:
            raise ConfigError(f"--token-file: {e}") from None
        _need(bool(token), f"--token-file {v['token_file']} is empty")
    if token is not None:
        _need(
            not any(ord(c) < 0x21 or ord(c) == 0x7F for c in token),
            "the token must not contain spaces or control characters",
        )
    return token


def _tls_settings(v: dict[str, Any], missing_files_ok: bool = False) -> TlsSettings | None:
    if not (v["tls"] or v["tls_ca"] or v["tls_cert"] or v["tls_key"]):
        return None
    _need((v["tls_cert"] is None) == (v["tls_key"] is None), "mutual TLS needs both --tls-cert and --tls-key")
    for option in ("tls_ca", "tls_cert", "tls_key"):
        path = v[option]
        exists = path is None or Path(path).is_file() or (missing_files_ok and not Path(path).exists())
        _need(exists, f"--{option.replace('_', '-')} {path}: no such file")
    return TlsSettings(
        ca_path=v["tls_ca"],
        cert_path=v["tls_cert"],
        key_path=v["tls_key"],
        server_name=v["tls_server_name"] or None,
    )


def _listen(v: dict[str, Any], key: str) -> tuple[str, int] | None:
    if not v[key]:
        return None
    try:
        address = parse_address(v[key], allow_port_zero=True)
    except ValueError as e:
        raise ConfigError(f"--{key.replace('_', '-')}: {e}") from None
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _control_settings(
    v: dict[str, Any],
    ident: common_pb2.AgentIdentity,
    spool_dir: Path,
    trainer_socket: Path | None,
    interval_s: float,
    missing_files_ok: bool = False,
) -> tuple[ControlSettings, Path]:
    """``--broker``: the control plane's settings, and the trainer socket its trainers report to (made
    under the spool directory when ``--trainer-socket`` is not given, so probe progress is collected)."""
    from gpuprobe.control.settings import RETRY_PREFIX, control_settings

    if trainer_socket is None:
        trainer_socket = spool_dir / "trainer.sock"
        if len(os.fsencode(trainer_socket.absolute())) > MAX_SOCKET_PATH_BYTES:
            raise ConfigError(
                f"the trainer socket {trainer_socket.absolute()} (under --spool) is longer than a unix socket"
                f" path may be ({MAX_SOCKET_PATH_BYTES} bytes): pass a shorter --trainer-socket"
            )
    for name in ("mqtt_reconnect_max", "mqtt_auth_retry"):
        if v[name] <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    control_dir = Path(v["control_dir"]) if v["control_dir"] else spool_dir / "control"
    control = control_settings(
        v,
        ident,
        control_dir=control_dir.absolute(),
        agent_socket=trainer_socket.absolute(),
        retry_prefix=RETRY_PREFIX,
        telemetry_interval_s=interval_s,
        sample_interval_s=interval_s,  # the probe reads the agent's own samples (gpuprobe.agent.embedded_control)
        missing_files_ok=missing_files_ok,
    )
    return control, trainer_socket
