"""Helpers for the collector's tests (fixtures in conftest.py): real collectors (in-process or as ``gpuprobe collector``
processes), synthetic agents over real gRPC sockets, the real InfluxDB, and an HTTP server that
records write requests and answers them as a script says (for InfluxDB answers that a healthy
InfluxDB 1.6 never gives: 413, 429, 503 with Retry-After, the 1.x series-limit 500, 401, and the
v2 API).
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import support

from gpuprobe.collector.runner import Collector
from gpuprobe.collector.settings import CollectorSettings, SinkSettings
from gpuprobe.devservices.certs import Pki
from gpuprobe.devservices.ports import LOOPBACK, port_accepts
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.v1 import telemetry_pb2

FAST_SINK = SinkSettings(linger_s=0.01, backoff_initial_s=0.05, backoff_max_s=0.5)


def collector_config(tmp_path: Path, influx_url: str, database: str, **overrides: Any) -> CollectorSettings:
    """An in-process collector on a free loopback port, plaintext, quick retries."""
    base = CollectorSettings(
        listen=f"{LOOPBACK}:0",
        wal_dir=tmp_path / "wal",
        insecure=True,
        collector_id="test-collector",
        influx=InfluxSettings(url=influx_url, database=database),
        sink=FAST_SINK,
        shutdown_grace_s=1.0,
    )
    return replace(base, **overrides)


@contextlib.asynccontextmanager
async def running(config: CollectorSettings, **kwargs: Any) -> AsyncIterator[Collector]:
    collector = Collector(config, **kwargs)
    await collector.start()
    try:
        yield collector
    finally:
        await collector.stop()


# the collector's tests wait in the event loop their in-process collector runs in
wait_until = support.wait_until_async


# --- raw streams (for misbehaving clients) ---------------------------------------------------------


async def raw_exchange(
    target: str,
    messages: Sequence[bytes],
    *,
    metadata: Sequence[tuple[str, str]] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = (),
    timeout_s: float = 10.0,
) -> tuple[grpc.StatusCode, str, list[telemetry_pb2.StreamResponse]]:
    """Sends ``messages`` (raw serialized bytes) on one stream, half-closes, reads everything;
    returns the final status code, its details and the responses."""
    import asyncio

    channel = (
        grpc.aio.secure_channel(target, credentials, options=options)
        if credentials is not None
        else grpc.aio.insecure_channel(target, options=options)
    )
    responses: list[telemetry_pb2.StreamResponse] = []
    async with channel:
        call = channel.stream_stream("/gpuprobe.v1.TelemetryService/Stream")(
            metadata=tuple(metadata) if metadata else None, timeout=timeout_s
        )

        async def read() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for raw in call:
                    responses.append(telemetry_pb2.StreamResponse.FromString(raw))

        reader = asyncio.create_task(read())
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            for message in messages:
                await call.write(message)
            await call.done_writing()
        await reader
        return await call.code(), (await call.details()) or "", responses


# --- the recording / answering HTTP server --------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    raw_body: bytes
    body: bytes  # decompressed
    at_s: float

    @property
    def lines(self) -> list[str]:
        return [line for line in self.body.decode().split("\n") if line]


Answer = tuple[int, dict[str, str], bytes]


@dataclass
class RecordingServer:
    """Records every request; ``answer(request)`` says what to reply (default: 204)."""

    answer: Callable[[Recorded], Answer] = field(default=lambda request: (204, {}, b""))
    requests: list[Recorded] = field(default_factory=list)
    port: int = 0
    _server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/write")]

    def start(self) -> RecordingServer:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                parsed = urllib.parse.urlsplit(self.path)
                request = Recorded(
                    method="POST",
                    path=parsed.path,
                    query=dict(urllib.parse.parse_qsl(parsed.query)),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    raw_body=raw,
                    body=body,
                    at_s=time.monotonic(),
                )
                owner.requests.append(request)
                status, headers, payload = owner.answer(request)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                if payload:
                    self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def json_error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


# --- TLS --------------------------------------------------------------------------------------------


def client_credentials(pki: Pki, *, client: str = "good") -> grpc.ChannelCredentials:
    """``good``: a certificate from the collector's CA; ``wrong_ca``: from an unrelated CA; ``none``."""
    if client == "none":
        return grpc.ssl_channel_credentials(root_certificates=pki.ca.cert_pem)
    pair = pki.client if client == "good" else pki.other_client
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.cert_pem, private_key=pair.key_pem, certificate_chain=pair.cert_pem
    )


# --- a collector as a real process -----------------------------------------------------------------


class CollectorProcess:
    """``python -m gpuprobe.app collector ...`` with its output in a log file; killed with real signals."""

    def __init__(self, args: Sequence[str], log_path: Path, port: int, env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, "-m", "gpuprobe.app", "--log-level", "info", "collector", *args]
        self.log_path = log_path
        self.port = port
        self.env = support.clean_env(**(env or {}))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> CollectorProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env,
            )
        proc = self.proc
        try:
            support.wait_until(
                lambda: port_accepts(LOOPBACK, self.port, 0.2) or proc.poll() is not None,
                timeout_s,
                f"the collector listening on port {self.port}",
                describe=self.log,
            )
        except AssertionError:
            self.kill()
            raise
        if proc.poll() is not None:
            raise AssertionError(f"collector exited with {proc.returncode}:\n{self.log()}")
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout_s: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.proc.returncode)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]


class LoopThread:
    """An event loop in a background thread: a collector and its clients live there across many
    synchronous calls (hypothesis examples), all in one loop as gRPC's asyncio API wants."""

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Any, timeout_s: float = 60.0) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
