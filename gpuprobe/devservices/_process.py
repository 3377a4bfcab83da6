"""Part: devservices. One server process: find its binary, start it on free ports, wait until it is ready, stop or kill
it."""

from __future__ import annotations

import abc
import os
import shutil
import signal
import subprocess
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from gpuprobe.devservices.errors import BinaryNotFoundError, DevServiceError, StartError
from gpuprobe.devservices.ports import is_address_in_use

# /usr/sbin is not on the PATH of every user, and Debian puts mosquitto there.
_FALLBACK_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
_LOG_TAIL_LINES = 25
# Starts tried when a port is taken: on fresh ports if they were chosen automatically and the server never
# started; on the same port otherwise (only in case whoever held it lets go at once).
_START_ATTEMPTS_NEW_PORTS = 4
_START_ATTEMPTS_SAME_PORTS = 2
_POLL_INTERVAL_S = 0.02


def resolve_binary(binary: str | os.PathLike[str], *, package: str, what: str) -> Path:
    """Return the absolute path of ``binary``, or raise :class:`BinaryNotFoundError` saying how to install it.

    A bare name is looked up on the PATH and then in the usual system directories; anything with a
    slash in it is taken as a path.
    """
    name = os.fspath(binary)
    hint = f"install it with `apt-get install {package}` (`make test` installs it)"
    if os.sep in name:
        path = Path(name)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise BinaryNotFoundError(f"{what} executable {name!r} does not exist or is not executable; {hint}")
    found = shutil.which(name)
    if found is None:
        for directory in _FALLBACK_DIRS:
            found = shutil.which(name, path=directory)
            if found is not None:
                break
    if found is None:
        raise BinaryNotFoundError(
            f"{what} executable {name!r} not found on PATH or in {', '.join(_FALLBACK_DIRS)}; {hint}"
        )
    return Path(found)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill a server still running when its owner is garbage-collected or the interpreter exits."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class ServerProcess(abc.ABC):
    """A server binary run in the foreground with a generated config, its output appended to a log file.

    Subclasses say how to write the config, how to pick fresh ports, and how to tell that the server is
    ready. Ports chosen automatically are replaced if the first start finds them taken; after one
    successful start they are fixed, so :meth:`start` after :meth:`stop` or :meth:`kill` comes back on
    the same ports with the same data directory.
    """

    #: Shown in messages, e.g. ``"influxd"``.
    display_name: ClassVar[str]
    #: The Debian package that installs the binary.
    package: ClassVar[str]

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        binary: str | os.PathLike[str],
        log_name: str,
        auto_ports: bool,
        start_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        self._base_dir = Path(base_dir).absolute()
        self._binary = binary
        self._log_path = self._base_dir / log_name
        self._ports_fixed = not auto_ports
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._returncode: int | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], ServerProcess] | None = None

    # --- what a subclass provides -------------------------------------------------------------------

    @abc.abstractmethod
    def _choose_new_ports(self) -> None:
        """Replace the automatically chosen ports after a start found one of them taken."""

    @abc.abstractmethod
    def _prepare(self) -> list[str]:
        """Write the config (and whatever else the server reads); return the arguments after the binary."""

    @abc.abstractmethod
    def _is_ready(self) -> bool:
        """One quick check whether the started server serves requests."""

    def _environment(self) -> dict[str, str]:
        return dict(os.environ)

    # --- public ------------------------------------------------------------------------------------

    @property
    def base_dir(self) -> Path:
        """The directory that holds this server's config, log and data."""
        return self._base_dir

    @property
    def log_path(self) -> Path:
        """The file that the server's stdout and stderr are appended to, across restarts."""
        return self._log_path

    @property
    def running(self) -> bool:
        """Whether the server process is alive (it may still be starting)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id of the running server, or None."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """How the last process ended, as :attr:`subprocess.Popen.returncode` (``-9`` after :meth:`kill`);
        None while it runs or before the first start."""
        if self._proc is not None:
            return self._proc.poll()
        return self._returncode

    def start(self) -> Self:
        """Start the server and wait until it is ready; do nothing if it is already running.

        Raises :class:`BinaryNotFoundError` if the binary is missing and :class:`StartError` (with the
        tail of the log) if the server exits during start or is not ready within ``start_timeout_s``.
        """
        if self.running:
            return self
        if self._proc is not None:  # it died by itself: forget it
            self._forget()
        binary = resolve_binary(self._binary, package=self.package, what=self.display_name)
        self._base_dir.mkdir(parents=True, exist_ok=True)
        last_error: StartError | None = None
        attempts = _START_ATTEMPTS_SAME_PORTS if self._ports_fixed else _START_ATTEMPTS_NEW_PORTS
        for attempt in range(attempts):
            if attempt > 0:
                if self._ports_fixed:
                    time.sleep(0.25)
                else:
                    self._choose_new_ports()
            try:
                self._start_once(binary)
            except _AddressInUse as exc:
                last_error = exc.error
                continue
            self._ports_fixed = True
            return self
        assert last_error is not None
        raise last_error

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the server with SIGTERM, then SIGKILL if it has not exited after ``timeout_s``.

        Safe to call when the server is not running.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._forget()

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash or an outage would, and wait until it is gone."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._forget()

    def restart(self) -> Self:
        """Stop the server gracefully and start it again on the same ports."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = _LOG_TAIL_LINES, *, since: int = 0) -> str:
        """The last ``lines`` lines of the log, from byte offset ``since``."""
        try:
            with self._log_path.open("rb") as log:
                log.seek(since)
                data = log.read()
        except FileNotFoundError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- internals ---------------------------------------------------------------------------------

    def _start_once(self, binary: Path) -> None:
        args = [os.fspath(binary), *self._prepare()]
        log_offset = self._log_path.stat().st_size if self._log_path.exists() else 0
        with self._log_path.open("ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._base_dir,
                env=self._environment(),
                # Not in the caller's process group: a Ctrl-C reaches the caller, whose cleanup stops us.
                start_new_session=True,
            )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _reap, proc)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            code = proc.poll()
            if code is not None:
                self._forget()
                tail = self.log_tail(since=log_offset)
                error = StartError(
                    f"{self.display_name} exited with code {code} while starting ({' '.join(args)}); "
                    f"last lines of {self._log_path}:\n{tail}",
                    log_tail=tail,
                )
                if is_address_in_use(tail):
                    raise _AddressInUse(error)
                raise error
            if self._is_ready() and proc.poll() is None:
                return
            if time.monotonic() >= deadline:
                self.kill()
                tail = self.log_tail(since=log_offset)
                raise StartError(
                    f"{self.display_name} was not ready within {self.start_timeout_s:g} s "
                    f"({' '.join(args)}); last lines of {self._log_path}:\n{tail}",
                    log_tail=tail,
                )
            time.sleep(_POLL_INTERVAL_S)

    def _forget(self) -> None:
        if self._proc is not None:
            self._returncode = self._proc.poll()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = None
        self._proc = None


class _AddressInUse(DevServiceError):
    def __init__(self, error: StartError) -> None:
        super().__init__(str(error))
        self.error = error
