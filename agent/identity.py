"""Part: agent. The node's identity labels (the tags of every point it sends): host, cluster, cloud, instance type,
region, virt.

Configured values win. Where ``cloud`` / ``instance_type`` are not configured they are read from
DMI (``/sys/class/dmi/id``), which identifies the big providers without any network call; ``virt``
comes from NVML's virtualization mode and the CPU's hypervisor flag.
"""

from __future__ import annotations

import socket
from pathlib import Path

from gpuprobe.errors import ConfigError
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import Limits, StreamError, check_hello

DMI_DIR = Path("/sys/class/dmi/id")
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"

VIRT_NAMES: dict[str, common_pb2.Virtualization] = {
    "bare_metal": common_pb2.VIRTUALIZATION_BARE_METAL,
    "passthrough": common_pb2.VIRTUALIZATION_PASSTHROUGH,
    "vgpu": common_pb2.VIRTUALIZATION_VGPU,
    "host_vgpu": common_pb2.VIRTUALIZATION_HOST_VGPU,
    "unknown": common_pb2.VIRTUALIZATION_UNSPECIFIED,
}


class IdentityError(ConfigError):
    pass


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def detect_cloud(dmi_dir: Path = DMI_DIR) -> tuple[str, str]:
    """(cloud, instance_type) from DMI; empty strings where it does not tell."""
    vendor = _read(dmi_dir / "sys_vendor")
    product = _read(dmi_dir / "product_name")
    asset = _read(dmi_dir / "chassis_asset_tag")
    if vendor == "Amazon EC2":
        return "aws", product  # Nitro instances name their type here, e.g. p5.48xlarge
    if vendor == "Google" or product == "Google Compute Engine":
        return "gcp", ""
    if asset == AZURE_ASSET_TAG:
        return "azure", ""
    if asset.startswith("OracleCloud.com") or vendor.startswith("OracleCloud"):
        return "oci", ""
    return "", ""


def hypervisor_present(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    for line in _read(cpuinfo).splitlines():
        if line.startswith("flags"):
            return "hypervisor" in line.split()
    return False


def virtualization(nvml_mode: common_pb2.Virtualization | None, hypervisor: bool) -> common_pb2.Virtualization:
    """NVML's mode, where it says more than NONE; NONE without a hypervisor is bare metal."""
    if nvml_mode is not None and nvml_mode not in (
        common_pb2.VIRTUALIZATION_UNSPECIFIED,
        common_pb2.VIRTUALIZATION_BARE_METAL,
    ):
        return nvml_mode
    if nvml_mode == common_pb2.VIRTUALIZATION_BARE_METAL and not hypervisor:
        return common_pb2.VIRTUALIZATION_BARE_METAL
    return common_pb2.VIRTUALIZATION_UNSPECIFIED  # inconclusive: NONE inside a VM, or no NVML answer


def check_label(name: str, value: str, topic_safe: bool = False) -> str:
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise IdentityError(f"{name} {value!r} contains control characters")
    if len(value) > 256:
        raise IdentityError(f"{name} is longer than 256 characters")
    if topic_safe and (not value or any(c in value for c in "/+#")):
        raise IdentityError(f"{name} {value!r} must be non-empty and contain none of / + # (it names MQTT topics)")
    return value


def check_storable(ident: common_pb2.AgentIdentity) -> None:
    """Refuses an identity that the collector would refuse, with the collector's own message.

    Every point the agent sends carries these labels as tags, so a collector refuses the stream of
    an identity it cannot store (a host name ending in a backslash, for example, which InfluxDB
    cannot write): checked at start, it is a configuration error instead of a retry loop.
    """
    try:
        check_hello(telemetry_pb2.Hello(identity=ident), Limits())
    except StreamError as e:
        raise IdentityError(f"{e.message}; the collector would refuse this agent's stream") from None


def default_host() -> str:
    return socket.gethostname()
