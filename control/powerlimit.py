"""Part: control. GPU power limits as a probe parameter (docs/control.md, "Power limits").

A probe (a study point) may ask for a GPU power limit, as a percentage of the GPU's *maximum* limit
(``60%``) or in watts (``250W``). The agent sets it through NVML
(``nvmlDeviceSetPowerManagementLimit``) only when

- its configuration allows it (``--allow-power-limits``, off by default: :class:`PowerLimits`'s
  ``allowed``),
- it holds the privilege NVML needs: effective uid 0, or ``CAP_SYS_ADMIN`` in the effective
  capability set (``CapEff`` of ``/proc/self/status``; docs/operations.md says how to grant it),
- and the limit lies within the GPU's constraints (``nvmlDeviceGetPowerManagementLimitConstraints``).

Otherwise :meth:`PowerLimits.resolve` refuses with :class:`PowerLimitRefused` *before anything runs
or changes*. The previous limit is always restored: :meth:`PowerLimits.apply` first writes the GPU's
current limit durably (temporary file, fsync, rename, fsync of the folder) into the state file
(``CONTROL_DIR/power-limits.json``, keyed by GPU UUID, the index as a hint), and only then sets the
new one; :meth:`PowerLimits.restore` puts every changed GPU back after the probe (or its cancel)
and removes the file; and an agent killed with SIGKILL leaves the file, which the next start
(:meth:`PowerLimits.restore_leftovers`, called by ``ControlClient.run``) restores from.

NVML is reached through the one NVML boundary, :class:`gpuprobe.nvml.device.GpuDevice` (pynvml
underneath; ``tests/test_module_graph.py`` keeps pynvml there), opened on first use and kept. Every
call is blocking (NVML and fsync): the event loop runs them in a thread. A :class:`PowerLimits`
serialises its own calls.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pwd
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprobe.errors import ProtocolError

if TYPE_CHECKING:
    from gpuprobe.nvml.device import GpuDevice

log = logging.getLogger(__name__)

FILE_NAME = "power-limits.json"
FILE_VERSION = 1
CAP_SYS_ADMIN = 21  # linux/capability.h

# PowerLimitRefused.reason
NOT_ALLOWED = "not_allowed"  # the agent's configuration does not allow power limits
UNPRIVILEGED = "unprivileged"  # neither root nor CAP_SYS_ADMIN, or NVML answered NO_PERMISSION
OUT_OF_RANGE = "out_of_range"  # outside the GPU's [min, max] constraints
UNSUPPORTED = "unsupported"  # the GPU has no settable power limit
NVML_ERROR = "nvml_error"  # NVML failed otherwise (no NVML, no such GPU, a lost GPU...)
STATE_ERROR = "state_error"  # the limit to restore could not be written down, so nothing was changed
REASONS = (NOT_ALLOWED, UNPRIVILEGED, OUT_OF_RANGE, UNSUPPORTED, NVML_ERROR, STATE_ERROR)

# NVML return codes (nvml.h), as NvmlCallError.code
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_FUNCTION_NOT_FOUND = 13


def _number(value: float) -> str:
    """``60``, ``62.5``, ``250``: a limit as people write it (no trailing ``.0``)."""
    return f"{value:g}"


def _watts(mw: int) -> str:
    return f"{_number(mw / 1000)} W"


@dataclass(frozen=True)
class LimitRequest:
    """A requested power limit: a percentage of the GPU's maximum limit, watts, or neither (leave the
    limit as it is). :func:`parse_limit` makes one from text."""

    pct_of_max: float | None = None  # "60%": percent of the GPU's MAXIMUM limit (the constraints' max)
    watts: float | None = None  # "250W" or "250"

    def __post_init__(self) -> None:
        if self.pct_of_max is not None and self.watts is not None:
            raise ValueError("a power limit is a percentage or watts, not both")
        if self.pct_of_max is not None and not (math.isfinite(self.pct_of_max) and 0 < self.pct_of_max <= 100):
            raise ValueError(
                f"power limit {_number(self.pct_of_max)}%: the percentage of the maximum limit must be in (0, 100]"
            )
        if self.watts is not None and not (math.isfinite(self.watts) and self.watts > 0):
            raise ValueError(f"power limit {_number(self.watts)} W: watts must be positive")

    @property
    def is_default(self) -> bool:
        """No limit asked for: the GPU's limit is left as it is."""
        return self.pct_of_max is None and self.watts is None

    @property
    def label(self) -> str:
        """``60%``, ``250W``; empty when the limit is left as it is."""
        if self.pct_of_max is not None:
            return f"{_number(self.pct_of_max)}%"
        if self.watts is not None:
            return f"{_number(self.watts)}W"
        return ""


def parse_limit(text: str) -> LimitRequest:
    """``60%`` (percent of the GPU's maximum limit), ``250W``, ``250w``, ``250`` (watts); ``default`` or
    an empty string: leave the limit as it is. ValueError with a message that says what is accepted."""
    raw = text.strip()
    if raw.lower() in ("", "default"):
        return LimitRequest()
    accepted = "a percentage of the GPU's maximum limit (60%), watts (250W or 250), or 'default'"
    if raw.endswith("%"):
        number, kind = raw[:-1].strip(), "pct"
    elif raw[-1] in "wW":
        number, kind = raw[:-1].strip(), "watts"
    else:
        number, kind = raw, "watts"
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a power limit: {text!r} (expected {accepted})") from None
    if not math.isfinite(value):
        raise ValueError(f"not a power limit: {text!r} (expected {accepted})")
    if kind == "pct":
        if not 0 < value <= 100:
            raise ValueError(
                f"power limit {text.strip()!r}: the percentage of the GPU's maximum limit must be more than 0"
                " and at most 100"
            )
        return LimitRequest(pct_of_max=value)
    if value <= 0:
        raise ValueError(f"power limit {text.strip()!r}: watts must be more than 0")
    return LimitRequest(watts=value)


class PowerLimitRefused(ProtocolError):
    """The agent will not, or cannot, set a requested power limit. ``reason`` is one of :data:`REASONS`;
    the message names the GPU, the request and, where it matters, the GPU's range."""

    def __init__(self, reason: str, message: str, gpu_index: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.gpu_index = gpu_index


def privilege() -> tuple[bool, str]:
    """(whether this process may set power limits, who it runs as): effective uid 0, or CAP_SYS_ADMIN
    in the effective capability set (what the NVIDIA driver checks, docs/operations.md)."""
    euid = os.geteuid()
    try:
        user = f"{pwd.getpwuid(euid).pw_name} (uid {euid})"
    except KeyError:
        user = f"uid {euid}"
    if euid == 0:
        return True, f"{user}"
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    if (int(line.split()[1], 16) >> CAP_SYS_ADMIN) & 1:
                        return True, f"{user} with CAP_SYS_ADMIN"
                    break
    except (OSError, ValueError, IndexError):
        pass
    return False, f"{user} without CAP_SYS_ADMIN"


@dataclass(frozen=True)
class _Saved:
    """One GPU's limit before the agent changed it."""

    uuid: str
    index: int  # a hint: indices can change across reboots, the UUID does not
    limit_mw: int

    def where(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


def _nvml_code(e: BaseException) -> int | None:
    """NVML's return code of a failed call (``NvmlCallError.code``), None for other failures."""
    code = getattr(e, "code", None)
    return code if isinstance(code, int) else None


def _mw(watts: float) -> int:
    return round(watts * 1000)


class PowerLimits:
    """Sets GPU power limits for probes and always puts the previous ones back (module docstring)."""

    def __init__(self, state_file: Path, allowed: bool) -> None:
        self.state_file = state_file
        self.allowed = allowed
        self._lock = threading.Lock()
        self._devices: dict[int, GpuDevice] = {}  # opened on first use, by NVML index
        self._saved: dict[str, _Saved] | None = None  # by UUID; None until the state file was read
        self._problems: list[str] = []  # lines for the next restore (a damaged state file)

    # --- NVML -----------------------------------------------------------------------------------------

    def _device(self, index: int) -> GpuDevice:
        """The GPU at NVML index ``index``, opened once (NVML is initialised on first use)."""
        device = self._devices.get(index)
        if device is None:
            from gpuprobe.nvml.device import GpuDevice

            device = GpuDevice(index)
            self._devices[index] = device
        return device

    def _by_uuid(self) -> tuple[dict[str, int], bool]:
        """{UUID: index} of this node's GPUs, and whether every GPU answered (a lost GPU does not)."""
        from gpuprobe.nvml.device import GpuDevice

        found: dict[str, int] = {}
        complete = True
        for index in range(GpuDevice.count()):
            try:
                found[self._device(index).uuid] = index
            except Exception as e:
                log.warning("GPU %d does not say its UUID: %s", index, e)
                complete = False
        return found, complete

    def close(self) -> None:
        """Release NVML (the object can still be used: the GPUs are opened again when needed)."""
        with self._lock:
            for device in self._devices.values():
                device.close()
            self._devices.clear()

    def _refusal(self, e: BaseException, what: str, index: int, setting: bool = False) -> PowerLimitRefused:
        """An NVML failure as a refusal, by NVML's code (``setting``: of the call that sets the limit)."""
        code = _nvml_code(e)
        if code == _NO_PERMISSION:
            user = privilege()[1]
            return PowerLimitRefused(
                UNPRIVILEGED,
                f"{what}: NVML refused it (Insufficient Permissions) to this agent, which runs as {user};"
                " setting a power limit needs root or CAP_SYS_ADMIN (docs/operations.md)",
                index,
            )
        if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
            return PowerLimitRefused(UNSUPPORTED, f"{what}: the GPU does not support setting a power limit", index)
        if setting and code == _INVALID_ARGUMENT:
            return PowerLimitRefused(OUT_OF_RANGE, f"{what}: NVML rejected the value (Invalid Argument)", index)
        return PowerLimitRefused(NVML_ERROR, f"{what}: NVML error: {e}", index)

    # --- the state file -------------------------------------------------------------------------------

    def _entries(self) -> dict[str, _Saved]:
        """The limits to restore, read from the state file once (a damaged file is moved aside)."""
        if self._saved is None:
            self._saved = self._read_file()
        return self._saved

    def _read_file(self) -> dict[str, _Saved]:
        try:
            text = self.state_file.read_text()
        except FileNotFoundError:
            return {}
        except OSError as e:
            self._report(
                log.error,
                f"cannot read the power limits to restore from {self.state_file} ({e}): GPUs may still run"
                " with a power limit a probe set; check with `nvidia-smi -q -d POWER`",
                self._problems,
            )
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
                raise ValueError("no 'gpus' object")
            saved: dict[str, _Saved] = {}
            for uuid, entry in data["gpus"].items():
                index, limit_mw = entry["index"], entry["limit_mw"]
                if not (isinstance(index, int) and isinstance(limit_mw, int) and index >= 0 and limit_mw > 0):
                    raise ValueError(f"bad entry for {uuid!r}: {entry!r}")
                saved[str(uuid)] = _Saved(str(uuid), index, limit_mw)
            return saved
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            aside = self.state_file.with_name(f"{self.state_file.name}.damaged-{int(time.time())}")
            try:
                self.state_file.replace(aside)
                kept = f"moved to {aside}"
            except OSError as move_error:
                kept = f"and could not be moved aside: {move_error}"
            self._report(
                log.error,
                f"the power limits to restore in {self.state_file} are unreadable ({e}); {kept}. GPUs may still"
                " run with a power limit a probe set: check with `nvidia-smi -q -d POWER` and reset with"
                " `nvidia-smi -i INDEX -pl WATTS` (as root)",
                self._problems,
            )
            return {}

    def _write_file(self, saved: dict[str, _Saved]) -> None:
        """Durably: the state file holds ``saved`` (or is gone when it is empty) when this returns."""
        if not saved:
            try:
                self.state_file.unlink()
            except FileNotFoundError:
                return
            self._fsync_dir()
            return
        data = {
            "version": FILE_VERSION,
            "about": "GPU power limits to restore (gpuprobe control agent); restored and removed at its next start",
            "gpus": {
                s.uuid: {"index": s.index, "limit_mw": s.limit_mw}
                for s in sorted(saved.values(), key=lambda s: s.index)
            },
        }
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_name(f".{self.state_file.name}.tmp")
        with tmp.open("w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.state_file)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.state_file.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- the interface --------------------------------------------------------------------------------

    def describe(self) -> str:
        """One line for the start-up log: whether probes may set power limits here."""
        if not self.allowed:
            return "power limits: not allowed (--allow-power-limits is off); study points that ask for one do not run"
        ok, user = privilege()
        if ok:
            return f"power limits: allowed; the agent runs as {user}"
        return (
            f"power limits: allowed, but the agent runs as {user}: study points that ask for one do not run"
            " (unprivileged, docs/operations.md)"
        )

    def resolve(self, gpu_index: int, request: LimitRequest) -> float | None:
        """The limit in W to set on GPU ``gpu_index`` for ``request`` (None: leave it as it is). Raises
        :class:`PowerLimitRefused` (not allowed, unprivileged, unsupported, out of range, NVML error)
        without changing anything."""
        if request.is_default:
            return None
        what = f"power limit {request.label} for GPU {gpu_index}"
        if not self.allowed:
            raise PowerLimitRefused(
                NOT_ALLOWED,
                f"{what} refused: this agent does not allow power limits (its --allow-power-limits is off)",
                gpu_index,
            )
        ok, user = privilege()
        if not ok:
            raise PowerLimitRefused(
                UNPRIVILEGED,
                f"{what} refused: the agent runs as {user}, and NVML sets power limits only for root or"
                " CAP_SYS_ADMIN (docs/operations.md)",
                gpu_index,
            )
        with self._lock:
            try:
                min_w, max_w = self._device(gpu_index).power_limit_constraints_w()
            except Exception as e:
                raise self._refusal(e, f"{what} refused", gpu_index) from None
        min_mw, max_mw = _mw(min_w), _mw(max_w)
        if max_mw <= 0 or min_mw > max_mw:
            raise PowerLimitRefused(
                UNSUPPORTED, f"{what} refused: the GPU reports no usable power limit range", gpu_index
            )
        limit_mw = round(max_mw * request.pct_of_max / 100) if request.pct_of_max is not None else 0
        if request.watts is not None:
            limit_mw = round(request.watts * 1000)
        if not min_mw <= limit_mw <= max_mw:
            is_w = f" is {_watts(limit_mw)}," if request.pct_of_max is not None else " is"
            raise PowerLimitRefused(
                OUT_OF_RANGE,
                f"{what}{is_w} outside the GPU's range {_watts(min_mw)} to {_watts(max_mw)}"
                f" ({_number(round(100 * min_mw / max_mw, 1))}% to 100% of its maximum)",
                gpu_index,
            )
        return limit_mw / 1000

    def apply(self, gpu_index: int, limit_w: float) -> None:
        """Set GPU ``gpu_index``'s power limit to ``limit_w`` (from :meth:`resolve`). The GPU's current
        limit is written durably to the state file first (only the first time per GPU: the original
        limit). Raises :class:`PowerLimitRefused` (``unprivileged`` when NVML answers NO_PERMISSION)."""
        limit_mw = round(limit_w * 1000)
        what = f"power limit {_watts(limit_mw)} for GPU {gpu_index}"
        if not self.allowed:
            raise PowerLimitRefused(
                NOT_ALLOWED,
                f"{what} refused: this agent does not allow power limits (its --allow-power-limits is off)",
                gpu_index,
            )
        with self._lock:
            try:
                device = self._device(gpu_index)
                uuid = device.uuid
                current_mw = _mw(device.power_limit_w())
            except Exception as e:
                raise self._refusal(e, f"{what} not set", gpu_index) from None
            saved = self._entries()
            added = uuid not in saved
            if added:
                saved[uuid] = _Saved(uuid, gpu_index, current_mw)
                try:
                    self._write_file(saved)
                except OSError as e:
                    del saved[uuid]
                    raise PowerLimitRefused(
                        STATE_ERROR,
                        f"{what} not set: cannot write the limit to restore ({_watts(current_mw)}) to"
                        f" {self.state_file}: {e}",
                        gpu_index,
                    ) from None
            try:
                device.set_power_limit_w(limit_mw / 1000)
            except Exception as e:
                if added:  # nothing changed on this GPU: nothing to restore
                    del saved[uuid]
                    try:
                        self._write_file(saved)
                    except OSError as write_error:  # harmless: restoring an unchanged limit is a no-op
                        log.warning("cannot rewrite %s: %s", self.state_file, write_error)
                raise self._refusal(e, f"{what} not set", gpu_index, setting=True) from None
            log.info(
                "%s: power limit set to %s (restores to %s)",
                _Saved(uuid, gpu_index, limit_mw).where(),
                _watts(limit_mw),
                _watts(saved[uuid].limit_mw),
            )

    def original_limit_w(self, gpu_index: int) -> float | None:
        """The limit GPU ``gpu_index`` had before this agent changed it; None when it did not change it
        (or the GPU does not answer). A study point that leaves the limit "as is" runs at this one."""
        with self._lock:
            try:
                uuid = self._device(gpu_index).uuid
            except Exception:
                return None
            saved = self._entries().get(uuid)
            return None if saved is None else saved.limit_mw / 1000

    def restore(self) -> list[str]:
        """Put every GPU whose limit this agent changed back to its previous limit, and remove the state
        file. Never raises for one GPU's failure: it is logged and kept in the file for the next start.
        Returns what happened, one line per GPU."""
        with self._lock:
            return self._restore_all()

    def restore_leftovers(self) -> list[str]:
        """At start: restore the limits that an agent killed before it could restore them left in the
        state file; the file is removed once all are restored. A GPU whose UUID is not on this node any
        more is logged and dropped; a damaged file is moved aside and reported. Never raises. Returns
        what happened, one line per GPU (also logged)."""
        with self._lock:
            if self._saved is None:
                self._saved = self._read_file()
                if self._saved:
                    log.warning(
                        "%s holds the power limits of %d GPU(s) that an earlier agent run set and did not"
                        " restore (was it killed?): restoring them",
                        self.state_file,
                        len(self._saved),
                    )
            return self._restore_all()

    def _report(self, logger: Any, line: str, lines: list[str]) -> None:
        logger("%s", line)
        lines.append(line)

    def _restore_all(self) -> list[str]:
        """With the lock held."""
        saved = self._entries()
        lines, self._problems = self._problems, []  # a damaged state file, reported once
        if not saved:
            return lines
        try:
            by_uuid, complete = self._by_uuid()
        except Exception as e:
            self._report(
                log.error,
                f"cannot restore the power limits of {len(saved)} GPU(s): NVML is not available ({e});"
                f" kept in {self.state_file} for the next start",
                lines,
            )
            return lines
        for uuid, s in list(saved.items()):
            index = by_uuid.get(uuid)
            if index is None and complete:
                del saved[uuid]
                self._report(
                    log.warning,
                    f"GPU {uuid} (index {s.index} when its limit was set) is not on this node any more:"
                    f" its limit to restore ({_watts(s.limit_mw)}) is dropped",
                    lines,
                )
                continue
            if index is None:
                self._report(
                    log.error,
                    f"{s.where()}: cannot restore the power limit to {_watts(s.limit_mw)}: no GPU answers with"
                    f" this UUID now; kept in {self.state_file} for the next start",
                    lines,
                )
                continue
            where = _Saved(uuid, index, s.limit_mw).where()
            try:
                # always set: a limit just set may not show in the readings yet (a new limit takes effect
                # at the driver's next update), and setting the limit a GPU has is harmless
                self._device(index).set_power_limit_w(s.limit_mw / 1000)
            except Exception as e:
                self._report(
                    log.error,
                    f"{where}: cannot restore the power limit to {_watts(s.limit_mw)}: {e};"
                    f" kept in {self.state_file} for the next start",
                    lines,
                )
                continue
            del saved[uuid]
            self._report(log.info, f"{where}: power limit restored to {_watts(s.limit_mw)}", lines)
        try:
            self._write_file(saved)
        except OSError as e:
            self._report(log.error, f"cannot update {self.state_file}: {e}", lines)
        return lines
