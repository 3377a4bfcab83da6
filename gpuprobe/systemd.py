"""Part: core. systemd integration shared by the agent and the collector: hardened units and ``sd_notify``.

``render_unit`` writes the unit text for ``gpuprobe install agent|collector``; ``Notifier`` speaks the
notify protocol (READY=1, WATCHDOG=1, STATUS=..., STOPPING=1) over the datagram socket that systemd
names in ``NOTIFY_SOCKET``. Without that variable (not started by systemd) every call is a no-op.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprobe.config import Option


@dataclass(frozen=True)
class UnitSpec:
    """What differs between gpuprobe's services; everything else is the same hardening."""

    description: str
    exec_start: Sequence[str]  # absolute program path first
    user: str = "gpuprobe"
    state_directory: str = "gpuprobe"  # /var/lib/<this>, owned by the service user
    watchdog_s: int = 30
    after: Sequence[str] = ("network-online.target",)  # wanted and waited for
    after_only: Sequence[str] = ()  # waited for when they run (After=), never started by this unit
    environment: dict[str, str] = field(default_factory=dict)
    supplementary_groups: Sequence[str] = ()
    device_allow: Sequence[str] = ()  # e.g. /dev/nvidiactl rw, for the agent
    timeout_stop_s: int = 30
    # the highest SCHED_FIFO priority the service may ask for without a capability (LimitRTPRIO=); 0: no
    # real-time scheduling at all (RestrictRealtime=yes)
    realtime_priority: int = 0


def render_unit(spec: UnitSpec) -> str:
    if not spec.exec_start or not spec.exec_start[0].startswith("/"):
        raise ValueError(f"ExecStart must start with an absolute path, not {spec.exec_start!r}")
    lines = [
        "[Unit]",
        f"Description={spec.description}",
        f"After={' '.join([*spec.after, *spec.after_only])}",
        f"Wants={' '.join(spec.after)}",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={shlex.join(spec.exec_start)}",
        "Restart=on-failure",
        "RestartSec=2",
        f"WatchdogSec={spec.watchdog_s}",
        f"TimeoutStopSec={spec.timeout_stop_s}",
        f"User={spec.user}",
        f"Group={spec.user}",
        "DynamicUser=no",
        f"StateDirectory={spec.state_directory}",
        "StateDirectoryMode=0750",
        "ConfigurationDirectory=gpuprobe",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        *_realtime_lines(spec.realtime_priority),
        "LockPersonality=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
    ]
    for group in spec.supplementary_groups:
        lines.append(f"SupplementaryGroups={group}")
    for device in spec.device_allow:
        lines.append(f"DeviceAllow={device}")
    for key, value in sorted(spec.environment.items()):
        lines.append(f"Environment={shlex.quote(f'{key}={value}')}")
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


class Notifier:
    """``sd_notify`` without libsystemd: one datagram per message to ``$NOTIFY_SOCKET``."""

    def __init__(self, socket_path: str | None = None) -> None:
        path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET")
        self._address: str | bytes | None = None
        if path:
            # a leading '@' names a socket in the abstract namespace
            self._address = b"\0" + path[1:].encode() if path.startswith("@") else path
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *assignments: str) -> bool:
        if self._address is None:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto("\n".join(assignments).encode(), self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """Half the watchdog timeout systemd set for this process (ping at least that often), or None."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


# A thread under SCHED_FIFO that runs this long without blocking is a bug (the agent's sampler blocks after
# every tick's ~100 us): the kernel ends the service (SIGKILL at the hard limit) and systemd restarts it
# instead of it holding a core.
REALTIME_RUN_LIMIT = "1s"


def _realtime_lines(priority: int) -> list[str]:
    if priority <= 0:
        return ["RestrictRealtime=yes"]
    return ["RestrictRealtime=no", f"LimitRTPRIO={priority}", f"LimitRTTIME={REALTIME_RUN_LIMIT}"]


def written_to_config(option: Option, note: str = "", **changes: Any) -> Option:
    """A service's own option as ``gpuprobe install`` takes it: the same flag, type and default (or
    ``changes``, where the installed service's differs), its help saying the value goes into the
    service's config file, then ``note`` (what install does with it besides)."""
    return dataclasses.replace(option, help=f"{option.help}; written to the config{note}", doc=None, **changes)


def staging_root(root: Path | None) -> Path | None:
    """``--root DIR`` as the installers use it: None for the machine itself, ``--root /`` included (a
    script that stages under ``"$ROOT/"`` runs unchanged on the host with ROOT empty)."""
    return None if root is None or root.resolve() == Path("/") else root


def staged_path(root: Path | None, absolute: str) -> Path:
    """``/etc/gpuprobe/agent.toml`` under ``--root DIR`` (or the real path when root is None)."""
    return Path(absolute) if root is None else root / absolute.lstrip("/")


def default_executable() -> Path:
    """The ``gpuprobe`` program of this installation, for ExecStart."""
    import shutil
    import sys

    script = Path(sys.executable).parent / "gpuprobe"
    if script.exists():
        return script
    found = shutil.which("gpuprobe")
    return Path(found) if found else Path("/usr/local/bin/gpuprobe")


# What each unit setting hides from the service (systemd.exec(5)): the paths it cannot see at all, so a
# program there fails with 203/EXEC. ProtectSystem= and ProtectHome=read-only only make paths read-only.
_HOME_PATHS = ("/home", "/root", "/run/user")
_TMP_PATHS = ("/tmp", "/var/tmp")


def hidden_paths(unit_text: str) -> dict[str, str]:
    """The paths the unit hides from its own process, each with the setting that hides it
    (``ProtectHome=yes``, ``PrivateTmp=yes``, ``InaccessiblePaths=``, ``TemporaryFileSystem=``)."""
    hidden: dict[str, str] = {}
    for raw in unit_text.splitlines():
        key, sep, value = raw.strip().partition("=")
        if not sep:
            continue
        value = value.strip()
        if key == "ProtectHome" and value.lower() in ("yes", "true", "1", "on", "tmpfs"):
            hidden.update({path: f"ProtectHome={value}" for path in _HOME_PATHS})
        elif key == "PrivateTmp" and value.lower() in ("yes", "true", "1", "on"):
            hidden.update({path: f"PrivateTmp={value}" for path in _TMP_PATHS})
        elif key in ("InaccessiblePaths", "TemporaryFileSystem"):
            for word in value.split():
                path = word.lstrip("-+").split(":", 1)[0]  # "-": ignore if missing; ":ro" options
                if path.startswith("/"):
                    hidden[path.rstrip("/") or "/"] = f"{key}={value}"
    return hidden


def _programs(executable: Path) -> list[Path]:
    """The executable, the file it links to, and a script's interpreter (a virtual environment's python):
    the unit needs to see each of them."""
    found = [executable]
    try:
        real = executable.resolve()
        if real != executable:
            found.append(real)
        with executable.open("rb") as f:
            first = f.readline(512)
    except OSError:
        return found
    if first.startswith(b"#!"):
        words = first[2:].decode(errors="replace").split()
        if words and words[0].startswith("/"):
            found.append(Path(words[0]))
    return found


def hidden_executable_warning(executable: Path, unit_text: str) -> str | None:
    """A warning when the unit's program (or its interpreter) lies under a path the unit hides."""
    hidden = hidden_paths(unit_text)
    for program in _programs(executable):
        for prefix, setting in sorted(hidden.items()):
            if program == Path(prefix) or Path(prefix) in program.parents:
                what = "" if program == executable else f" ({executable} runs it)"
                return (
                    f"warning: {program}{what} is under {prefix}, which the unit hides ({setting}): systemd will"
                    " fail to start it (203/EXEC); install gpuprobe elsewhere (e.g. a virtual environment in"
                    " /opt/gpuprobe) or pass --executable"
                )
    return None


def secret_files_note(files: list[tuple[str, Path, bool]], user: str) -> str:
    """The files a service reads, each with the owner and mode it needs (``secret``: only root and the
    service's group may read it), and the ones that are not there yet."""
    lines = [f"files the service reads as {user}:"]
    for option, path, secret in files:
        need = f"0640 root:{user}" if secret else "0644 (or 0640 root:" + user + ")"
        state = "" if path.exists() else "  (missing: put it there before starting the service)"
        try:
            if secret and path.stat().st_mode & 0o004:
                state = f"  (now readable by everyone: chmod 0640 {path})"
        except OSError:
            pass
        lines.append(f"  {path}  {need}  (--{option.replace('_', '-')}){state}")
    return "\n".join(lines)


def write_install_files(files: dict[Path, tuple[str, int]], force: bool, command: str) -> int:
    """Writes each file atomically with its mode; refuses to overwrite any unless ``force``.

    Returns 0, 1 (something exists and no --force: nothing written) or 2 (a write failed); the
    messages go to stdout/stderr under ``gpuprobe COMMAND``.
    """
    import sys

    existing = [p for p in files if p.exists()]
    if existing and not force:
        names = ", ".join(map(str, existing))
        print(f"gpuprobe {command}: refusing to overwrite {names} (use --force)", file=sys.stderr)
        return 1
    for path, (text, mode) in files.items():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.chmod(mode)
            tmp.replace(path)
        except OSError as e:
            print(f"gpuprobe {command}: error: cannot write {path}: {e}", file=sys.stderr)
            return 2
        print(f"wrote {path}")
    return 0


def toml_value(value: bool | int | float | str | list[Any] | Path) -> str:
    """One value of an installed config file, as TOML (strings as JSON-escaped basic strings)."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # JSON escapes are valid TOML basic-string escapes
