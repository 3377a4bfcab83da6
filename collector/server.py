"""Part: collector. The gRPC side: ``gpuprobe.v1.TelemetryService.Stream`` served with ``grpc.aio``.

One stream per agent connection (docs/wire.md): credentials are checked before anything is read
(:mod:`.auth`), the first message must be a ``Hello`` (checked by :mod:`.validate`), then batches are
validated and encoded (:mod:`.encode`), committed to the WAL (:mod:`.wal`) and only then acked; with
``--ack-after sink`` a batch is acked only once the sink has written its WAL row into InfluxDB
(:meth:`.sink.Sink.written`), so nothing acked is ever left in a WAL.

Inside one stream a reader task parses, checks and encodes each batch and hands it to the WAL
(whose writer thread commits whatever arrived together in one transaction); the handler itself
awaits those commits in order and answers with cumulative acks, coalescing the ones that are ready
together. At most ``stream_window`` batches of a stream wait for the WAL (``sink``: for InfluxDB);
then the reader stops reading and HTTP/2 flow control slows that agent down, and nobody else.

Requests arrive as raw bytes and are parsed here, so that an undecodable message ends its stream
with ``INVALID_ARGUMENT`` (gRPC's own deserializer would answer ``INTERNAL``); gRPC itself refuses
messages over ``--max-message-bytes`` with ``RESOURCE_EXHAUSTED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from gpuprobe import __version__
from gpuprobe.collector import clock
from gpuprobe.collector.auth import Authenticator
from gpuprobe.collector.encode import StreamEncoder
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.settings import CollectorSettings
from gpuprobe.collector.sink import Sink
from gpuprobe.collector.wal import WalError, WriteAheadLog
from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.validate import (
    NS_PER_S,
    REASON_LABELS,
    STREAM_ACCEPTED_HEADER,
    Identity,
    StreamError,
    check_hello,
)

log = logging.getLogger(__name__)

SERVICE = "gpuprobe.v1.TelemetryService"


@dataclass
class _Pending:
    seq: int
    future: asyncio.Future[Any] | None  # None: nothing to wait for (a replay or an empty batch)
    rejections: list[telemetry_pb2.BatchRejection]


class _End:
    """The agent half-closed the stream."""


class TelemetryService:
    """The servicer: one instance per collector process."""

    def __init__(
        self,
        config: CollectorSettings,
        wal: WriteAheadLog,
        metrics: Metrics,
        authenticator: Authenticator,
        sink: Sink | None = None,
    ) -> None:
        if config.ack_after == "sink" and sink is None:
            raise ValueError("--ack-after sink needs the sink")
        self.config = config
        self.sink = sink
        self.ack_after_sink = config.ack_after == "sink"
        self.limits = config.limits
        self.wal = wal
        self.metrics = metrics
        self.auth = authenticator
        self._streams: set[asyncio.Queue[Any]] = set()
        self._stopping = False
        # one encoder per identity, shared by that agent's streams: reconnects keep the escaped prefixes
        self._encoders: dict[Identity, StreamEncoder] = {}

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {"Stream": grpc.stream_stream_rpc_method_handler(self.stream)},  # raw bytes in and out
        )

    def shutdown(self) -> None:
        """Ends every open stream with UNAVAILABLE after acking what is durable; refuses new ones."""
        self._stopping = True
        for queue in list(self._streams):
            queue.put_nowait(StreamError(grpc.StatusCode.UNAVAILABLE, "the collector is shutting down"))

    # --- one stream ------------------------------------------------------------------------------

    async def stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.metrics.streams_open.inc()
        code = "OK"
        try:
            try:
                async for response in self._serve(requests, context):
                    yield response
            except StreamError as error:
                code = error.code.name
                log.log(
                    logging.INFO if error.code == grpc.StatusCode.UNAVAILABLE else logging.WARNING,
                    "stream from %s ended with %s: %s",
                    context.peer(),
                    error.code.name,
                    error.message,
                )
                await context.abort(error.code, error.message)
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            self.metrics.streams_open.dec()
            self.metrics.streams_ended.labels(code).inc()

    async def _serve(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if self._stopping:
            raise StreamError(grpc.StatusCode.UNAVAILABLE, "the collector is shutting down")
        principal = self.auth.authenticate(context.invocation_metadata() or (), context.auth_context())
        # the response headers now: an agent waits for them before it writes its Hello, so a refusal
        # of its credentials reaches it with its code (a write racing the end of a stream makes
        # grpcio report INTERNAL instead, grpc/grpc#36066)
        await context.send_initial_metadata((STREAM_ACCEPTED_HEADER,))
        incoming = requests.__aiter__()
        try:
            first = _parse(await incoming.__anext__())
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "hello":
            raise StreamError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the first message of a stream must be a Hello, not {first.WhichOneof('kind') or 'an empty message'}",
            )
        hello = first.hello
        identity = check_hello(hello, self.limits)
        self.auth.authorize(principal, identity.agent_id)
        offset_ns = clock.measured_offset_ns(hello, time.time_ns())
        correction_ns = clock.correction_ns(offset_ns)
        if correction_ns:
            self.metrics.clock_corrected_streams.inc()
            log.warning(
                "agent %s: its clock is %+.1f s off the collector's; its timestamps are moved by %+d s onto"
                " the collector's clock (the offset is stored as agent clock_offset_s)",
                identity.agent_id,
                offset_ns / NS_PER_S,
                -correction_ns // NS_PER_S,
            )
        durable = self.wal.durable_seq(identity.agent_id, hello.spool_id)
        log.info(
            "agent %s (host %s, %s) connected from %s: spool %s, unacked %d..%d, durable here up to %d",
            identity.agent_id,
            identity.host,
            hello.agent_version or "unknown version",
            context.peer(),
            hello.spool_id or "-",
            hello.oldest_unacked_seq,
            hello.newest_unacked_seq,
            durable,
        )
        yield telemetry_pb2.StreamResponse(
            welcome=telemetry_pb2.Welcome(
                collector_id=self.config.collector_id,
                collector_version=__version__,
                max_message_bytes=self.limits.max_message_bytes,
                time_unix_ns=time.time_ns(),
            )
        ).SerializeToString()

        queue: asyncio.Queue[_Pending | _End | StreamError] = asyncio.Queue()
        window = asyncio.Semaphore(max(1, self.config.stream_window))
        self._streams.add(queue)
        reader = asyncio.create_task(self._read(incoming, identity, hello.spool_id, offset_ns, queue, window))
        try:
            held: _Pending | _End | StreamError | None = None
            while True:
                item = held if held is not None else await queue.get()
                held = None
                if isinstance(item, _End):
                    return
                if isinstance(item, StreamError):
                    raise item
                await self._durable(item, reader)
                window.release()
                seq, rejections = item.seq, list(item.rejections)
                while not queue.empty():  # coalesce what is durable already into the same ack
                    following = queue.get_nowait()
                    if not isinstance(following, _Pending) or (
                        following.future is not None and not following.future.done()
                    ):
                        held = following
                        break
                    await self._durable(following, reader)
                    window.release()
                    seq = following.seq
                    rejections.extend(following.rejections)
                yield telemetry_pb2.StreamResponse(
                    ack=telemetry_pb2.Ack(durable_seq=seq, rejections=rejections)
                ).SerializeToString()
        finally:
            self._streams.discard(queue)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _durable(self, item: _Pending, reader: asyncio.Task[StreamError | None]) -> None:
        """Waits until the batch is committed; a reader that fails meanwhile ends the stream at once
        (the batch is not acked and comes again), so a WAL that cannot commit holds no agent."""
        if item.future is None:
            return
        if not item.future.done():
            await asyncio.wait((item.future, reader), return_when=asyncio.FIRST_COMPLETED)
            if not item.future.done() and (failure := reader.result()) is not None:
                raise failure
        try:
            await item.future
        except WalError as exc:
            raise StreamError(grpc.StatusCode.UNAVAILABLE, f"the collector cannot store batches: {exc}") from exc

    async def _read(
        self,
        incoming: AsyncIterator[bytes],
        identity: Identity,
        spool_id: str,
        clock_offset_ns: int,
        queue: asyncio.Queue[_Pending | _End | StreamError],
        window: asyncio.Semaphore,
    ) -> StreamError | None:
        """Reads, checks and encodes the batches into the WAL; returns the error that ended the stream."""
        last_seq = 0
        correction_ns = clock.correction_ns(clock_offset_ns)
        try:
            async for raw in incoming:
                request = _parse(raw)
                kind = request.WhichOneof("kind")
                if kind == "hello":
                    raise StreamError(grpc.StatusCode.FAILED_PRECONDITION, "a second Hello on the same stream")
                if kind != "batch":
                    raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "a StreamRequest with neither hello nor batch")
                batch = request.batch
                if batch.agent_id != identity.agent_id:
                    raise StreamError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"batch seq {batch.seq} is for agent {batch.agent_id[:80]!r}, "
                        f"this stream is {identity.agent_id!r}",
                    )
                if batch.seq <= last_seq:
                    raise StreamError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"batch seq {batch.seq} does not increase (the previous batch was {last_seq}; seq starts at 1)",
                    )
                last_seq = batch.seq
                await window.acquire()
                self.metrics.batches_received.inc()
                # A replay of a batch durable in the WAL is acked at once, unless acks wait for InfluxDB:
                # then it is stored again (a second row of the same points, which overwrite themselves).
                if not self.ack_after_sink and batch.seq <= self.wal.durable_seq(identity.agent_id, spool_id):
                    self.metrics.batches_replayed.inc()
                    queue.put_nowait(_Pending(batch.seq, None, []))
                    continue
                if not self.wal.healthy:
                    raise StreamError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"the collector cannot store batches now, its WAL is {self.wal.state()}; "
                        "keep them spooled and retry, or try another collector",
                    )
                if self.wal.full:
                    raise StreamError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the collector's WAL is full ({self.wal.depth_bytes} bytes queued for InfluxDB); retry later",
                    )
                if correction_ns:
                    clock.shift_batch(batch, correction_ns)
                # the request's bytes spare the encoder serializing the batch again (finding health
                # samples); a moved batch is no longer what they say
                encoded = self._encoder(identity).encode(
                    batch, time.time_ns(), None if correction_ns else raw, clock_offset_ns=clock_offset_ns
                )
                self._count(encoded.sample_count, encoded.line_count, encoded.problems)
                stored = self.wal.append(identity.agent_id, spool_id, batch.seq, encoded.lines, encoded.line_count)
                future = asyncio.ensure_future(self._written(stored)) if self.ack_after_sink else stored
                # the stream may end before the commit does: its outcome is then nobody's business
                future.add_done_callback(_ignore_outcome)
                queue.put_nowait(_Pending(batch.seq, future, encoded.problems.rejections()))
            queue.put_nowait(_End())
            return None
        except StreamError as error:
            queue.put_nowait(error)
            return error
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must end this stream only
            log.exception("stream of agent %s failed", identity.agent_id)
            bug = StreamError(grpc.StatusCode.INTERNAL, f"collector error: {type(exc).__name__}: {exc}")
            queue.put_nowait(bug)
            return bug

    async def _written(self, stored: Any) -> None:
        """``--ack-after sink``: the batch is in the WAL, then in InfluxDB."""
        row_id = await stored
        if row_id is None or self.sink is None:
            return
        self.metrics.acks_waiting_for_influxdb.inc()
        try:
            await self.sink.written(row_id)
        finally:
            self.metrics.acks_waiting_for_influxdb.dec()

    def _encoder(self, identity: Identity) -> StreamEncoder:
        encoder = self._encoders.get(identity)
        if encoder is None:
            if len(self._encoders) >= 10_000:
                self._encoders.clear()
            encoder = self._encoders[identity] = StreamEncoder(identity, self.limits)
        return encoder

    def _count(self, samples: int, lines: int, problems: Any) -> None:
        self.metrics.samples_received.inc(samples)
        self.metrics.lines_accepted.inc(lines)
        for reason, tally in problems.by_reason.items():
            label = REASON_LABELS.get(reason, "other")
            if tally.samples:
                self.metrics.rejected_samples.labels(label).inc(tally.samples)
            if tally.values:
                self.metrics.rejected_values.labels(label).inc(tally.values)
        if problems.flagged_timestamps:
            self.metrics.timestamps_flagged.inc(problems.flagged_timestamps)


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" noise


def _parse(raw: bytes) -> telemetry_pb2.StreamRequest:
    try:
        return telemetry_pb2.StreamRequest.FromString(raw)
    except DecodeError as exc:
        raise StreamError(
            grpc.StatusCode.INVALID_ARGUMENT, f"undecodable StreamRequest ({len(raw)} bytes): {exc}"
        ) from None


def server_options(config: CollectorSettings) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", config.limits.max_message_bytes),
        ("grpc.max_send_message_length", 4 * 1024 * 1024),
        ("grpc.so_reuseport", 1 if config.workers > 1 else 0),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 0),
    ]
