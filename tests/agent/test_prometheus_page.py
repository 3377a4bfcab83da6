"""The Prometheus page under dcgm-exporter's names, rendered in-process from plain samples.

The page is parsed with prometheus_client's own text parser, as a scraper reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuprobe.agent.dcgm_names import DCGM_DEFAULT_COUNTERS, GPU_FIELDS, NOT_SERVED, XID_LAST
from gpuprobe.agent.podresources import PodRef, assignments_of
from gpuprobe.agent.prometheus import GpuExporter
from gpuprobe.agent.sensors.events import xid_text
from gpuprobe.kubelet.v1 import podresources_pb2
from gpuprobe.v1 import common_pb2, telemetry_pb2

DOCS = Path(__file__).resolve().parents[2] / "docs" / "dcgm-exporter.md"


@dataclass
class Readings:
    latest: list[dict[str, Any]] = field(default_factory=list)
    latest_slow: dict[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    latest_acoustic: list[telemetry_pb2.AcousticSample] = field(default_factory=list)


INFOS = [
    common_pb2.GpuInfo(
        index=i,
        uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
        name=name,
        pci_bus_id=f"00000000:1{i}:00.0",
        driver_version="570.124.06",
    )
    for i, name in enumerate(["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"])
]


def page(exporter: GpuExporter) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """metric family -> (type, {sorted labels: value}) of one scrape (the parser names a counter's family
    without ``_total``; Prometheus itself keeps the names as served, tests/e2e/test_prometheus.py)."""
    out: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]] = {}
    for family in text_string_to_metric_families(exporter.render().decode()):
        for sample in family.samples:
            _, series = out.setdefault(family.name, (family.type, {}))
            series[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by_gpu(series: dict[tuple[tuple[str, str], ...], float]) -> dict[str, float]:
    return {dict(labels)["gpu"]: value for labels, value in series.items()}


def xid(gpu: int, code: int) -> telemetry_pb2.GpuEvent:
    return telemetry_pb2.GpuEvent(
        time_unix_ns=1, gpu_index=gpu, kind=telemetry_pb2.GPU_EVENT_KIND_XID, data=code, text=xid_text(code)
    )


def test_values_units_types_and_labels_and_absent_fields() -> None:
    h100 = {
        "time_unix_ns": 2_000,
        "gpu_index": 0,
        "util_pct": 87.0,
        "power_w": 612.25,
        "temp_c": 71.0,
        "mem_temp_c": 80.0,
        "sm_clock_mhz": 1980,
        "mem_used_bytes": 40 * 2**30,
        "mem_total_bytes": 80 * 2**30,
        "energy_j": 1234.5,
        "clock_event_reasons": 0,  # a real 0: no reason active
    }
    rtx = {"time_unix_ns": 2_000, "gpu_index": 1, "util_pct": 3.0, "power_w": 30.5, "temp_c": 40.0, "fan_pct": 31.0}
    # the last health read of GPU 0 (a second ago) and its last PCIe read: older, fewer fields
    health = {"time_unix_ns": 1_000, "gpu_index": 0, "power_w": 1.0, "tensor_active_pct": 42.0, "remap_failure": False}
    pcie = {"time_unix_ns": 1_500, "gpu_index": 0, "power_w": 2.0, "pcie_tx_bytes_per_s": 1e9}
    proxy = telemetry_pb2.ACOUSTIC_SOURCE_PROXY
    acoustic = [
        telemetry_pb2.AcousticSample(time_unix_ns=1, source=proxy, gpu_index=1, est_dba=41.5, tdp_flag=False),
        telemetry_pb2.AcousticSample(time_unix_ns=1, source=telemetry_pb2.ACOUSTIC_SOURCE_MIC, laeq_db=60.0),
    ]
    readings = Readings([h100, rtx], {0: (pcie, health)}, acoustic)
    got = page(GpuExporter(readings, lambda: INFOS, "node-1"))

    assert by_gpu(got["DCGM_FI_DEV_GPU_UTIL"][1]) == {"0": 87.0, "1": 3.0}
    assert by_gpu(got["DCGM_FI_DEV_POWER_USAGE"][1]) == {"0": 612.25, "1": 30.5}, "the newest sample wins"
    assert by_gpu(got["DCGM_FI_DEV_FB_USED"][1]) == {"0": 40 * 1024}, "MiB, as dcgm-exporter"
    assert by_gpu(got["DCGM_FI_DEV_FB_FREE"][1]) == {"0": 40 * 1024}
    assert by_gpu(got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][1]) == {"0": 1234500.0}, "mJ"
    assert by_gpu(got["gpuprobe_gpu_energy_joules"][1]) == {"0": 1234.5}
    assert by_gpu(got["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][1]) == {"0": 0.42}, "a ratio, from the health read"
    assert by_gpu(got["gpuprobe_gpu_pcie_tx_bytes_per_second"][1]) == {"0": 1e9}, "from the PCIe read"
    assert by_gpu(got["DCGM_FI_DEV_ROW_REMAP_FAILURE"][1]) == {"0": 0.0}
    assert by_gpu(got["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"][1]) == {"0": 0.0}
    assert by_gpu(got["gpuprobe_gpu_acoustic_proxy_dba"][1]) == {"1": 41.5}, "the proxy's estimate, per GPU"
    assert by_gpu(got["gpuprobe_gpu_acoustic_tdp_flag"][1]) == {"1": 0.0}
    # unsupported: absent for that GPU, never 0
    assert by_gpu(got["DCGM_FI_DEV_MEMORY_TEMP"][1]) == {"0": 80.0}
    assert by_gpu(got["DCGM_FI_DEV_FAN_SPEED"][1]) == {"1": 31.0}
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in got, "no GPU reported it"
    # types as dcgm-exporter declares them
    assert got["DCGM_FI_DEV_GPU_TEMP"][0] == "gauge"
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0] == "counter"
    labels = dict(next(iter(k for k in got["DCGM_FI_DEV_GPU_TEMP"][1] if dict(k)["gpu"] == "1")))
    assert labels == {
        "gpu": "1",
        "UUID": INFOS[1].uuid,
        "pci_bus_id": "00000000:11:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA GeForce RTX 4090",
        "Hostname": "node-1",
        "DCGM_FI_DRIVER_VERSION": "570.124.06",
    }
    # a lost GPU (not in the last tick) has no series at all
    readings.latest = [rtx]
    got = page(GpuExporter(readings, lambda: INFOS, "node-1"))
    assert by_gpu(got["DCGM_FI_DEV_GPU_UTIL"][1]) == {"1": 3.0}
    assert by_gpu(got[XID_LAST.name][1]) == {"1": 0.0}


def test_xid_gauge_keeps_the_last_code_and_the_counter_counts_each_event_once() -> None:
    samples = [{"time_unix_ns": 1, "gpu_index": i, "temp_c": 50.0} for i in (0, 1)]
    exporter = GpuExporter(Readings(samples), lambda: INFOS, "node-1")
    assert "gpuprobe_gpu_xid_events" not in page(exporter)
    assert by_gpu(page(exporter)[XID_LAST.name][1]) == {"0": 0.0, "1": 0.0}
    exporter.event(xid(1, 13))
    exporter.event(telemetry_pb2.GpuEvent(gpu_index=1, kind=telemetry_pb2.GPU_EVENT_KIND_RECOVERED))
    for _ in range(3):  # scrapes do not count again
        got = page(exporter)
        counts = {(dict(k)["gpu"], dict(k)["xid"]): v for k, v in got["gpuprobe_gpu_xid_events"][1].items()}
        assert counts == {("1", "13"): 1.0}
        assert got["gpuprobe_gpu_xid_events"][0] == "counter"
        assert by_gpu(got[XID_LAST.name][1]) == {"0": 0.0, "1": 13.0}
    exporter.event(xid(1, 79))
    exporter.event(xid(1, 13))
    got = page(exporter)
    counts = {(dict(k)["gpu"], dict(k)["xid"]): v for k, v in got["gpuprobe_gpu_xid_events"][1].items()}
    assert counts == {("1", "13"): 2.0, ("1", "79"): 1.0}
    assert by_gpu(got[XID_LAST.name][1])["1"] == 13.0, "dcgm-exporter's gauge: the last code"


def test_pod_labels_follow_the_assignment() -> None:
    samples = [{"time_unix_ns": 1, "gpu_index": i, "temp_c": 50.0 + i} for i in (0, 1)]
    assignment: dict[str, PodRef] = {INFOS[1].uuid: ("train-0", "ml", "trainer")}
    current = [assignment]
    exporter = GpuExporter(Readings(samples), lambda: INFOS, "node-1", lambda: current[0])

    def pods() -> dict[str, tuple[str | None, str | None, str | None]]:
        series = page(exporter)["DCGM_FI_DEV_GPU_TEMP"][1]
        return {
            dict(k)["gpu"]: (dict(k).get("pod"), dict(k).get("namespace"), dict(k).get("container")) for k in series
        }

    assert pods() == {"0": (None, None, None), "1": ("train-0", "ml", "trainer")}
    current[0] = {INFOS[0].uuid: ("eval-3", "research", "main")}
    assert pods() == {"0": ("eval-3", "research", "main"), "1": (None, None, None)}


def test_every_default_counter_is_served_or_documented_as_missing() -> None:
    served = {m.name for metrics in GPU_FIELDS.values() for m in metrics} | {XID_LAST.name}
    docs = DOCS.read_text()
    for name in DCGM_DEFAULT_COUNTERS:
        assert (name in served) != (name in NOT_SERVED), name
        assert re.search(rf"`{name}`", docs), f"docs/dcgm-exporter.md names {name}"
    for name in NOT_SERVED:
        assert name in DCGM_DEFAULT_COUNTERS


def test_the_pod_resources_answer_maps_gpu_uuids_to_their_container() -> None:
    response = podresources_pb2.ListPodResourcesResponse()
    pod = response.pod_resources.add(name="train-0", namespace="ml")
    trainer = pod.containers.add(name="trainer")
    trainer.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-a", "GPU-b::1"])  # ::1: a shared replica
    trainer.devices.add(resource_name="example.com/nic", device_ids=["GPU-not-a-gpu"])
    pod.containers.add(name="sidecar")
    other = response.pod_resources.add(name="infer-2", namespace="serving").containers.add(name="server")
    other.devices.add(resource_name="nvidia.com/mig-1g.10gb", device_ids=["MIG-c"])
    assert assignments_of(response) == {
        "GPU-a": ("train-0", "ml", "trainer"),
        "GPU-b": ("train-0", "ml", "trainer"),
        "MIG-c": ("infer-2", "serving", "server"),
    }
