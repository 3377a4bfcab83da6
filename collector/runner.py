"""Part: collector. Running the collector: one process (:class:`Collector`), or ``--workers N`` processes on one port.

With ``--workers N`` the main process forks N workers *before* anything of gRPC exists (gRPC
cannot survive a fork); each binds the same port with ``SO_REUSEPORT`` (the kernel spreads agent
connections over them), has its own WAL file ``collector-<i>.sqlite``, its own sink and, with
``--metrics-listen HOST:PORT``, serves its metrics on ``PORT + i``. The main process tells
systemd READY when every worker is serving, pings the watchdog while they all live, forwards
SIGTERM, and exits non-zero when a worker dies (systemd restarts the service; a worker's WAL
survives). Workers die with the main process (``PR_SET_PDEATHSIG``).

SIGTERM drains a collector (:meth:`Collector.drain`), all within ``--drain-timeout``: it refuses new
streams, acks what is durable (``--ack-after sink``: what InfluxDB has) and ends the streams with
UNAVAILABLE (agents move to another collector), then keeps the sink writing until the WAL is empty.
Exit status 0 when nothing acknowledged is left in the WAL; :data:`EXIT_WAL_LEFT` (75, EX_TEMPFAIL)
when InfluxDB did not take it all in time, after a log line that says what was left, and where.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import time
from pathlib import Path

import grpc

from gpuprobe.collector.auth import Authenticator, TokenStore, server_credentials
from gpuprobe.collector.backends import Backend, make_backend
from gpuprobe.collector.metrics import Metrics
from gpuprobe.collector.routing import events_backends, make_destinations
from gpuprobe.collector.server import TelemetryService, server_options
from gpuprobe.collector.settings import CollectorSettings, InfluxRoute, parse_address
from gpuprobe.collector.sink import Sink
from gpuprobe.collector.wal import WriteAheadLog, merge_orphans, wal_path
from gpuprobe.systemd import Notifier, watchdog_interval_s

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 120.0
_EVENTS_PROBE_TIMEOUT_S = 5.0
#: The exit status of a drain that left acknowledged lines in the WAL (EX_TEMPFAIL).
EXIT_WAL_LEFT = 75
#: A drain ends early once InfluxDB could not be connected to for this long within it: a server
#: that is down (connection refused) for the whole drain does not come back for the deadline.
DRAIN_UNREACHABLE_GRACE_S = 2.0


class Collector:
    """One collector process's parts, started and stopped together (also used in-process by tests)."""

    def __init__(self, config: CollectorSettings, *, worker: int = 0, backend: Backend | None = None) -> None:
        config.check()
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
        self.config = config
        self.worker = worker
        self.metrics = Metrics()
        self.metrics.info.labels(config.collector_id, _version()).set(1)
        self.wal = WriteAheadLog(
            wal_path(config.wal_dir, worker),
            max_bytes=config.wal_max_bytes,
            quarantine_max_lines=config.quarantine_max_lines,
        )
        self.wal.on_commit_seconds = self.metrics.wal_commit_seconds.observe
        wal = self.wal
        self.metrics.watch_wal(
            lambda: wal.depth_lines,
            lambda: wal.depth_bytes,
            lambda: wal.depth_rows,
            lambda: 1.0 if wal.healthy else 0.0,
            lambda: wal.failed_commits,
        )
        # set when the WAL's state changes (failing, writable again, failed for good)
        self.wal_state_changed = asyncio.Event()
        wal.on_state_change = self.wal_state_changed.set
        self._backend = backend
        self.sink: Sink | None = None
        self.service: TelemetryService | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        config = self.config
        tokens = TokenStore(config.tokens_file) if config.tokens_file is not None else None
        authenticator = Authenticator(tokens, mtls=config.mtls, bind_certificate=config.tls_bind_agent_id)
        self.wal.start()
        destinations = make_destinations(config)
        events = await events_backends(config) if self._backend is None else {}
        self.sink = Sink(
            self.wal, self._backend or make_backend(config), self.metrics, config.sink, destinations, events
        )
        await self.sink.start()
        self.service = TelemetryService(config, self.wal, self.metrics, authenticator, self.sink)
        self.server = grpc.aio.server(handlers=[self.service.handler()], options=server_options(config))
        host, port = parse_address(config.listen, "--listen")
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if config.tls:
            assert config.tls_cert is not None and config.tls_key is not None
            credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
            self.port = self.server.add_secure_port(address, credentials)
        else:
            log.warning(
                "serving agents over PLAINTEXT without authentication checks beyond what is configured "
                "(--insecure): anyone who can reach %s can send data; use TLS and tokens in production",
                config.listen,
            )
            self.port = self.server.add_insecure_port(address)
        if not self.port:
            raise OSError(f"cannot listen on {config.listen}")
        if config.metrics_listen:
            # before the gRPC server starts: a worker whose metrics port is taken must fail before it
            # accepts a stream (started, its SO_REUSEPORT socket would take streams that nobody serves)
            metrics_host, metrics_port = parse_address(config.metrics_listen, "--metrics-listen")
            self.metrics.serve(metrics_host, metrics_port + self.worker if metrics_port else 0)
        await self.server.start()
        for route in config.routes:
            log.info("lines of cluster %r go to %s (--influx-route)", route.cluster, _route_target(route))
        log.info(
            "collector %s worker %d serving on port %d (%s, %s); WAL %s with %d lines queued; InfluxDB %s (%s API);"
            " batches acked once %s",
            config.collector_id,
            self.worker,
            self.port,
            "mutual TLS" if config.mtls else "TLS" if config.tls else "plaintext",
            "tokens" if tokens is not None else "no tokens",
            self.wal.path,
            self.wal.depth_lines,
            config.influx.url,
            config.influx.api,
            "InfluxDB has them (--ack-after sink)" if config.ack_after == "sink" else "durable in the WAL",
        )

    async def drain(self) -> int:
        """SIGTERM: refuse new streams, ack what is durable (``sink``: what InfluxDB has) and end the
        streams, then write the WAL into InfluxDB, all within ``drain_timeout_s``; then :meth:`stop`.
        Returns the exit status: 0, or :data:`EXIT_WAL_LEFT` when acknowledged lines stay in the WAL
        (logged with their number, size and the WAL's path)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.config.drain_timeout_s
        queued_at_start = self.wal.depth_lines
        if self.service is not None:
            self.service.shutdown()
        if self.server is not None:
            await self.server.stop(max(0.0, min(self.config.shutdown_grace_s, deadline - loop.time())))
            self.server = None
        streams_ended = loop.time() - started
        if self.sink is not None:
            self.sink.hurry()
        hurried_at = time.monotonic()
        hopeless: str | None = None
        while self.wal.depth_rows > 0 and self.sink is not None and loop.time() < deadline:
            # a refusal that retrying cannot fix, or an InfluxDB that stays unreachable, would only
            # hold the WAL's lock until the deadline, and keep the corrected collector from starting
            hopeless = self.sink.hopeless(hurried_at, DRAIN_UNREACHABLE_GRACE_S)
            if hopeless is not None:
                break
            await asyncio.sleep(0.05)
        rows, lines, nbytes = self.wal.pending_summary()
        if self.config.ack_after == "sink":
            # only rows from an earlier run can have been acked; this run's rows were acked once written
            _, acked_lines, acked_bytes = self.wal.pending_summary(self.wal.inherited_through)
        else:
            acked_lines, acked_bytes = lines, nbytes
        elapsed = loop.time() - started
        if not lines:
            log.info(
                "drained in %.2f s (streams ended after %.2f s): the WAL is empty, %d queued lines written"
                " into InfluxDB",
                elapsed,
                streams_ended,
                queued_at_start,
            )
        elif acked_lines:
            log.error(
                "drain %s after %.2f s (%s): %d acknowledged lines (%d bytes"
                " compressed, %d rows) are left in the WAL %s%s. Nobody else has them: start a collector on this"
                " WAL (gpuprobe collector --wal %s) to write them into InfluxDB",
                "ended" if hopeless else "timed out",
                elapsed,
                self._why_left(hopeless),
                acked_lines,
                acked_bytes,
                rows,
                self.wal.path,
                f" ({lines - acked_lines} more lines were never acknowledged: the agents still have them)"
                if lines > acked_lines
                else "",
                self.wal.path.parent,
            )
        else:
            log.warning(
                "drain %s after %.2f s (%s): %d lines (%d bytes compressed,"
                " %d rows) are left in the WAL %s; none was acknowledged (--ack-after sink): the agents still"
                " have them and send them to another collector",
                "ended" if hopeless else "timed out",
                elapsed,
                self._why_left(hopeless),
                lines,
                nbytes,
                rows,
                self.wal.path,
            )
        await self.stop()
        return EXIT_WAL_LEFT if acked_lines else 0

    def _why_left(self, hopeless: str | None) -> str:
        if hopeless is not None:
            return f"{hopeless}: retrying until --drain-timeout would not help"
        up = "up" if self.sink is not None and self.sink.up else "DOWN"
        return f"--drain-timeout {self.config.drain_timeout_s:g} s; InfluxDB {up}"

    async def stop(self) -> None:
        """Ends the streams (UNAVAILABLE after acking what is durable), then stops sending and closes
        the WAL. What InfluxDB has not confirmed stays in the WAL for the next start."""
        if self.service is not None:
            self.service.shutdown()
        if self.server is not None:
            await self.server.stop(self.config.shutdown_grace_s)
            self.server = None
        if self.sink is not None:
            await self.sink.stop()
            self.sink = None
        self.metrics.close()
        await asyncio.to_thread(self.wal.close)


def _route_target(route: InfluxRoute) -> str:
    return f"{route.url}, database or bucket {route.database}" if route.database else route.url


def _version() -> str:
    from gpuprobe import __version__

    return __version__


async def _serve(config: CollectorSettings, worker: int, notifier: Notifier | None, ready_fd: int | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    with contextlib.suppress(ValueError, OSError):
        loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP: the tokens file is re-read when it changes"))
    collector = Collector(config, worker=worker)
    try:
        await collector.start()
    except BaseException:
        await collector.stop()
        raise
    if notifier is not None:
        notifier.ready(f"serving on port {collector.port}")
    if ready_fd is not None:
        os.write(ready_fd, b"R")
        os.close(ready_fd)
    watchdog = asyncio.create_task(_watchdog(notifier, collector)) if notifier is not None else None
    fatal = asyncio.create_task(_wal_failed_for_good(collector))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({stopped, fatal}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    code = 0
    if fatal.done():
        code = 1
        log.critical(
            "exiting with status 1 so that systemd restarts the collector: %s (the batches it acked are in"
            " the WAL file, if it can be read; the rest are still in the agents' spools)",
            collector.wal.fatal,
        )
    else:
        fatal.cancel()
        log.info(
            "stopping: ending agent streams, then writing the WAL's %d queued lines into InfluxDB"
            " (--drain-timeout %g s in all)",
            collector.wal.depth_lines,
            config.drain_timeout_s,
        )
    if notifier is not None:
        notifier.stopping()
    if watchdog is not None:
        watchdog.cancel()
    if code:
        await collector.stop()
    else:
        code = await collector.drain()
    return code


async def _wal_failed_for_good(collector: Collector) -> None:
    """Returns once the WAL cannot be reopened: the one WAL failure a restart may mend."""
    while collector.wal.fatal is None:
        collector.wal_state_changed.clear()
        await collector.wal_state_changed.wait()


def status_line(collector: Collector) -> str:
    """``systemctl status``'s STATUS= line: what an operator checks first."""
    wal = collector.wal
    influx = "up" if collector.sink is not None and collector.sink.up else "DOWN"
    return f"serving on port {collector.port}; WAL {wal.state()}, {wal.depth_lines} lines queued; InfluxDB {influx}"


async def _watchdog(notifier: Notifier, collector: Collector) -> None:
    interval = watchdog_interval_s()
    # a WAL that fails and is being retried is alive: a restart would not free the disk
    while collector.wal.alive:
        notifier.watchdog()
        notifier.status(status_line(collector))
        collector.wal_state_changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(collector.wal_state_changed.wait(), interval if interval is not None else 10.0)


def run(config: CollectorSettings) -> int:
    """``gpuprobe collector``: serve until SIGTERM or SIGINT; returns the exit code."""
    config.check()
    if config.workers == 1:
        return asyncio.run(_serve(config, 0, Notifier(), None))
    return _run_workers(config)


def _run_workers(config: CollectorSettings) -> int:
    merge_orphans(Path(config.wal_dir), config.workers)
    notifier = Notifier()
    children: dict[int, int] = {}  # pid -> worker
    ready_pipes: list[int] = []
    for worker in range(config.workers):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(read_fd)
            code = 1
            try:
                _die_with_parent()
                code = asyncio.run(_serve(config, worker, None, write_fd))
            except BaseException:
                log.exception("collector worker %d failed", worker)
            finally:
                logging.shutdown()
                os._exit(code)
        os.close(write_fd)
        children[pid] = worker
        ready_pipes.append(read_fd)

    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if not _wait_ready(ready_pipes, children):
        forward(signal.SIGTERM, None)
        _reap_all(children)
        return 1
    notifier.ready(f"{config.workers} workers serving on {config.listen}")
    interval = watchdog_interval_s() or 10.0
    code = 0
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            notifier.watchdog()
            time.sleep(min(interval, 1.0))
            continue
        worker = children.pop(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        if not stopping:
            log.error("collector worker %d exited with %d; stopping the others", worker, exit_code)
            code = 1
            forward(signal.SIGTERM, None)
        elif exit_code and not code:
            code = EXIT_WAL_LEFT if exit_code == EXIT_WAL_LEFT else 1  # a drain that left lines in its WAL
    notifier.stopping()
    return code


def _wait_ready(pipes: list[int], children: dict[int, int]) -> bool:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    waiting = set(pipes)
    while waiting and time.monotonic() < deadline:
        readable, _, _ = select.select(list(waiting), [], [], 0.5)
        for fd in readable:
            data = os.read(fd, 1)
            os.close(fd)
            waiting.discard(fd)
            if data != b"R":
                log.error("a collector worker failed to start")
                return False
    if waiting:
        log.error("collector workers did not start within %.0f s", _READY_TIMEOUT_S)
        return False
    return True


def _reap_all(children: dict[int, int]) -> None:
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        children.pop(pid, None)


def _die_with_parent() -> None:
    """The kernel sends SIGTERM to this worker when the main process dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
