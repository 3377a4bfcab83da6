"""Part: agent. The uplink: the spool's batches over ``TelemetryService.Stream`` to a collector (docs/wire.md).

One session is one bidirectional stream to one collector::

    open channel (TLS / mutual TLS, keepalives) ─► Stream(metadata: authorization: Bearer …)
    write Hello (identity, GPUs, spool_id, oldest/newest unacked seq)
    sender:   every spooled batch in seq order, from the oldest, keeping at most
              max_in_flight_batches / max_in_flight_bytes unacknowledged
    receiver: Welcome (within welcome_timeout_s), then Acks: delete seq <= durable_seq from the
              spool, log and count rejections

With several addresses (``--collector a,b,c``) an agent starts at the one a stable hash of its
agent id picks (:func:`first_choice`: SHA-256, the same in every process and release), so a fleet
spreads over the collectors, and fails over in the given order from there (b, c, a for an agent
that starts at b). When a session ends for any reason the uplink opens a new one, after a pause: the
next address at once while there are addresses that have not failed in this round, then exponential backoff with
jitter (``reconnect_min_s`` doubling up to ``reconnect_max_s``, each pause drawn uniformly from its
upper half). A refusal that will not go away by itself waits ``auth_retry_s`` and is logged as an
error: refused credentials (UNAUTHENTICATED, PERMISSION_DENIED) and a refused identity or stream
(INVALID_ARGUMENT, FAILED_PRECONDITION: the agent would be refused again at once, in a tight loop).
Nothing is ever dropped because of a stream error: batches stay in the spool and are replayed,
from the oldest unacknowledged one, on the next stream.

Batches are written as pre-encoded ``StreamRequest`` bytes: the spool holds each batch serialized,
and ``StreamRequest{batch}`` is that payload behind one tag and length prefix, so a replay costs no
parsing and no re-serialization. A batch that was just spooled is handed over in memory
(:meth:`Uplink.notify`), so the spool is read back only to replay.

Acknowledged batches leave the spool in coalesced deletes (every ``DELETE_EVERY_BATCHES`` acked
batches or ``DELETE_EVERY_S`` seconds, and when the agent stops). Until then the uplink remembers
what was acknowledged and does not send it again; only after a crash can up to that many
acknowledged batches be sent a second time, which at-least-once delivery allows (a replayed point
overwrites itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import sqlite3
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import grpc.aio

from gpuprobe.agent.metrics import Counters
from gpuprobe.agent.settings import UplinkSettings
from gpuprobe.agent.spool import SpoolState, Stored, UplinkSpool
from gpuprobe.backoff import Backoff
from gpuprobe.errors import ProtocolError
from gpuprobe.v1 import telemetry_pb2
from gpuprobe.wire.validate import STREAM_ACCEPTED_HEADER

log = logging.getLogger(__name__)

METHOD = "/gpuprobe.v1.TelemetryService/Stream"
DELETE_EVERY_BATCHES = 8
DELETE_EVERY_S = 5.0
MiB = 2**20
AUTH_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
REFUSED_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
# What grpc.aio reports when a write fails because the stream ended under it: the client library
# makes this status up itself and the collector's own status is lost (grpc.aio._call, _write).
WRITE_RACED_END = "Internal error from Core"
#: How long a stream waits for the collector's response headers before writing its Hello anyway, in s
HEADERS_WAIT_S = 2.0
#: ... and for the status of a stream that answered without accepting it, in s
STATUS_WAIT_S = 0.5


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def batch_request(payload: bytes) -> bytes:
    """``StreamRequest{batch: <payload>}`` on the wire: field 2, length-delimited."""
    return b"\x12" + _varint(len(payload)) + payload


def _identity(data: bytes) -> bytes:
    return data


def first_choice(agent_id: str, count: int) -> int:
    """The index of the address an agent tries first, of ``count``: a stable hash of its id (not
    Python's ``hash()``, which differs between processes), so agents spread evenly over collectors
    and each comes back to the same one after a restart."""
    if count <= 1:
        return 0
    digest = hashlib.sha256(agent_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


class SessionError(ProtocolError):
    """Ends one session; ``code`` is the gRPC status where there is one."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class UplinkEvents(Protocol):
    """What happens on the streams, for a watcher beside the log and the counters (the load generator)."""

    def welcomed(self, target: str, welcome: telemetry_pb2.Welcome) -> None: ...

    def acked(self, ack: telemetry_pb2.Ack) -> None: ...

    def ended(self, target: str, error: SessionError) -> None: ...


@dataclass
class _Session:
    target: str
    cursor: int = 0  # highest seq written on this stream
    acked: int = 0  # highest seq acknowledged on this stream
    welcomed: bool = False
    speaks_tls: bool = False  # the stream failed without TLS and the collector answered a TLS hello
    max_message_bytes: int = 0
    in_flight: OrderedDict[int, tuple[int, int]] = field(default_factory=OrderedDict)  # seq -> (samples, bytes)
    in_flight_bytes: int = 0
    window: asyncio.Event = field(default_factory=asyncio.Event)


_DNS_FAILURES = ("DNS resolution failed", "Domain name not found", "hostname lookup error", "Name or service not known")


def is_dns_failure(text: str) -> bool:
    """gRPC's text for a host name that does not resolve (c-ares and the native resolver word it apart)."""
    return any(marker in text for marker in _DNS_FAILURES)


async def speaks_tls(target: str, timeout_s: float = 2.0) -> bool:
    """Whether the server at ``target`` answers a TLS ClientHello with a TLS record (a handshake or an
    alert): then a plaintext stream that it closed failed for want of TLS. A plaintext gRPC server
    answers with HTTP/2 bytes or closes the connection."""
    import ssl

    host, _, port = target.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=None)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    writer: asyncio.StreamWriter | None = None
    try:
        reader, opened = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
        writer = opened
        opened.write(hello)
        await opened.drain()
        first = await asyncio.wait_for(reader.read(1), timeout_s)
    except (OSError, TimeoutError, ValueError):
        return False
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return first[:1] in (b"\x16", b"\x15")  # TLS record types: handshake, alert


class Uplink:
    def __init__(
        self,
        settings: UplinkSettings,
        spool: UplinkSpool,
        hello: Callable[[SpoolState], telemetry_pb2.Hello],
        counters: Counters,
        events: UplinkEvents | None = None,
    ) -> None:
        if not settings.targets:
            raise ValueError("no collector address")
        self.settings = settings
        self._spool = spool
        self._hello = hello
        self._counters = counters
        self._events = events
        self._new_batch = asyncio.Event()
        self._fresh: deque[Stored] = deque(maxlen=max(1, settings.max_in_flight_batches))
        self.acked_through = 0  # highest seq acknowledged (on any stream of this process)
        self.last_ack_unix_ns = 0  # when the last batch was acknowledged (the control plane's presence)
        #: how far this node's clock is ahead of the collector's, in s, from the last Welcome (None before)
        self.clock_offset_s: float | None = None
        self._deleted_through = 0  # highest seq deleted from the spool
        self._last_delete = time.monotonic()
        self._sent_through = 0  # highest seq written on the current stream (0 when there is none)
        self._spool_changed = asyncio.Event()
        self._wake = asyncio.Event()
        self.state_changed = asyncio.Event()  # set when a stream is welcomed or ends (for STATUS=)
        self._stopping = False
        self._call: Any = None
        self._task: asyncio.Task[None] | None = None
        self.sessions = 0  # streams opened
        self.target_index = first_choice(settings.agent_id, len(settings.targets)) if settings.agent_id else 0
        self.connected_to: str | None = None
        self._last_failure: tuple[str, Any, str] | None = None
        self._last_failure_logged = 0.0
        self._repeats = 0
        self._speaks_tls: dict[str, tuple[bool, float]] = {}  # per address: answered a TLS hello, when asked
        if settings.token and settings.tls is None:
            log.warning("the bearer token is sent without TLS: anyone on the path can read it (use --tls-ca)")

    # ------------------------------------------------------------------ control

    def notify(self, stored: Stored | None = None, dropped: bool = False) -> None:
        """A batch entered the spool (handed over, so the sender need not read it back).

        ``dropped``: the spool's cap dropped older batches to make room; the batches held here may
        be among them, so they are forgotten (the sender reads what is left from the spool).
        """
        if dropped:
            self._fresh.clear()
        if stored is not None:
            self._fresh.append(stored)
        self._new_batch.set()

    def protected(self) -> tuple[int, int]:
        """(acknowledged through, sent through): what the spool's cap must treat specially."""
        return self.acked_through, self._sent_through

    def _unacked(self, state: SpoolState) -> SpoolState:
        """The spool's state less what is acknowledged but not yet deleted."""
        if state.newest_seq <= self.acked_through:
            return SpoolState(state.spool_id, 0, 0, 0, 0, state.bytes, state.last_seq)
        if state.oldest_seq > self.acked_through:
            return state
        return SpoolState(
            state.spool_id,
            self.acked_through + 1,
            state.newest_seq,
            state.newest_seq - self.acked_through,  # at most (cap drops leave gaps); only tested against 0
            state.samples,
            state.bytes,
            state.last_seq,
        )

    async def _delete_acked(self, force: bool = False) -> None:
        pending = self.acked_through - self._deleted_through
        if pending <= 0:
            return
        if force or pending >= DELETE_EVERY_BATCHES or time.monotonic() - self._last_delete >= DELETE_EVERY_S:
            through = self.acked_through
            try:
                await self._spool.delete_through(through)
            except sqlite3.Error as e:
                # a full disk can refuse even a delete: the rows stay acknowledged here (never sent
                # again) and are the first the spool drops for room; the next ack tries again
                self._last_delete = time.monotonic()
                log.warning("could not delete acknowledged batches from the spool (%s); trying again later", e)
                return
            self._deleted_through = through
            self._last_delete = time.monotonic()
            self._counters.set(spool_bytes=self._spool.bytes, spool_batches=self._spool.batches)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="gpuprobe-uplink")

    async def drain(self, timeout_s: float) -> bool:
        """Keep delivering until the spool is empty (True) or ``timeout_s`` passed (False)."""
        self._wake.set()  # cut a reconnect pause short: one more try within the grace period
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            self._spool_changed.clear()
            if self._unacked(await self._spool.state()).batches == 0:
                return True
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._spool_changed.wait(), remaining)

    async def stop(self, timeout_s: float = 2.0) -> None:
        """Half-close the stream (what is unacknowledged stays spooled) and stop reconnecting."""
        self._stopping = True
        self._new_batch.set()
        self._wake.set()
        call = self._call
        if call is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(call.done_writing(), timeout_s)
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            except Exception:
                pass
        await self._delete_acked(force=True)

    # ------------------------------------------------------------------ the reconnect loop

    async def run(self) -> None:
        """Opens one session after another until :meth:`stop` (:meth:`start` runs this in a task)."""
        targets = self.settings.targets
        failures_in_round = 0
        backoff = Backoff(self.settings.reconnect_min_s, self.settings.reconnect_max_s)
        while not self._stopping:
            target = targets[self.target_index % len(targets)]
            if self.sessions:
                self._counters.add(reconnects=1)
            self.sessions += 1
            session = _Session(target)
            error: SessionError | None = None
            try:
                await self._session(session)
            except SessionError as e:
                error = e
            except Exception as e:  # never let the uplink die: log and reconnect
                log.exception("stream to %s failed unexpectedly", target)
                error = SessionError(str(e))
            finally:
                self._call = None
                self._sent_through = 0
                if self.connected_to is not None:
                    self.connected_to = None
                    self.state_changed.set()
                self._counters.set(connected=0)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # gRPC can answer the cancel of a task awaiting a call with an error of its own (or none):
                # the loop ends as asked instead of reconnecting with the cancel lost
                raise asyncio.CancelledError
            if self._stopping:
                break
            if error is not None and self._may_be_plaintext_against_tls(session, error):
                # a TLS server closes a plaintext HTTP/2 connection with no word, so the log could only say
                # "Socket closed": ask it once a minute per address, not at every reconnect
                answer, asked_at = self._speaks_tls.get(target, (False, -math.inf))
                if time.monotonic() - asked_at >= 60.0:
                    answer = await speaks_tls(target)
                    self._speaks_tls[target] = (answer, time.monotonic())
                session.speaks_tls = answer
            if session.welcomed:
                failures_in_round = 0
                backoff.reset()
            state = self._unacked(await self._spool.state())
            failures_in_round += 1
            self.target_index += 1
            if error is not None and error.code in AUTH_CODES + REFUSED_CODES:
                delay = self.settings.auth_retry_s
            elif failures_in_round < len(targets):
                delay = 0.05  # the next address at once
            else:
                failures_in_round = 0
                delay = backoff.next_delay_s()
            if error is not None and self._events is not None:
                self._events.ended(target, error)
            self._log_end(session, error, delay, state)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    def _log_end(self, session: _Session, error: SessionError | None, delay: float, state: SpoolState) -> None:
        # the same failure again (a collector that stays down): one line a minute, not one per attempt
        key = (session.target, error.code if error else None, str(error) if error else "")
        now = time.monotonic()
        if session.welcomed or key != self._last_failure or now - self._last_failure_logged >= 60.0:
            repeats = f" (failed {self._repeats + 1} times)" if self._repeats and key == self._last_failure else ""
            self._last_failure, self._last_failure_logged, self._repeats = key, now, 0
            self._log_failure(session, error, delay, state, repeats)
        else:
            self._repeats += 1

    def _log_failure(
        self, session: _Session, error: SessionError | None, delay: float, state: SpoolState, repeats: str
    ) -> None:
        spooled = f"{state.batches} batches ({state.samples} samples) stay spooled{repeats}"
        if error is None:
            log.warning("collector %s ended the stream; %s; reconnecting in %.1f s", session.target, spooled, delay)
            return
        if error.code in AUTH_CODES + REFUSED_CODES:
            log.error(
                "collector %s refused the agent%s (%s: %s): %s; %s; retrying in %g s",
                session.target,
                "'s credentials" if error.code in AUTH_CODES else "",
                error.code.name if error.code else "",
                error,
                "check the token (--token / --token-file) and the client certificate (--tls-cert / --tls-key)"
                if error.code in AUTH_CODES
                else "it will refuse it again until the agent's configuration (identity labels: --host,"
                " --agent-id, --cluster, ...) or the agent's version changes",
                spooled,
                delay,
            )
            return
        text = str(error)
        if is_dns_failure(text):
            # before the TLS checks: gRPC reports a failed lookup as UNAVAILABLE like a closed handshake
            host = session.target.rpartition(":")[0].strip("[]")
            log.error(
                "cannot resolve the collector's host name %s (DNS: %s): check the name in --collector and this"
                " node's resolver (resolvectl query %s); %s; retrying in %.1f s",
                host,
                text,
                host,
                spooled,
                delay,
            )
            return
        if session.speaks_tls:
            log.error(
                "collector %s speaks TLS but the agent connects without it (%s): give --tls-ca FILE (the CA"
                " that signed the collector's certificate; --tls for the system's roots) and, for mutual TLS,"
                " --tls-cert and --tls-key; %s; retrying in %.1f s",
                session.target,
                text,
                spooled,
                delay,
            )
            return
        if any(k in text for k in ("SSL", "ssl", "handshake", "certificate", "CERTIFICATE", "TLS")):
            log.error(
                "TLS with collector %s failed (%s): its certificate does not match --tls-ca / --tls-server-name,"
                " or it refused the client certificate (--tls-cert / --tls-key); %s; retrying in %.1f s",
                session.target,
                text,
                spooled,
                delay,
            )
            return
        if (
            self.settings.tls is not None
            and not session.welcomed
            and error.code == grpc.StatusCode.UNAVAILABLE
            and "refused" not in text
        ):
            # a server that refuses the client certificate just closes the connection during the handshake
            log.error(
                "TLS with collector %s failed (%s): the connection closed during the TLS handshake, which usually"
                " means the collector refused the client certificate (--tls-cert / --tls-key, signed by the CA it"
                " trusts) or expects another TLS set-up; %s; retrying in %.1f s",
                session.target,
                text,
                spooled,
                delay,
            )
            return
        code = f"{error.code.name}: " if error.code else ""
        log.warning(
            "stream to collector %s ended (%s%s); %s; reconnecting in %.1f s",
            session.target,
            code,
            text,
            spooled,
            delay,
        )

    def _may_be_plaintext_against_tls(self, session: _Session, error: SessionError) -> bool:
        return (
            self.settings.tls is None
            and not session.welcomed
            and error.code == grpc.StatusCode.UNAVAILABLE
            and "refused" not in str(error)
            and not is_dns_failure(str(error))
        )

    # ------------------------------------------------------------------ one session

    def _channel(self, target: str) -> grpc.aio.Channel:
        s = self.settings
        options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", int(s.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_receive_message_length", 4 * MiB),
            ("grpc.max_send_message_length", 64 * MiB),
            ("grpc.enable_retries", 0),
        ]
        if s.tls is None:
            return grpc.aio.insecure_channel(target, options=options)
        try:
            root = s.tls.ca_path.read_bytes() if s.tls.ca_path else None
            cert = s.tls.cert_path.read_bytes() if s.tls.cert_path else None
            key = s.tls.key_path.read_bytes() if s.tls.key_path else None
        except OSError as e:
            raise SessionError(f"cannot read a TLS file: {e}") from None
        if s.tls.server_name:
            options.append(("grpc.ssl_target_name_override", s.tls.server_name))
        credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)
        return grpc.aio.secure_channel(target, credentials, options=options)

    async def _session(self, session: _Session) -> None:
        channel = self._channel(session.target)
        try:
            metadata = (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else None
            stream = channel.stream_stream(
                METHOD, request_serializer=_identity, response_deserializer=telemetry_pb2.StreamResponse.FromString
            )
            # the Hello is ready before the stream opens and no batch is written before the Welcome: a
            # write that races the collector's refusal loses the refusal's code in grpcio (grpc/grpc#36066:
            # the client then reports INTERNAL), and a refused agent would retry on the ordinary backoff
            # instead of --auth-retry
            hello = self._hello(self._unacked(await self._spool.state()))
            session.cursor = session.acked = self.acked_through  # acknowledged already: not sent again
            call = stream(metadata=metadata)
            self._call = call
            await self._headers(call)
            try:
                await call.write(telemetry_pb2.StreamRequest(hello=hello).SerializeToString())
            except Exception as e:
                raise await _ended(call, e) from None
            await self._receive_welcome(call, session)
            sender = asyncio.create_task(self._send(call, session))
            receiver = asyncio.create_task(self._receive(call, session))
            try:
                done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
                if receiver in done:
                    receiver.result()  # raises the session's error, if any
                    if not self._stopping:
                        raise SessionError("the collector closed the stream", grpc.StatusCode.OK)
                else:
                    sender.result()
                    # the sender returns only when stopping: wait for the collector to finish acking
                    await receiver
            finally:
                for task in (sender, receiver):
                    task.cancel()
                for task in (sender, receiver):
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                call.cancel()
        finally:
            await channel.close(grace=None)

    async def _send(self, call: Any, session: _Session) -> None:
        s = self.settings
        while not self._stopping:
            while len(session.in_flight) >= s.max_in_flight_batches or session.in_flight_bytes >= s.max_in_flight_bytes:
                session.window.clear()
                await session.window.wait()
                if self._stopping:
                    return
            self._new_batch.clear()
            room = s.max_in_flight_batches - len(session.in_flight)
            fresh = self._fresh
            while fresh and fresh[0].seq <= session.cursor:
                fresh.popleft()  # sent already (read back from the spool)
            if fresh and fresh[0].seq == session.cursor + 1:
                stored = [fresh.popleft() for _ in range(min(room, len(fresh)))]
            else:
                stored = await self._spool.read_after(session.cursor, room)
            if not stored:
                await self._new_batch.wait()
                continue
            for item in stored:
                if self._stopping:
                    return
                request = batch_request(item.payload)
                if session.max_message_bytes and len(request) > session.max_message_bytes:
                    raise SessionError(
                        f"batch {item.seq} is {len(request)} bytes, more than the collector accepts"
                        f" ({session.max_message_bytes}); trying another collector"
                    )
                # in flight *before* the write: a fast collector's ack can be read while the write is
                # still awaited, and an ack beyond the cursor would be ignored (and never repeated)
                session.cursor = self._sent_through = item.seq
                session.in_flight[item.seq] = (item.samples, len(item.payload))
                session.in_flight_bytes += len(item.payload)
                try:
                    await call.write(request)
                except Exception as e:
                    raise await _ended(call, e) from None
                self._counters.add(batches_sent=1, samples_sent=item.samples)

    async def _headers(self, call: Any) -> None:
        """Waits for the collector's response headers, which it sends once it has checked the credentials,
        before the Hello is written: a refusal then ends a stream the agent has not written to, and keeps
        its code. A server that sends no headers before the Hello gets it after ``HEADERS_WAIT_S``."""
        headers = asyncio.ensure_future(call.initial_metadata())
        headers.add_done_callback(_ignore_outcome)
        try:
            metadata = await asyncio.wait_for(asyncio.shield(headers), HEADERS_WAIT_S)
        except TimeoutError:
            return
        except Exception as e:
            raise await _ended(call, e) from None
        name, value = STREAM_ACCEPTED_HEADER
        if metadata is not None and metadata.get(name) == value:
            return
        # no acceptance: the headers of a refusal (its status follows at once) or of another server
        status = asyncio.ensure_future(call.code())
        status.add_done_callback(_ignore_outcome)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(status), STATUS_WAIT_S)
        if call.done():
            code = await call.code()
            raise SessionError(await call.details() or code.name, code)

    async def _receive_welcome(self, call: Any, session: _Session) -> None:
        try:
            response = await asyncio.wait_for(call.read(), self.settings.welcome_timeout_s)
        except TimeoutError:
            raise SessionError(f"no Welcome within {self.settings.welcome_timeout_s:g} s") from None
        except Exception as e:
            raise await _ended(call, e) from None
        if response is grpc.aio.EOF:
            code = await call.code()
            raise SessionError(await call.details() or "the collector ended the stream before its Welcome", code)
        if response.WhichOneof("kind") != "welcome":
            raise SessionError(f"the collector answered the Hello with {response.WhichOneof('kind')}, not a Welcome")
        self._welcomed(session, response.welcome)

    async def _receive(self, call: Any, session: _Session) -> None:
        while True:
            try:
                response = await call.read()
            except Exception as e:
                raise await _ended(call, e) from None
            if response is grpc.aio.EOF:
                code = await call.code()
                if code != grpc.StatusCode.OK:
                    raise SessionError(await call.details() or code.name, code)
                return
            if response.WhichOneof("kind") == "ack":
                await self._acked(session, response.ack)
                if self._events is not None:
                    self._events.acked(response.ack)

    def _welcomed(self, session: _Session, welcome: telemetry_pb2.Welcome) -> None:
        session.welcomed = True
        session.max_message_bytes = int(welcome.max_message_bytes)
        if self._events is not None:
            self._events.welcomed(session.target, welcome)
        self.connected_to = session.target
        self.state_changed.set()
        self._counters.set(connected=1)
        skew_s = (time.time_ns() - welcome.time_unix_ns) / 1e9 if welcome.time_unix_ns else 0.0
        if welcome.time_unix_ns:
            self.clock_offset_s = skew_s
            self._counters.set(clock_offset_ms=round(skew_s * 1000))
        log.info(
            "streaming to collector %s (%s %s)%s",
            session.target,
            welcome.collector_id or "unnamed",
            welcome.collector_version,
            f"; clock skew {skew_s:+.1f} s" if abs(skew_s) > 1.0 else "",
        )

    async def _acked(self, session: _Session, ack: telemetry_pb2.Ack) -> None:
        for rejection in ack.rejections:
            self._counters.add(samples_rejected=rejection.rejected_samples)
            log.warning(
                "collector %s refused %d samples of batch %d (%s): %s",
                session.target,
                rejection.rejected_samples,
                rejection.seq,
                telemetry_pb2.RejectReason.Name(rejection.reason),
                rejection.message,
            )
        durable = int(ack.durable_seq)
        if durable > session.cursor:
            log.warning(
                "collector %s acknowledged seq %d, beyond the last batch sent (%d); ignoring the excess",
                session.target,
                durable,
                session.cursor,
            )
            durable = session.cursor
        if durable <= session.acked:
            return
        session.acked = durable
        acked_batches = acked_samples = 0
        while session.in_flight:
            seq = next(iter(session.in_flight))
            if seq > durable:
                break
            samples, size = session.in_flight.pop(seq)
            session.in_flight_bytes -= size
            acked_batches += 1
            acked_samples += samples
        session.window.set()
        self.acked_through = max(self.acked_through, durable)
        self.last_ack_unix_ns = time.time_ns()
        self._counters.add(batches_acked=acked_batches, samples_acked=acked_samples)
        self._counters.set(acked_seq=durable)
        await self._delete_acked()
        self._spool_changed.set()


async def _ended(call: Any, error: BaseException) -> SessionError:
    """The session's error: the RPC's status where it has one (a write after the end raises without it)."""
    if isinstance(error, grpc.aio.AioRpcError):
        if error.code() == grpc.StatusCode.INTERNAL and error.details() == WRITE_RACED_END:
            return SessionError(
                "the collector ended the stream while a batch was being written (its reason is lost: gRPC"
                f" reports INTERNAL: {WRITE_RACED_END})"
            )
        return SessionError(error.details() or error.code().name, error.code())
    with contextlib.suppress(Exception):
        if call.done():
            code = await call.code()
            details = await call.details()
            return SessionError(details or code.name, code)
    return SessionError(f"{type(error).__name__}: {error}")


def _ignore_outcome(future: asyncio.Future[Any]) -> None:
    """The response headers' outcome is the call's, read from the call itself."""
    if not future.cancelled():
        future.exception()
