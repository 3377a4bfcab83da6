"""A real gRPC TelemetryService receiver for the agent's tests and benchmark (not the collector).

Run as its own process so a test can ``kill -9`` it::

    python tests/agent/receiver.py --port PORT --out DIR [--token T] [--tls-cert C --tls-key K
        [--tls-client-ca CA]] [--no-ack] [--reject-seq N ...]

It implements the wire contract's server side from the generated code: Hello first (else
FAILED_PRECONDITION), one Welcome, then for every SampleBatch (agent_id must match, seq must
increase on the stream) it appends the raw ``StreamRequest`` bytes to ``DIR/batches.bin``
(4-byte big-endian length + message), flushes and fsyncs, and only then acks ``durable_seq``, so
an acknowledged batch is on disk even if the receiver is killed right after. ``DIR/hellos.bin``
records every Hello the same way. ``--token`` checks ``authorization: Bearer <token>``
(UNAUTHENTICATED otherwise); ``--tls-client-ca`` requires a client certificate signed by that CA.
Prints ``READY <port>`` on stdout when it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import struct
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio

from gpuprobe.v1 import telemetry_pb2, telemetry_pb2_grpc
from gpuprobe.wire.validate import STREAM_ACCEPTED_HEADER


class Recorder:
    def __init__(self, path: Path) -> None:
        self._f = open(path, "ab")  # noqa: SIM115 - kept open for the process's life

    def append(self, data: bytes) -> None:
        self._f.write(struct.pack(">I", len(data)) + data)
        self._f.flush()
        os.fsync(self._f.fileno())


class Receiver(telemetry_pb2_grpc.TelemetryServiceServicer):
    def __init__(
        self, out: Path, token: str | None, ack: bool, reject: set[int], abort_at: int = 0, abort_code: str = ""
    ) -> None:
        self.batches = Recorder(out / "batches.bin")
        self.hellos = Recorder(out / "hellos.bin")
        self.token = token
        self.ack = ack
        self.reject = reject
        self.abort_at = abort_at  # end the stream with abort_code when this seq arrives (once)
        self.abort_code = abort_code

    async def Stream(
        self, request_iterator: AsyncIterator[telemetry_pb2.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[telemetry_pb2.StreamResponse]:
        if self.token is not None:
            metadata = dict(context.invocation_metadata() or ())
            if metadata.get("authorization") != f"Bearer {self.token}":
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or bad bearer token")
        await context.send_initial_metadata((STREAM_ACCEPTED_HEADER,))  # as the collector does
        agent_id = None
        last_seq = 0
        async for request in request_iterator:
            kind = request.WhichOneof("kind")
            if agent_id is None:
                if kind != "hello":
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message must be a Hello")
                agent_id = request.hello.identity.agent_id
                self.hellos.append(request.SerializeToString())
                yield telemetry_pb2.StreamResponse(
                    welcome=telemetry_pb2.Welcome(
                        collector_id="test-receiver",
                        collector_version="0",
                        max_message_bytes=4 * 2**20,
                        time_unix_ns=time.time_ns(),
                    )
                )
                continue
            if kind != "batch":
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a second Hello")
            batch = request.batch
            if batch.agent_id != agent_id:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"batch for agent {batch.agent_id!r}")
            if batch.seq <= last_seq:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"seq {batch.seq} after {last_seq}")
            last_seq = batch.seq
            if self.abort_at and batch.seq == self.abort_at:
                self.abort_at = 0
                await context.abort(
                    getattr(grpc.StatusCode, self.abort_code), f"{self.abort_code} from the test receiver"
                )
            self.batches.append(request.SerializeToString())
            if self.ack:
                ack = telemetry_pb2.Ack(durable_seq=batch.seq)
                if batch.seq in self.reject:
                    count = len(batch.gpu_samples) + len(batch.node_samples) + len(batch.acoustic_samples)
                    ack.rejections.add(
                        seq=batch.seq,
                        reason=telemetry_pb2.REJECT_REASON_SINK_REFUSED,
                        message="refused by the test receiver",
                        rejected_samples=count,
                    )
                yield telemetry_pb2.StreamResponse(ack=ack)


async def serve(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
    )
    telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(
        Receiver(out, args.token, not args.no_ack, set(args.reject_seq), args.abort_at_seq, args.abort_code), server
    )
    address = f"127.0.0.1:{args.port}"
    if args.tls_cert:
        credentials = grpc.ssl_server_credentials(
            [(Path(args.tls_key).read_bytes(), Path(args.tls_cert).read_bytes())],
            root_certificates=Path(args.tls_client_ca).read_bytes() if args.tls_client_ca else None,
            require_client_auth=bool(args.tls_client_ca),
        )
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    await server.start()
    print(f"READY {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=None)


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--token")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--tls-client-ca")
    parser.add_argument("--no-ack", action="store_true")
    parser.add_argument("--reject-seq", type=int, action="append", default=[])
    parser.add_argument("--abort-at-seq", type=int, default=0, help="end the stream when this batch arrives (once)")
    parser.add_argument("--abort-code", default="INTERNAL", help="the gRPC status code of --abort-at-seq")
    asyncio.run(serve(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
