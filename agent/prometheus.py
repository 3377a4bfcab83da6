"""The GPUs' newest readings for Prometheus, under dcgm-exporter's names (``--prometheus-listen``).

Nothing is done per tick: a scrape renders the page from what the sampler already keeps (its last
tick's samples, the last sample of each GPU that carried PCIe and health fields, which come less
often, and the acoustic proxy's last estimates), the XID tallies the events thread keeps, and the pod
assignment the pod-resources poller keeps (:mod:`gpuprobe.agent.podresources`). Each GPU's label text
is built once and again only when its facts or its pod change. A field a GPU does not report is
absent from the page, never 0.

The names, types and units are :mod:`gpuprobe.agent.dcgm_names`'s. XIDs are served twice: as
dcgm-exporter does (``DCGM_FI_DEV_XID_ERRORS``, the last code, 0 before any), and as a counter of
events by code (``gpuprobe_gpu_xid_events_total{xid="79"}``), which counts each event once and so
never sticks.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from gpuprobe.agent.dcgm_names import GPU_FIELDS, LABELS, POD_LABELS, XID_EVENTS, XID_LAST, PromMetric
from gpuprobe.agent.podresources import PodRef
from gpuprobe.v1 import common_pb2, telemetry_pb2

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Readings(Protocol):
    """What the exporter reads (the sampler's attributes; each replaced by its thread, never changed)."""

    latest: list[dict[str, Any]]
    latest_slow: dict[int, tuple[dict[str, Any], ...]]
    latest_acoustic: list[telemetry_pb2.AcousticSample]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(v: Any, m: PromMetric) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if m.scale != 1.0 or m.divisor != 1.0:
        return repr(float(v) * m.scale / m.divisor)
    return str(v) if isinstance(v, int) else repr(float(v))


def _header(m: PromMetric) -> str:
    return f"# HELP {m.name} {m.help}\n# TYPE {m.name} {m.type}\n"


_HEADERS = {m.name: _header(m) for metrics in GPU_FIELDS.values() for m in metrics} | {
    m.name: _header(m) for m in (XID_LAST, XID_EVENTS)
}


class GpuExporter:
    """Renders the page; :meth:`event` is the GPU events' second sink (any thread)."""

    def __init__(
        self,
        readings: Readings,
        infos: Callable[[], Sequence[common_pb2.GpuInfo]],
        hostname: str,
        pods: Callable[[], Mapping[str, PodRef]] | None = None,
    ) -> None:
        self._readings = readings
        self._infos = infos
        self._hostname = hostname
        self._pods = pods
        self._lock = threading.Lock()
        self._xid_last: dict[int, int] = {}
        self._xid_counts: dict[tuple[int, int], int] = {}
        self._labels_cache: tuple[list[common_pb2.GpuInfo], Mapping[str, PodRef] | None, dict[int, str]] | None = None

    def event(self, event: telemetry_pb2.GpuEvent) -> None:
        if event.kind != telemetry_pb2.GPU_EVENT_KIND_XID:
            return
        with self._lock:
            self._xid_last[event.gpu_index] = event.data
            key = (event.gpu_index, event.data)
            self._xid_counts[key] = self._xid_counts.get(key, 0) + 1

    def _gpu_labels(self) -> dict[int, str]:
        infos = self._infos()
        pods = self._pods() if self._pods is not None else None
        cached = self._labels_cache  # one attribute: concurrent scrapes see a whole entry
        # the sensor's facts are new objects when they change, the poller's assignment a new mapping
        if (
            cached is not None
            and cached[1] is pods
            and len(cached[0]) == len(infos)
            and all(a is b for a, b in zip(cached[0], infos, strict=True))
        ):
            return cached[2]
        labels: dict[int, str] = {}
        for info in infos:
            values = (
                str(info.index),
                info.uuid,
                info.pci_bus_id,
                f"nvidia{info.index}",
                info.name,
                self._hostname,
                info.driver_version,
            )
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(LABELS, values, strict=True))
            pod = pods.get(info.uuid) if pods else None
            if pod is not None:
                text += "," + ",".join(f'{k}="{_escape(v)}"' for k, v in zip(POD_LABELS, pod, strict=True))
            labels[info.index] = text
        self._labels_cache = (list(infos), pods, labels)
        return labels

    def render(self) -> bytes:
        labels = self._gpu_labels()
        slow = self._readings.latest_slow
        proxy = {
            a.gpu_index: a
            for a in self._readings.latest_acoustic
            if a.source == telemetry_pb2.ACOUSTIC_SOURCE_PROXY and a.HasField("gpu_index")
        }
        gpus: list[tuple[str, dict[str, Any]]] = []
        for sample in self._readings.latest:
            index = sample["gpu_index"]
            text = labels.get(index)
            if text is None:
                continue  # not in the facts yet (it joined this tick): next scrape
            older = slow.get(index)
            if older:
                merged: dict[str, Any] = {}
                for s in sorted(older, key=lambda s: s["time_unix_ns"]):
                    merged.update(s)
                merged.update(sample)
            else:
                merged = dict(sample)
            estimate = proxy.get(index)
            if estimate is not None:
                if estimate.HasField("est_dba"):
                    merged["acoustic_est_dba"] = estimate.est_dba
                if estimate.HasField("tdp_flag"):
                    merged["acoustic_tdp_flag"] = estimate.tdp_flag
            used, total = merged.get("mem_used_bytes"), merged.get("mem_total_bytes")
            if used is not None and total is not None:
                merged["mem_free_bytes"] = total - used
            gpus.append((text, merged))
        out: list[str] = []
        for field, metrics in GPU_FIELDS.items():
            for m in metrics:
                lines = [f"{m.name}{{{text}}} {_value(v, m)}\n" for text, s in gpus if (v := s.get(field)) is not None]
                if lines:
                    out.append(_HEADERS[m.name])
                    out.extend(lines)
        with self._lock:
            xid_last = dict(self._xid_last)
            xid_counts = sorted(self._xid_counts.items())
        if gpus:
            out.append(_HEADERS[XID_LAST.name])
            for text, merged in gpus:
                out.append(f"{XID_LAST.name}{{{text}}} {xid_last.get(merged['gpu_index'], 0)}\n")
        if xid_counts:
            out.append(_HEADERS[XID_EVENTS.name])
            for (index, code), count in xid_counts:
                text = labels.get(index)
                if text is not None:
                    out.append(f'{XID_EVENTS.name}{{{text},xid="{code}"}} {count}\n')
        return "".join(out).encode()


class _Handler(BaseHTTPRequestHandler):
    pages: Sequence[Callable[[], bytes]] = ()

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        try:
            body = b"".join(page() for page in self.pages)
        except Exception:
            log.exception("rendering the Prometheus page failed")
            self.send_error(500)
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one per scrape interval)."""


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve(host: str, port: int, pages: Sequence[Callable[[], bytes]]) -> ThreadingHTTPServer:
    """``/metrics`` on HOST:PORT in a background thread: the pages' texts, concatenated."""
    handler = type("Handler", (_Handler,), {"pages": tuple(pages)})
    server_class = _V6Server if ":" in host else ThreadingHTTPServer
    server = server_class((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="gpuprobe-prometheus", daemon=True).start()
    return server
