"""CPU of one Prometheus scrape of the agent's GPU page (``--prometheus-listen``), 8 simulated GPUs.

    python bench/prometheus_scrape.py [--gpus 8] [--renders 2000] [--scrapes 300] [--json out.json]

1. A simulated machine of ``--gpus`` H100s (the NVML simulator library, ``sim/``) is opened, and this
   script runs itself again in its environment (pynvml loads the simulated ``libnvidia-ml.so.1``).
2. There the agent's own GPU sensor reads every GPU once as a tick does (PCIe included) and twice as
   the health interval does (so that GPM, ECC, NVLink and remapping fields are there), which makes
   the samples a real agent's page is rendered from: every field an H100 reports, and the acoustic
   proxy's estimates.
3. :class:`gpuprobe.agent.prometheus.GpuExporter` renders the page ``--renders`` times: CPU per
   render (``time.process_time``, the thread is alone). Then the page is served by the agent's own
   HTTP server and fetched ``--scrapes`` times over loopback with ``urllib``: the process's CPU per
   scrape, client included (an upper bound of the agent's share).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER_ENV = "GPUPROBE_BENCH_PROMETHEUS_WORKER"


@dataclass
class Readings:
    latest: list[dict[str, Any]] = field(default_factory=list)
    latest_slow: dict[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    latest_acoustic: list[Any] = field(default_factory=list)


def worker(renders: int, scrapes: int) -> dict[str, Any]:
    from gpuprobe.agent.prometheus import GpuExporter, serve
    from gpuprobe.agent.sensors.proxy import AcousticProxy, ProxyParams
    from gpuprobe.nvml.native import NativeSampler
    from gpuprobe.nvml.sensor import GpuSensor

    sensor = GpuSensor.open()
    try:
        sensor.start_sampling(NativeSampler.load(), 0.1, pcie_every=1)  # every field on every tick
        time.sleep(0.05)
        for s in sensor.drain()[-1][1]:
            sensor.read_health(s["gpu_index"], s)  # the first GPM sample
        time.sleep(0.2)
        samples = sensor.drain()[-1][1]
        for s in samples:
            sensor.read_health(s["gpu_index"], s)
        infos = sensor.infos
    finally:
        sensor.stop_sampling()
        sensor.close()
    acoustic = AcousticProxy(ProxyParams(), infos).estimate(samples, time.time_ns())
    readings = Readings(latest=samples, latest_slow={s["gpu_index"]: (s,) for s in samples}, latest_acoustic=acoustic)
    exporter = GpuExporter(readings, lambda: infos, "bench-node")
    page = exporter.render()
    for _ in range(100):
        exporter.render()
    t0 = time.process_time()
    for _ in range(renders):
        exporter.render()
    render_cpu_s = (time.process_time() - t0) / renders

    server = serve("127.0.0.1", 0, [exporter.render])
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    for _ in range(20):
        urllib.request.urlopen(url, timeout=10).read()
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(scrapes):
        urllib.request.urlopen(url, timeout=10).read()
    scrape_cpu_s = (time.process_time() - t0) / scrapes
    scrape_wall_s = (time.perf_counter() - w0) / scrapes
    server.shutdown()
    server.server_close()
    text = page.decode()
    return {
        "gpus": len(samples),
        "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
        "page_bytes": len(page),
        "render_cpu_us": round(render_cpu_s * 1e6, 1),
        "scrape_cpu_us_client_included": round(scrape_cpu_s * 1e6, 1),
        "scrape_wall_us": round(scrape_wall_s * 1e6, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--renders", type=int, default=2000)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if os.environ.get(WORKER_ENV):
        print(json.dumps(worker(args.renders, args.scrapes)))
        return 0
    from gpuprobe.sim.profiles import PROFILES
    from gpuprobe.sim.runner import open_machine

    with tempfile.TemporaryDirectory(prefix="gpuprobe-bench-prom-") as tmp:
        sim = open_machine(Path(tmp), [PROFILES["H100-SXM5-80GB"]] * args.gpus, 0.1)
        for i in range(args.gpus):
            sim.set_load(i, 80.0, mem_used_bytes=(i + 1) * 2**30)
        env = {**sim.environ(), WORKER_ENV: "1"}
        run = subprocess.run(
            [sys.executable, __file__, "--renders", str(args.renders), "--scrapes", str(args.scrapes)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    if run.returncode != 0:
        print(run.stdout + run.stderr, file=sys.stderr)
        return 1
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["machine"] = f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
