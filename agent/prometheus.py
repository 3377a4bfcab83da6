"""Part: agent. The GPUs' newest readings for Prometheus, under dcgm-exporter's names (``--prometheus-listen``).

Nothing is done per tick: a scrape renders the page from what the sampler already keeps (its last
tick's samples, the last sample of each GPU that carried PCIe and health fields, which come less
often, and the acoustic proxy's last estimates), the XID tallies the events thread keeps, and the pod
assignment the pod-resources poller keeps (:mod:`gpuprobe.agent.podresources`). Each GPU's label text
is built once and again only when its facts or its pod change. A field a GPU does not report is
absent from the page, never 0.

A scrape is the page's only cost: :class:`PageServer` answers on one thread with one selector instead
of :mod:`http.server`'s thread and :mod:`email` header parsing per request (figures in
``bench/RESULTS.md``).

The names, types and units are :mod:`gpuprobe.agent.dcgm_names`'s. XIDs are served twice: as
dcgm-exporter does (``DCGM_FI_DEV_XID_ERRORS``, the last code, 0 before any), and as a counter of
events by code (``gpuprobe_gpu_xid_events_total{xid="79"}``), which counts each event once and so
never sticks.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
        gpus = self._merged(labels)
        out: list[str] = []
        for field, metrics in GPU_FIELDS.items():
            for m in metrics:
                lines = [
                    f"{m.name}{{{labels[i]}}} {_value(v, m)}\n" for i, s in gpus if (v := s.get(field)) is not None
                ]
                if lines:
                    out.append(_HEADERS[m.name])
                    out.extend(lines)
        with self._lock:
            xid_last = dict(self._xid_last)
            xid_counts = sorted(self._xid_counts.items())
        if gpus:
            out.append(_HEADERS[XID_LAST.name])
            for index, _ in gpus:
                out.append(f"{XID_LAST.name}{{{labels[index]}}} {xid_last.get(index, 0)}\n")
        if xid_counts:
            out.append(_HEADERS[XID_EVENTS.name])
            for (index, code), count in xid_counts:
                text = labels.get(index)
                if text is not None:
                    out.append(f'{XID_EVENTS.name}{{{text},xid="{code}"}} {count}\n')
        return "".join(out).encode()

    def _merged(self, labels: dict[int, str]) -> list[tuple[int, dict[str, Any]]]:
        """Each GPU's newest values (its last tick's over its last PCIe and health reads), with the
        acoustic proxy's estimate and the free memory; GPUs without labels yet are left out."""
        slow = self._readings.latest_slow
        proxy = {
            a.gpu_index: a
            for a in self._readings.latest_acoustic
            if a.source == telemetry_pb2.ACOUSTIC_SOURCE_PROXY and a.HasField("gpu_index")
        }
        gpus: list[tuple[int, dict[str, Any]]] = []
        for sample in self._readings.latest:
            index = sample["gpu_index"]
            if index not in labels:
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
            gpus.append((index, merged))
        return gpus


class PageServer:
    """``GET /metrics`` (or ``/``) on HOST:PORT: the pages' texts, concatenated; one thread, one selector.

    Hand-written instead of :mod:`http.server` because a scrape is the agent's only CPU cost of the page:
    ``ThreadingHTTPServer`` starts a thread per request and parses the headers with :mod:`email`, 326 µs
    of CPU per scrape of a ready page against 96 µs here (``bench/RESULTS.md``). Connections are served
    concurrently, non-blocking, so a client that connects and sends nothing delays no other scrape; each
    is closed after its answer (HTTP/1.0, as before), or after ``IDLE_S`` without a whole request.
    """

    IDLE_S = 30.0  # longer than any Prometheus scrape timeout
    MAX_REQUEST_BYTES = 64 * 1024

    def __init__(self, host: str, port: int, pages: Sequence[Callable[[], bytes]]) -> None:
        self._pages = tuple(pages)
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "TCP_DEFER_ACCEPT"):
                # Linux: a connection is accepted once its request has come, so that a scrape wakes this
                # thread once, not twice (a wake-up costs ~200 µs of CPU on a busy machine, bench/RESULTS.md)
                self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 1)
            self._socket.bind((host, port))
            self._socket.listen(16)
            self._socket.setblocking(False)
        except OSError:
            self._socket.close()
            raise
        self.server_address: tuple[Any, ...] = self._socket.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._socket, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._open: dict[socket.socket, _Connection] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gpuprobe-prometheus", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stops serving (open connections are closed) and waits for the thread."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join()

    def server_close(self) -> None:
        for s in (self._socket, self._wake_r, self._wake_w):
            s.close()
        self._selector.close()

    def _run(self) -> None:
        while not self._stopping:
            # no timeout while no connection is open: an idle endpoint never wakes the agent
            deadline = min((c.deadline for c in self._open.values()), default=None)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            for key, _ in self._selector.select(timeout):
                if key.fileobj is self._socket:
                    self._accept()
                elif key.fileobj is not self._wake_r:
                    self._step(key.data)
            now = time.monotonic()
            for c in [c for c in self._open.values() if c.deadline <= now]:
                self._close(c)
        for c in list(self._open.values()):
            self._close(c)

    def _accept(self) -> None:
        try:
            sock, _ = self._socket.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:  # out of file descriptors, say: the next scrape tries again
            log.warning("Prometheus endpoint: accept: %s", e)
            return
        sock.setblocking(False)
        c = _Connection(sock, time.monotonic() + self.IDLE_S)
        self._open[sock] = c
        self._step(c)  # the request is mostly there already: then it is answered without a wait

    def _step(self, c: _Connection) -> None:
        """Reads the request or sends the rest of the answer, as far as the socket allows without waiting."""
        try:
            if c.answer is None:
                data = c.sock.recv(65536)
                if not data:
                    self._close(c)
                    return
                c.request += data
                end = c.request.find(b"\r\n\r\n")
                if end < 0:
                    end = c.request.find(b"\n\n")  # bare LFs, which http.server took too
                if end >= 0:
                    c.answer = [memoryview(b) for b in self._answer(bytes(c.request[:end]))]
                elif len(c.request) > self.MAX_REQUEST_BYTES:
                    c.answer = [memoryview(b) for b in _response(431, [b"request header fields too large\n"])]
                else:
                    self._wait(c, selectors.EVENT_READ)
                    return
            sent = c.sock.sendmsg(c.answer)  # the head and each page as they are: no copy of the page
            while c.answer and sent >= len(c.answer[0]):
                sent -= len(c.answer.pop(0))
            if c.answer:
                c.answer[0] = c.answer[0][sent:]
                self._wait(c, selectors.EVENT_WRITE)
            else:
                self._close(c)
        except (BlockingIOError, InterruptedError):
            self._wait(c, selectors.EVENT_READ if c.answer is None else selectors.EVENT_WRITE)
        except OSError:  # the client went away
            self._close(c)

    def _wait(self, c: _Connection, events: int) -> None:
        if c.events == 0:
            self._selector.register(c.sock, events, c)
        elif c.events != events:
            self._selector.modify(c.sock, events, c)
        c.events = events

    def _answer(self, head: bytes) -> list[bytes]:
        parts = head.split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _response(400, [b"bad request\n"])
        method, target = parts[0], parts[1]
        if method != b"GET":
            return _response(501, [b"unsupported method\n"])
        if target.split(b"?", 1)[0] not in (b"/metrics", b"/"):
            return _response(404, [b"not found\n"])
        try:
            body = [page() for page in self._pages]
        except Exception:
            log.exception("rendering the Prometheus page failed")
            return _response(500, [b"rendering the page failed\n"])
        return _response(200, body, CONTENT_TYPE)

    def _close(self, c: _Connection) -> None:
        self._open.pop(c.sock, None)
        if c.events:
            self._selector.unregister(c.sock)
        c.sock.close()


class _Connection:
    __slots__ = ("answer", "deadline", "events", "request", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.request = bytearray()
        self.answer: list[memoryview] | None = None  # what is left to send, once the request is read
        self.events = 0  # what the selector waits for on it (0: not registered)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
}


def _response(status: int, body: list[bytes], content_type: str = "text/plain; charset=utf-8") -> list[bytes]:
    """The head, then the body's parts (sent together by one sendmsg)."""
    head = (
        f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {sum(map(len, body))}\r\nConnection: close\r\n\r\n"
    )
    return [head.encode(), *body]


def serve(host: str, port: int, pages: Sequence[Callable[[], bytes]]) -> PageServer:
    """``/metrics`` on HOST:PORT in a background thread: the pages' texts, concatenated."""
    return PageServer(host, port, pages)
