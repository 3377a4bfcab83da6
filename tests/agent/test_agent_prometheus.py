"""A real Prometheus (Debian's) scrapes a real agent on simulated GPUs under dcgm-exporter's names.

NVIDIA's dashboard queries are checked as Grafana sends them: the variables filled from
``label_values`` (as Grafana's "All" does), each query evaluated at one scrape's instant, its value
compared with the points the agent's samples became in InfluxDB, through a real collector (within one
tick of the scrape).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_helpers import AgentFactory, Receiver, machine, unique_batches
from prometheus_client.parser import text_string_to_metric_families
from support import free_port, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))
from collector_helpers import CollectorProcess

from gpuprobe.agent.dcgm_names import GPU_FIELDS, XID_EVENTS, XID_LAST, PromMetric
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.devservices.prometheus import PrometheusServer
from gpuprobe.kubelet.v1 import podresources_pb2, podresources_pb2_grpc
from gpuprobe.sim import state

# The PromQL of NVIDIA's "NVIDIA DCGM Exporter Dashboard" (Grafana id 12239), as its panels send them:
# grafana/dcgm-exporter-dashboard.json in https://github.com/NVIDIA/dcgm-exporter (Apache License 2.0).
# (panel title, expression); its variables are label_values(DCGM_FI_DEV_GPU_TEMP, instance) and
# label_values(DCGM_FI_DEV_GPU_TEMP, gpu).
DASHBOARD = [
    ("GPU Temperature", 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Avg. Temp", 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})'),
    ("GPU Power Usage", 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Power Total", 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})'),
    ("GPU SM Clocks", 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000'),
    ("GPU Utilization", 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}'),
    ("GPU Framebuffer Mem Used", 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}'),
    ("Tensor Core Utilization", 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}'),
]
PANEL_FACTOR = {"GPU SM Clocks": 1e6}  # what the panel's expression multiplies by
METRICS: dict[str, tuple[str, PromMetric]] = {m.name: (f, m) for f, ms in GPU_FIELDS.items() for m in ms}
INTERVAL_S = 0.1


def metric_of(expr: str) -> str:
    return expr.split("(", 1)[-1].split("{", 1)[0]


def matches_within_a_tick(
    value: float, rows: list[dict[str, Any]], field: str, m: PromMetric, t_s: float, factor: float
) -> bool:
    """The value is one the agent stored within one tick of the scrape (its newest point with the field
    at the scrape, or the one before or after: the scrape's clock and the tick's are read a moment apart)."""
    carrying = sorted((r for r in rows if r.get(field) is not None), key=lambda r: r["time"])
    t_ns = int(t_s * 1e9)
    near = [r for r in carrying if r["time"] <= t_ns][-2:] + [r for r in carrying if r["time"] > t_ns][:1]
    return any(math.isclose(value, float(r[field]) * m.scale / m.divisor * factor, rel_tol=1e-12) for r in near)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[list[PrometheusServer]]:
    made: list[PrometheusServer] = []
    try:
        yield made
    finally:
        for p in made:
            p.stop()


def start_prometheus(tmp_path: Path, made: list[PrometheusServer], target: str) -> PrometheusServer:
    server = PrometheusServer(tmp_path / "prometheus", [target], scrape_interval_s=1.0)
    made.append(server)
    return server.start()


def test_nvidias_dashboard_queries_on_a_real_prometheus(
    tmp_path: Path,
    influxdb: InfluxDBDatabase,
    collector: str,
    agent_factory: AgentFactory,
    prometheus: list[PrometheusServer],
) -> None:
    gpus = ["H100-SXM5-80GB", "H100-SXM5-80GB", "RTX-4090"]
    sim = machine(tmp_path / "sim", gpus)
    for i, util in enumerate((90.0, 40.0, 10.0)):
        state.set_load(sim.state_dir, i, util, mem_used_bytes=(i + 1) * 2**30)
    target = f"127.0.0.1:{free_port()}"
    # one endpoint for both: the GPUs' metrics and the agent's own
    agent = agent_factory(sim, [collector], "--prometheus-listen", target, "--metrics-listen", target)
    agent.wait_for_log("GPU metrics under dcgm-exporter's names on http://127.0.0.1")
    prom = start_prometheus(tmp_path, prometheus, target)

    def scraped_thrice() -> list[dict[str, Any]] | None:
        series = prom.query_range_vector("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[1m]")
        return series if len(series) == 2 and all(len(s["values"]) >= 3 for s in series) else None

    series = wait_until(scraped_thrice, 30, "three scrapes of both H100s' GPM", describe=prom.log_tail)
    t_s = float(series[0]["values"][-1][0])  # one scrape's instant (all its series share it)
    fields = sorted({METRICS[metric_of(expr)][0] for _, expr in DASHBOARD})
    select = ", ".join(f'"{f}"' for f in fields)
    window = f"time > {int((t_s - 3) * 1e9)} AND time < {int((t_s + 1) * 1e9)}"

    def stored() -> dict[str, list[dict[str, Any]]] | None:
        series = influxdb.query(f'SELECT {select} FROM "gpu" WHERE {window} GROUP BY "gpu"')
        by_gpu = {s.tags["gpu"]: s.rows() for s in series}
        done = len(by_gpu) == len(gpus) and all(
            max(r["time"] for r in rows) > (t_s + 0.5) * 1e9 for rows in by_gpu.values()
        )
        return by_gpu if done else None

    points = wait_until(stored, 30, "the agent's points past the scrape in InfluxDB", describe=agent.log)

    instances = prom.label_values("instance", "DCGM_FI_DEV_GPU_TEMP")
    gpu_values = prom.label_values("gpu", "DCGM_FI_DEV_GPU_TEMP")
    assert instances == [target]
    assert sorted(gpu_values) == ["0", "1", "2"]
    variables = {"$instance": "(" + "|".join(instances) + ")", "$gpu": "(" + "|".join(gpu_values) + ")"}
    gpm = {str(i) for i, name in enumerate(gpus) if name.startswith("H100")}  # GPM: Hopper and newer
    for title, template in DASHBOARD:
        expr = template
        for var, value in variables.items():
            expr = expr.replace(var, value)
        name = metric_of(template)
        field, m = METRICS[name]
        result = prom.query(expr, t_s)
        if expr.startswith(("avg(", "sum(")):
            per_gpu = [float(r["value"][1]) for r in prom.query(expr.split("(", 1)[1][:-1], t_s)]
            want = sum(per_gpu) / (len(per_gpu) if expr.startswith("avg(") else 1)
            assert len(per_gpu) == len(gpus) and len(result) == 1, title
            assert math.isclose(float(result[0]["value"][1]), want, rel_tol=1e-12), title
            continue
        got = {r["metric"]["gpu"]: float(r["value"][1]) for r in result}
        assert set(got) == (gpm if field == "tensor_active_pct" else {"0", "1", "2"}), f"{title}: {got}"
        for gpu, value in got.items():
            factor = PANEL_FACTOR.get(title, 1.0)
            assert matches_within_a_tick(value, points[gpu], field, m, t_s, factor), f"{title}, GPU {gpu}: {value}"
    # dcgm-exporter's labels, and the agent's own counters on the same page
    labels = prom.query("DCGM_FI_DEV_GPU_UTIL", t_s)[0]["metric"]
    assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"} <= set(labels)
    assert labels["Hostname"] == "node-1" and labels["UUID"].startswith("GPU-")
    assert prom.query("gpuprobe_agent_samples_taken_total", t_s), "the self-metrics share the endpoint"
    # the fields of the slower reads are on every scrape too (PCIe once a second, health once a second)
    for name in (
        "gpuprobe_gpu_pcie_tx_bytes_per_second",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "gpuprobe_gpu_acoustic_proxy_dba",
    ):
        assert {r["metric"]["gpu"] for r in prom.query(name, t_s)} == {"0", "1", "2"}, name
    # absent, never 0: the RTX 4090 has no memory temperature sensor
    assert {r["metric"]["gpu"] for r in prom.query("DCGM_FI_DEV_MEMORY_TEMP", t_s)} == {"0", "1"}
    assert prom.targets_up() == {target: "up"}
    assert agent.terminate() == 0


@pytest.fixture
def collector(tmp_path: Path, influxdb: InfluxDBDatabase) -> Iterator[str]:
    """A real collector writing into the test's InfluxDB database; its address."""
    port = free_port()
    args = ["--insecure", "--listen", f"127.0.0.1:{port}", "--influx-url", influxdb.server.url]
    args += ["--influx-db", influxdb.name, "--wal", str(tmp_path / "wal")]
    process = CollectorProcess(args, tmp_path / "collector.log", port).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()


def xid_counts(prom: PrometheusServer) -> dict[tuple[str, str], float]:
    return {(r["metric"]["gpu"], r["metric"]["xid"]): float(r["value"][1]) for r in prom.query(XID_EVENTS.name)}


def test_an_injected_xid_is_counted_once_and_does_not_repeat_after_recovery(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory, prometheus: list[PrometheusServer]
) -> None:
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB", "H100-SXM5-80GB"])
    target = f"127.0.0.1:{free_port()}"
    agent = agent_factory(sim, [receiver.address], "--prometheus-listen", target)
    agent.wait_for_log("GPU metrics under dcgm-exporter's names")
    prom = start_prometheus(tmp_path, prometheus, target)
    wait_until(lambda: len(prom.query(XID_LAST.name)) == 2, 30, "both GPUs' XID gauges", describe=prom.log_tail)
    assert {float(r["value"][1]) for r in prom.query(XID_LAST.name)} == {0.0}, "0 before any XID"
    assert xid_counts(prom) == {}

    state.inject_xid(sim.state_dir, 1, 79)  # fallen off the bus: the GPU is lost right after it
    agent.wait_for_log(r"GPU 1: XID 79")
    wait_until(lambda: xid_counts(prom) == {("1", "79"): 1.0}, 10, "the XID counted", describe=lambda: xid_counts(prom))
    state.set_failed(sim.state_dir, 1, False)  # a reset: the GPU answers again
    agent.wait_for_log(r"GPU 1 .* answers again")
    # after the recovery, a few scrapes on: the counter stays at 1 (the XID is not repeated), while
    # dcgm-exporter's gauge holds the last code
    scrape_s = time.time()

    def scraped_after_recovery() -> bool:
        values = prom.query_range_vector(f'{XID_LAST.name}{{gpu="1"}}[10s]')
        return bool(values) and sum(float(t) > scrape_s for t, _ in values[0]["values"]) >= 3

    wait_until(scraped_after_recovery, 20, "three scrapes after the recovery", describe=prom.log_tail)
    assert xid_counts(prom) == {("1", "79"): 1.0}
    increase = prom.query(f"increase({XID_EVENTS.name}[1m])")
    assert len(increase) == 1 and float(increase[0]["value"][1]) <= 1.5  # extrapolated, but no second event
    assert {r["metric"]["gpu"]: float(r["value"][1]) for r in prom.query(XID_LAST.name)} == {"0": 0.0, "1": 79.0}
    assert agent.terminate() == 0
    xids = [e for b in unique_batches(receiver.batches()).values() for e in b.gpu_events if e.data == 79]
    assert len(xids) == 1, "the agent sent it once too"


class KubeletStandIn(podresources_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """A stand-in for the kubelet (none runs here): the published v1.PodResourcesLister on a unix socket,
    answering with the assignment the test sets."""

    def __init__(self) -> None:
        self.assignment: dict[str, tuple[str, str, str]] = {}  # GPU UUID -> pod, namespace, container
        self.calls = 0

    def List(self, request: Any, context: Any) -> podresources_pb2.ListPodResourcesResponse:
        self.calls += 1
        response = podresources_pb2.ListPodResourcesResponse()
        for uuid, (pod, namespace, container) in self.assignment.items():
            p = response.pod_resources.add(name=pod, namespace=namespace)
            c = p.containers.add(name=container)
            c.devices.add(resource_name="nvidia.com/gpu", device_ids=[uuid])
            c.devices.add(resource_name="example.com/nic", device_ids=["nic-0"])
        return response


def test_pod_labels_from_the_pod_resources_api_follow_the_assignment(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    import urllib.request

    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB", "H100-SXM5-80GB"])
    socket_path = tmp_path / "kubelet.sock"
    kubelet = KubeletStandIn()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    try:
        target = f"127.0.0.1:{free_port()}"
        agent = agent_factory(
            sim,
            [receiver.address],
            "--prometheus-listen",
            target,
            "--pod-resources-socket",
            str(socket_path),
            "--pod-resources-interval",
            "1",
        )
        agent.wait_for_log("GPU metrics under dcgm-exporter's names")

        def series(name: str) -> list[dict[str, str]]:
            page = urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()
            return [s.labels for f in text_string_to_metric_families(page) if f.name == name for s in f.samples]

        # the page serves a GPU from its first sample on, which may come after the log line
        def gpu_uuids() -> dict[str, str] | None:
            found = {labels["gpu"]: labels["UUID"] for labels in series("DCGM_FI_DEV_GPU_TEMP")}
            return found if sorted(found) == ["0", "1"] else None

        uuids = wait_until(gpu_uuids, 20, "both GPUs on the page")

        def pods() -> dict[str, tuple[str | None, str | None, str | None]]:
            return {
                k["gpu"]: (k.get("pod"), k.get("namespace"), k.get("container"))
                for k in series("DCGM_FI_DEV_POWER_USAGE")
            }

        kubelet.assignment = {uuids["1"]: ("train-0", "ml", "trainer")}
        want = {"0": (None, None, None), "1": ("train-0", "ml", "trainer")}
        wait_until(lambda: pods() == want, 20, "GPU 1 labelled with its pod", describe=pods)

        # the batches name the pod too (the collector makes them tags of the GPU's points)
        def refs() -> dict[str, tuple[str | None, str | None, str | None]]:
            latest = receiver.batches()[-1].gpus if receiver.batches() else []
            return {str(r.index): (r.pod or None, r.namespace or None, r.container or None) for r in latest}

        wait_until(lambda: refs() == want, 20, "GPU 1's pod in the batches", describe=refs)
        calls = kubelet.calls
        kubelet.assignment = {uuids["0"]: ("train-0", "ml", "trainer"), uuids["1"]: ("eval-1", "ml", "eval")}
        want = {"0": ("train-0", "ml", "trainer"), "1": ("eval-1", "ml", "eval")}
        # within one refresh: one call may have been answered just before the change, the next one
        # sees it (the third is there for the moment between its answer and the page reading it)
        wait_until(lambda: pods() == want or kubelet.calls > calls + 2, 20, "the new assignment", describe=pods)
        assert pods() == want, f"the labels changed within one refresh ({kubelet.calls - calls} calls)"
        wait_until(lambda: refs() == want, 20, "the new assignment in the batches", describe=refs)
        # the kubelet goes away (a restart): the pods last known stay, the failure is logged once
        server.stop(None)
        agent.wait_for_log("the kubelet's pod-resources API at .* does not answer")
        agent.runs_for(2.5, "two refreshes without a kubelet")
        assert pods() == want
        assert agent.log().count("does not answer") == 1
        assert agent.terminate() == 0
    finally:
        server.stop(None)
