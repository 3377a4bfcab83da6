"""The NVML interface held against NVIDIA's own ``nvml.h`` (PyPI ``nvidia-nvml-dev``, the dev extra).

No GPU has run these tests, so the simulator and the agent could share a mistake that every other test
passes. The header is the reference, and the C compiler reads it: each side's types are resolved in its
own translation unit (the header's, and the simulator's source), so a typedef, a struct layout or a
constant that drifts from NVIDIA's shows here as a difference of sizes, offsets or values.

- prototypes: every function the simulator library exports is declared in nvml.h with as many arguments,
  each of the same kind (integer or enum / pointer / floating point) and width, pointers to the same
  width and kind of thing (and to a struct of the same name); the process records the simulator writes
  through ``void *`` have nvml.h's stride and field offsets;
- layouts: every struct or union the simulator defines under an nvml.h name, field by field (offset and
  size, nested fields included); the pynvml ctypes structures the agent reads through; the agent's own
  ``struct.Struct`` of ``nvmlFieldValue_t``;
- version words the simulator demands and the agent (through pynvml) supplies;
- constants: return codes, field ids, event and clock-event bits, GPM metric ids, value types,
  architectures and the other enumerations the simulator, the agent and its neighbours use;
- the sensor's direct calls: every C function it fetches by name is in :data:`AGENT_CALLS`, whose
  argument kinds (the ctypes values it builds) must fit nvml.h's parameters.

All of it in about 2 s (a few compiler runs), on every ``make test``.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuprobe.agent import health, resolution
from gpuprobe.agent.sensors import events
from gpuprobe.control import powerlimit
from gpuprobe.dashboards import grafana_parts
from gpuprobe.model import thermal as model_thermal
from gpuprobe.nvml import errors as nvml_errors
from gpuprobe.nvml import sensor
from gpuprobe.sim import build, profiles, state

ROOT = Path(__file__).resolve().parents[2]
SIM_SOURCE = build.SOURCE


def _header() -> Path | None:
    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations or [] if spec else []:
        candidate = Path(base) / "cu13" / "include" / "nvml.h"
        if candidate.exists():
            return candidate
    return None


HEADER = _header()
pytestmark = pytest.mark.skipif(
    HEADER is None or shutil.which("gcc") is None,
    reason="nvml.h (pip install nvidia-nvml-dev, the dev extra) or gcc is missing",
)

# ------------------------------------------------------------------------------------------------ C text


def _clean(text: str) -> str:
    """C text without comments and preprocessor lines (string literals are not needed here)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"^\s*#(?:[^\n]*\\\n)*[^\n]*", "", text, flags=re.M)


def _closing(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError("unbalanced braces")


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"{": 1, "(": 1, "[": 1, "}": -1, ")": -1, "]": -1}.get(c, 0)
        if c == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _members(body: str) -> list[tuple[str, str | list[Any]]]:
    """(name, type text or nested members) of a struct or union body, in order."""
    out: list[tuple[str, str | list[Any]]] = []
    for decl in _split_top(body, ";"):
        if "{" in decl:
            at = decl.index("{")
            close = _closing(decl, at)
            nested = _members(decl[at + 1 : close])
            out.extend((name.strip(), nested) for name in decl[close + 1 :].split(","))
            continue
        pieces = _split_top(decl, ",")
        first = re.match(r"(.*?)(\**\s*\b\w+\s*(?:\[[^\]]*\])*)$", pieces[0], re.S)
        assert first, decl
        base = first.group(1).strip()
        for piece in [first.group(2), *pieces[1:]]:
            name = re.search(r"(\w+)\s*(?:\[[^\]]*\])*$", piece)
            assert name, decl
            array = "[" in piece
            out.append((name.group(1), "[]" if array else base + "*" * piece.count("*")))
    return out


def _typedefs(text: str) -> dict[str, list[Any]]:
    """Struct and union typedef name -> members (``typedef struct [tag] {...} Name;`` and aliases of a tag)."""
    clean = _clean(text)
    out: dict[str, list[Any]] = {}
    tags: dict[str, list[Any]] = {}
    for m in re.finditer(r"\b(?:typedef\s+)?(?:struct|union)\s*(\w*)\s*\{", clean):
        close = _closing(clean, m.end() - 1)
        members = _members(clean[m.end() : close])
        if m.group(1):
            tags[m.group(1)] = members
        if clean[m.start() : m.start() + 7] == "typedef":
            names = clean[close + 1 : clean.index(";", close)]
            for name in names.split(","):
                if re.fullmatch(r"\s*\w+\s*", name):
                    out[name.strip()] = members
    for m in re.finditer(r"\btypedef\s+(?:struct|union)\s+(\w+)\s+(\w+)\s*;", clean):
        if m.group(1) in tags:
            out[m.group(2)] = tags[m.group(1)]
    for m in re.finditer(r"\btypedef\s+(\w+)\s+(\w+)\s*;", clean):
        if m.group(1) in out:
            out[m.group(2)] = out[m.group(1)]
    return out


def _paths(members: list[Any], structs: dict[str, list[Any]], prefix: str = "") -> list[str]:
    """Every field path of a struct, nested struct members included (``value.dVal``)."""
    out = []
    for name, kind in members:
        path = prefix + name
        out.append(path)
        if isinstance(kind, list):
            out.extend(_paths(kind, structs, path + "."))
        elif kind in structs:
            out.extend(_paths(structs[kind], structs, path + "."))
    return out


# ------------------------------------------------------------------------------------------------ probes


@dataclass
class _Unit:
    """One translation unit (nvml.h's, or the simulator's source) and what its compiler answers."""

    prelude: str
    work: Path
    lines: list[str] = field(default_factory=list)

    def print(self, tag: str, fmt: str, *exprs: str) -> None:
        self.lines.append(f'printf("%s\\t{fmt}\\n", "{tag}"{"".join(", " + e for e in exprs)});')

    def run(self, name: str) -> dict[str, list[str]]:
        source = self.work / f"{name}.c"
        body = "\n    ".join(self.lines)
        source.write_text(
            f"#include <stddef.h>\n#include <stdio.h>\n{self.prelude}\n"
            f"int main(void) {{\n    {body}\n    return 0;\n}}\n"
        )
        exe = self.work / name
        subprocess.run(["gcc", "-w", "-o", str(exe), str(source), "-lm", "-lpthread"], check=True, capture_output=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
        return {tag: values.split() for tag, values in (line.split("\t", 1) for line in out.splitlines())}


def _protos(source: Path, flags: list[str], work: Path) -> dict[str, tuple[str, list[str]]]:
    """Function name -> (return type, parameter declarations), as gcc -aux-info writes them."""
    aux = work / f"{source.stem}.aux"
    subprocess.run(["gcc", "-fsyntax-only", *flags, "-aux-info", str(aux), str(source)], check=True)
    out = {}
    for line in aux.read_text().splitlines():
        m = re.match(r"/\* [^*]*\*/ (?:extern )?(.*?)\b(nvml\w+) \((.*?)\);", line)
        if m:
            params = [] if m.group(3) in ("", "void") else _split_top(m.group(3), ",")
            out[m.group(2)] = (m.group(1).strip(), params)
    return out


def _decl(param: str, name: str) -> str:
    """A parameter as a variable declaration named ``name`` (nvml.h's prototypes name no parameters)."""
    named = re.match(r"(.*?[\s*])(\w+)$", param)
    if named and named.group(1).strip() and named.group(2) not in ("int", "char", "long", "short", "double"):
        known = re.sub(r"\bconst\b|\bunsigned\b|\bsigned\b", "", named.group(1)).strip(" *")
        if known:  # "nvmlDevice_t dev", "unsigned int *count": the simulator's names
            return f"{named.group(1)}{name}"
    return f"{param} {name}"


def _pointee(param: str) -> str | None:
    """The type a parameter written with a ``*`` points to (None: not written as a pointer)."""
    if "*" not in param:
        return None
    base = param[: param.rindex("*")]
    return re.sub(r"\bconst\b", "", base).strip()


INTLIKE = {1, 3}  # __builtin_classify_type: integer, enumeral (an enum and an int of its width are alike)


@dataclass
class Abi:
    exports: list[str]
    header_protos: dict[str, tuple[str, list[str]]]
    sim_protos: dict[str, tuple[str, list[str]]]
    header_facts: dict[str, list[str]]
    sim_facts: dict[str, list[str]]
    header_structs: dict[str, list[Any]]
    sim_structs: dict[str, list[Any]]
    sim_text: str
    header_text: str

    def header_value(self, expr: str) -> int:
        return int(self.header_facts[f"V:{expr}"][0])

    def sim_value(self, expr: str) -> int:
        return int(self.sim_facts[f"V:{expr}"][0])


def _param_probes(unit: _Unit, fn: str, ret: str, params: list[str]) -> None:
    for i, param in enumerate([ret, *params]):
        var = f"p_{fn}_{i}"
        tag = f"P:{fn}:{i}"
        unit.lines.append(f"{{ {_decl(param, var)};")
        unit.print(tag, "%d %zu", f"__builtin_classify_type({var})", f"sizeof({var})")
        pointee = _pointee(param)
        if pointee is not None and pointee != "void":
            unit.print(f"Q:{fn}:{i}", "%d %zu", f"__builtin_classify_type(*{var})", f"sizeof(*{var})")
        unit.lines.append("}")


def _layout_probes(unit: _Unit, name: str, paths: list[str]) -> None:
    unit.print(f"S:{name}", "%zu", f"sizeof({name})")
    for path in paths:
        unit.print(f"F:{name}:{path}", "%zu %zu", f"offsetof({name}, {path})", f"sizeof((({name} *)0)->{path})")


def _value_probes(unit: _Unit, exprs: Iterator[str] | list[str]) -> None:
    for expr in exprs:
        unit.print(f"V:{expr}", "%lld", f"(long long)({expr})")


# ---------------------------------------------------------------------- what the project's numbers mean

# the simulator's C expressions -> nvml.h's
SIM_CONSTANTS = {
    "NVML_MEMORY_V2": "nvmlMemory_v2",
    "NVML_TEMPERATURE_V1": "nvmlTemperature_v1",
    "NVML_FAN_SPEED_INFO_V1": "nvmlFanSpeedInfo_v1",
    "REASON_GPU_IDLE": "nvmlClocksEventReasonGpuIdle",
    "REASON_SW_POWER_CAP": "nvmlClocksEventReasonSwPowerCap",
    "REASON_HW_SLOWDOWN": "nvmlClocksThrottleReasonHwSlowdown",
    "REASON_HW_THERMAL": "nvmlClocksThrottleReasonHwThermalSlowdown",
    "REASONS_SUPPORTED & ~nvmlClocksEventReasonAll": "0",
    "EVENT_SBE": "nvmlEventTypeSingleBitEccError",
    "EVENT_DBE": "nvmlEventTypeDoubleBitEccError",
    "EVENT_XID": "nvmlEventTypeXidCriticalError",
    "EVENT_CLOCK": "nvmlEventTypeClock",
    "EVENT_POWER_SOURCE": "nvmlEventTypePowerSourceChange",
    "GPM_IDS[GPM_SM_UTIL]": "NVML_GPM_METRIC_SM_UTIL",
    "GPM_IDS[GPM_SM_OCCUPANCY]": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "GPM_IDS[GPM_ANY_TENSOR]": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "GPM_IDS[GPM_DRAM_BW]": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "GPM_IDS[GPM_FP16]": "NVML_GPM_METRIC_FP16_UTIL",
    "GPM_IDS[GPM_FP32]": "NVML_GPM_METRIC_FP32_UTIL",
    "GPM_IDS[GPM_FP64]": "NVML_GPM_METRIC_FP64_UTIL",
    "VT_DOUBLE": "NVML_VALUE_TYPE_DOUBLE",
    "VT_UINT": "NVML_VALUE_TYPE_UNSIGNED_INT",
    "VT_ULL": "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG",
    "VT_SLL": "NVML_VALUE_TYPE_SIGNED_LONG_LONG",
    "VT_SINT": "NVML_VALUE_TYPE_SIGNED_INT",
    "MAX_NVLINKS <= NVML_NVLINK_MAX_LINKS": "1",
}
# nvml.h values the simulator's probe may use in its expressions above (its own source defines no such names)
SIM_BORROWED = ("nvmlClocksEventReasonAll", "NVML_NVLINK_MAX_LINKS")

# the field ids the simulator's read_field answers (a number there that is not here fails: name it)
SIM_FIELDS = {
    38: "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    45: "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    52: "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    59: "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    82: "NVML_FI_DEV_MEMORY_TEMP",
    83: "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    91: "NVML_FI_DEV_NVLINK_LINK_COUNT",
    138: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    139: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    140: "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX",
    141: "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX",
    185: "NVML_FI_DEV_POWER_AVERAGE",
    186: "NVML_FI_DEV_POWER_INSTANT",
    187: "NVML_FI_DEV_POWER_MIN_LIMIT",
    188: "NVML_FI_DEV_POWER_MAX_LIMIT",
    189: "NVML_FI_DEV_POWER_DEFAULT_LIMIT",
    190: "NVML_FI_DEV_POWER_CURRENT_LIMIT",
    191: "NVML_FI_DEV_ENERGY",
    192: "NVML_FI_DEV_POWER_REQUESTED_LIMIT",
    195: "NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT",
    196: "NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT",
    197: "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
    198: "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
}

# the process records the simulator writes through void *: function -> nvml.h record
SIM_PROCESS_RECORDS = {
    "nvmlDeviceGetComputeRunningProcesses_v3": "nvmlProcessInfo_t",
    "nvmlDeviceGetComputeRunningProcesses_v2": "nvmlProcessInfo_v2_t",
    "nvmlDeviceGetComputeRunningProcesses": "nvmlProcessInfo_v1_t",
}
# fill_processes' memcpy sources -> the record fields they fill, in the order written
PROCESS_WRITES = {"pid": ["pid"], "mem": ["usedGpuMemory"], "gi": ["gpuInstanceId"], "ci": ["computeInstanceId"]}
# functions that take a record as void * and never write one (they always answer 0 entries)
SIM_VOID_UNWRITTEN = (
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
)


def _python_constants() -> list[tuple[str, Any, str]]:
    """(what, the project's value, nvml.h expression or tuple of them) for every number the Python side uses."""
    out: list[tuple[str, Any, str]] = []
    for name in dir(nvml_errors):
        if re.fullmatch(r"NVML_(SUCCESS|ERROR_\w+)", name):
            out.append((f"gpuprobe.nvml.errors.{name}", getattr(nvml_errors, name), name))
    for code, (name, _) in nvml_errors.GONE.items():
        out.append((f"gpuprobe.nvml.errors.GONE {name}", code, f"NVML_ERROR_{name}"))
    for answer, code in state.FAIL_ANSWERS.items():  # the simulator's own copy (sim/ does not import nvml/)
        out.append((f"sim.state.FAIL_ANSWERS {answer}", code, f"NVML_ERROR_{answer.upper()}"))
    for name, hname in (
        ("FIELD_MEMORY_TEMP", "NVML_FI_DEV_MEMORY_TEMP"),
        ("FIELD_TOTAL_ENERGY_CONSUMPTION", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        ("FIELD_POWER_INSTANT", "NVML_FI_DEV_POWER_INSTANT"),
        ("FIELD_POWER_CURRENT_LIMIT", "NVML_FI_DEV_POWER_CURRENT_LIMIT"),
        ("FIELD_NVLINK_TX_KIB", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
        ("FIELD_NVLINK_RX_KIB", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
    ):
        out.append((f"sensor.{name}", getattr(sensor, name), hname))
    counters = dict(sensor.NVLINK_ERROR_COUNTERS)
    totals = dict(zip((k for k, _ in sensor.NVLINK_ERROR_COUNTERS), sensor.FIELD_NVLINK_ERROR_TOTALS, strict=True))
    for key, kind in (
        ("replay_errors", "REPLAY"),
        ("recovery_errors", "RECOVERY"),
        ("crc_flit_errors", "CRC_FLIT"),
        ("crc_data_errors", "CRC_DATA"),
    ):
        out.append((f"sensor.NVLINK_ERROR_COUNTERS {key}", counters[key], f"NVML_NVLINK_ERROR_DL_{kind}"))
        out.append(
            (f"sensor.FIELD_NVLINK_ERROR_TOTALS {key}", totals[key], f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL")
        )
    gpm = dict(sensor.GPM_METRICS)
    for key, metric in (
        ("sm_active_pct", "SM_UTIL"),
        ("sm_occupancy_pct", "SM_OCCUPANCY"),
        ("tensor_active_pct", "ANY_TENSOR_UTIL"),
        ("dram_bw_util_pct", "DRAM_BW_UTIL"),
        ("fp64_active_pct", "FP64_UTIL"),
        ("fp32_active_pct", "FP32_UTIL"),
        ("fp16_active_pct", "FP16_UTIL"),
    ):
        out.append((f"sensor.GPM_METRICS {key}", gpm[key], f"NVML_GPM_METRIC_{metric}"))
    for number, arch in sensor.ARCHITECTURES.items():
        out.append((f"sensor.ARCHITECTURES {arch}", number, f"NVML_DEVICE_ARCH_{arch.upper()}"))
    for number, kind in sensor.VALUE_TYPES.items():
        out.append((f"sensor.VALUE_TYPES {kind}", number, f"NVML_VALUE_TYPE_{kind}"))
    for number, mode in zip(
        sorted(sensor.VIRTUALIZATION_MODES), ("NONE", "PASSTHROUGH", "VGPU", "HOST_VGPU", "HOST_VSGA"), strict=True
    ):
        out.append((f"sensor.VIRTUALIZATION_MODES {mode}", number, f"NVML_GPU_VIRTUALIZATION_MODE_{mode}"))
    sw_thermal, hw_thermal, hw_slow = (
        "nvmlClocksEventReasonSwThermalSlowdown",
        "nvmlClocksThrottleReasonHwThermalSlowdown",
        "nvmlClocksThrottleReasonHwSlowdown",
    )
    power_cap, brake = "nvmlClocksEventReasonSwPowerCap", "nvmlClocksThrottleReasonHwPowerBrakeSlowdown"
    out += [
        ("events.EVENT_SINGLE_BIT_ECC", events.EVENT_SINGLE_BIT_ECC, "nvmlEventTypeSingleBitEccError"),
        ("events.EVENT_DOUBLE_BIT_ECC", events.EVENT_DOUBLE_BIT_ECC, "nvmlEventTypeDoubleBitEccError"),
        ("events.EVENT_XID", events.EVENT_XID, "nvmlEventTypeXidCriticalError"),
        ("events.EVENT_CLOCK", events.EVENT_CLOCK, "nvmlEventTypeClock"),
        ("events.EVENT_POWER_SOURCE", events.EVENT_POWER_SOURCE, "nvmlEventTypePowerSourceChange"),
        ("health.THERMAL_REASONS", health.THERMAL_REASONS, f"{sw_thermal} | {hw_thermal} | {hw_slow}"),
        (
            "resolution.TRIGGER_REASONS_MASK",
            resolution.TRIGGER_REASONS_MASK,
            f"{hw_slow} | {sw_thermal} | {hw_thermal} | {brake}",
        ),
        ("grafana_parts.THERMAL_BITS", grafana_parts.THERMAL_BITS, f"{sw_thermal} | {hw_thermal}"),
        ("grafana_parts.POWER_BITS", grafana_parts.POWER_BITS, f"{power_cap} | {brake}"),
        ("model.thermal.REASON_SW_POWER_CAP", model_thermal.REASON_SW_POWER_CAP, power_cap),
        ("model.thermal.REASON_HW_SLOWDOWN", model_thermal.REASON_HW_SLOWDOWN, hw_slow),
        ("model.thermal.REASON_SW_THERMAL", model_thermal.REASON_SW_THERMAL, sw_thermal),
        ("model.thermal.REASON_HW_THERMAL", model_thermal.REASON_HW_THERMAL, hw_thermal),
        ("model.thermal.REASON_HW_POWER_BRAKE", model_thermal.REASON_HW_POWER_BRAKE, brake),
        ("powerlimit._INVALID_ARGUMENT", powerlimit._INVALID_ARGUMENT, "NVML_ERROR_INVALID_ARGUMENT"),
        ("powerlimit._NOT_SUPPORTED", powerlimit._NOT_SUPPORTED, "NVML_ERROR_NOT_SUPPORTED"),
        ("powerlimit._NO_PERMISSION", powerlimit._NO_PERMISSION, "NVML_ERROR_NO_PERMISSION"),
        ("powerlimit._FUNCTION_NOT_FOUND", powerlimit._FUNCTION_NOT_FOUND, "NVML_ERROR_FUNCTION_NOT_FOUND"),
        ("profiles.ARCH_AMPERE", profiles.ARCH_AMPERE, "NVML_DEVICE_ARCH_AMPERE"),
        ("profiles.ARCH_ADA", profiles.ARCH_ADA, "NVML_DEVICE_ARCH_ADA"),
        ("profiles.ARCH_HOPPER", profiles.ARCH_HOPPER, "NVML_DEVICE_ARCH_HOPPER"),
        ("profiles.BRAND_NVIDIA", profiles.BRAND_NVIDIA, "NVML_BRAND_NVIDIA"),
        # the simulated driver's CUDA major: the NVML version's first number, the header's API version
        ("state.CUDA_DRIVER_VERSION // 1000", state.CUDA_DRIVER_VERSION // 1000, "NVML_API_VERSION"),
        ("profiles.BRAND_GEFORCE", profiles.BRAND_GEFORCE, "NVML_BRAND_GEFORCE"),
        ("profiles.VIRT_NONE", profiles.VIRT_NONE, "NVML_GPU_VIRTUALIZATION_MODE_NONE"),
        ("profiles.VIRT_PASSTHROUGH", profiles.VIRT_PASSTHROUGH, "NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH"),
        ("profiles.VIRT_VGPU", profiles.VIRT_VGPU, "NVML_GPU_VIRTUALIZATION_MODE_VGPU"),
    ]
    # bench/gpu_check/check.py runs on a real GPU without gpuprobe installed: its literals, read from the source
    check = ROOT / "bench" / "gpu_check" / "check.py"
    literals = {
        t.id: ast.literal_eval(node.value)
        for node in ast.parse(check.read_text()).body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id.isupper() and isinstance(node.value, ast.Constant | ast.Tuple | ast.Dict)
    }
    ecc = literals["ECC_FIELDS"]
    for kind, location, counter in (
        ("SBE", "VOL", "CORRECTED"),
        ("DBE", "VOL", "UNCORRECTED"),
        ("SBE", "AGG", "CORRECTED"),
        ("DBE", "AGG", "UNCORRECTED"),
    ):
        fid = f"NVML_FI_DEV_ECC_{kind}_{location}_TOTAL"
        volatile = "NVML_VOLATILE_ECC" if location == "VOL" else "NVML_AGGREGATE_ECC"
        out.append((f"check.ECC_FIELDS[{fid}]", ("by", fid, ecc), f"(NVML_MEMORY_ERROR_TYPE_{counter}, {volatile})"))
    out.append(
        (
            "check.REMAP_FIELDS",
            literals["REMAP_FIELDS"],
            "(NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_UNC, "
            "NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_FAILURE)",
        )
    )
    for policy in ("POWER", "THERMAL", "SYNC_BOOST"):
        fid = f"NVML_FI_DEV_PERF_POLICY_{policy}"
        out.append(
            (f"check.VIOLATION_FIELDS[{fid}]", ("by", fid, literals["VIOLATION_FIELDS"]), f"NVML_PERF_POLICY_{policy}")
        )
    out.append(("check.FIELD_PCIE_REPLAY", literals["FIELD_PCIE_REPLAY"], "NVML_FI_DEV_PCIE_REPLAY_COUNTER"))
    out.append(("check.FIELD_NVLINK_STATE", literals["FIELD_NVLINK_STATE"], "NVML_FI_DEV_NVLINK_GET_STATE"))
    for name, (counter, total) in literals["NVLINK_COUNTERS"].items():
        kind = name.upper()
        out.append((f"check.NVLINK_COUNTERS[{name}] counter", counter, f"NVML_NVLINK_ERROR_DL_{kind}"))
        if total is not None:
            out.append((f"check.NVLINK_COUNTERS[{name}] field", total, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL"))
    # the right version word of each versioned call whose wrong words the check tries
    out.append(("check.MEMORY_V2_WORDS[0]", literals["MEMORY_V2_WORDS"][0], "nvmlMemory_v2"))
    out.append(("check.TEMPERATURE_WORDS[0]", literals["TEMPERATURE_WORDS"][0], "nvmlTemperature_v1"))
    out.append(("check.GPM_METRICS_GET_WORDS[0]", literals["GPM_METRICS_GET_WORDS"][0], "NVML_GPM_METRICS_GET_VERSION"))
    return out


# the pynvml version words and constants the agent relies on beyond the pynvml.NAME it spells out
PYNVML_EXTRA = (
    "nvmlMemory_v2",
    "nvmlTemperature_v1",
    "nvmlFanSpeedInfo_v1",
    "NVML_GPM_METRICS_GET_VERSION",
    "NVML_GPM_SUPPORT_VERSION",
    "NVML_GPM_METRIC_MAX",
    "NVML_NVLINK_MAX_LINKS",
)
# pynvml structures the agent reads through its wrappers (the ones it names itself are found in its source)
PYNVML_WRAPPER_STRUCTS = (
    "c_nvmlMemory_t",
    "c_nvmlProcessInfo_t",
    "c_nvmlProcessUtilizationSample_t",
    "nvmlPciInfo_t",
    "c_nvmlEventData_t",
    "c_nvmlDeviceAttributes",
    "c_nvmlGpmSupport_t",
    "c_nvmlSample_t",
    "c_nvmlBAR1Memory_t",
)
NVML_PACKAGE = ROOT / "gpuprobe" / "nvml"


def _header_struct_name(cls_name: str) -> str:
    name = cls_name.removeprefix("c_")
    return name if name.endswith("_t") else name + "_t"


def _pynvml_structs() -> dict[str, Any]:
    text = "".join(p.read_text() for p in NVML_PACKAGE.glob("*.py"))
    names = set(re.findall(r"\bpynvml\.(c_nvml\w+|nvml\w+_t)\b", text)) | set(PYNVML_WRAPPER_STRUCTS)
    return {n: getattr(pynvml, n) for n in sorted(names)}


def _ctypes_layout(cls: Any, prefix: str = "", base: int = 0, out: dict[str, tuple[int, int]] | None = None):
    out = {} if out is None else out
    for name, kind, *_ in cls._fields_:
        desc = getattr(cls, name)
        out[prefix + name] = (base + desc.offset, desc.size)
        if isinstance(kind, type) and issubclass(kind, ctypes.Structure | ctypes.Union):
            _ctypes_layout(kind, f"{prefix}{name}.", base + desc.offset, out)
    return out


def _pynvml_names() -> list[str]:
    text = "".join(p.read_text() for p in NVML_PACKAGE.glob("*.py"))
    used = set(re.findall(r"\bpynvml\.((?:NVML_|nvml)[A-Za-z0-9_]+)\b", text))
    return sorted({n for n in used | set(PYNVML_EXTRA) if isinstance(getattr(pynvml, n, None), int)})


# ------------------------------------------------------------------------------------------------ the probe


@pytest.fixture(scope="module")
def abi(tmp_path_factory: pytest.TempPathFactory) -> Abi:
    assert HEADER is not None
    work = tmp_path_factory.mktemp("nvml_abi")
    lib = build.ensure_library() / build.SONAME
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True).stdout
    exports = sorted({p[-1] for p in (line.split() for line in nm.splitlines()) if len(p) >= 2 and p[-2] in "TW"})
    exports = [e for e in exports if e.startswith("nvml")]

    header_c = work / "header.c"
    header_c.write_text(f'#define NVML_NO_UNVERSIONED_FUNC_DEFS\n#include "{HEADER}"\n')
    header_protos = _protos(header_c, [], work)
    sim_protos = _protos(SIM_SOURCE, [], work)
    header_text, sim_text = HEADER.read_text(), SIM_SOURCE.read_text()
    header_structs, sim_structs = _typedefs(header_text), _typedefs(sim_text)

    hdr = _Unit(f'#define NVML_NO_UNVERSIONED_FUNC_DEFS\n#include "{HEADER}"', work)
    for fn in exports:
        if fn in header_protos:
            _param_probes(hdr, fn, *header_protos[fn])
    for name in sim_structs:
        if name.startswith("nvml") and name in header_structs:
            _layout_probes(hdr, name, _paths(header_structs[name], header_structs))
    for cls in _pynvml_structs().values():
        name = _header_struct_name(cls.__name__)
        if name in header_structs:
            _layout_probes(hdr, name, _paths(header_structs[name], header_structs))
    for record in SIM_PROCESS_RECORDS.values():
        _layout_probes(hdr, record, _paths(header_structs[record], header_structs))
    hnames = {h for h in SIM_CONSTANTS.values()} | set(SIM_FIELDS.values()) | set(SIM_BORROWED)
    hnames |= set(re.findall(r"\b(NVML_(?:SUCCESS|ERROR_[A-Z_]+))\s*=", _clean(sim_text)))
    for _, value, expr in _python_constants():
        if isinstance(value, tuple) and value[:1] == ("by",):
            hnames.add(value[1])
        hnames |= set(_split_top(expr.strip("()"), ",")) if expr.startswith("(") else {expr}
    hnames |= set(_pynvml_names())
    _value_probes(hdr, sorted(hnames))

    header_values = hdr.run("header_probe")
    borrowed = "".join(f"#define {n} ({header_values[f'V:{n}'][0]}LL)\n" for n in SIM_BORROWED)
    sim = _Unit(f'{borrowed}#include "{SIM_SOURCE}"', work)
    for fn in exports:
        if fn in sim_protos:
            _param_probes(sim, fn, *sim_protos[fn])
    for name, members in sim_structs.items():
        if name.startswith("nvml"):
            _layout_probes(sim, name, _paths(members, sim_structs))
    own = set(re.findall(r"\b(NVML_(?:SUCCESS|ERROR_[A-Z_]+))\s*=", _clean(sim_text)))
    _value_probes(sim, sorted(set(SIM_CONSTANTS) | own))
    return Abi(
        exports,
        header_protos,
        sim_protos,
        header_values,
        sim.run("sim_probe"),
        header_structs,
        sim_structs,
        sim_text,
        header_text,
    )


def _function_body(text: str, name: str) -> str:
    clean = _clean(text)
    m = re.search(rf"\b{name}\s*\([^;{{]*\)\s*\{{", clean)
    assert m, f"{name} not found in the simulator's source"
    return clean[m.end() - 1 : _closing(clean, m.end() - 1) + 1]


# ------------------------------------------------------------------------------------------------ the tests


def test_every_export_has_nvml_h_prototype(abi: Abi) -> None:
    """Same argument count, and per argument the same kind and width (pointers: of what they point to)."""
    assert len(abi.exports) > 100
    problems = []
    for fn in abi.exports:
        if fn not in abi.header_protos:
            problems.append(f"{fn}: exported by the simulator, not declared in nvml.h")
            continue
        _, hparams = abi.header_protos[fn]
        _, sparams = abi.sim_protos[fn]
        if len(hparams) != len(sparams):
            problems.append(f"{fn}: {len(sparams)} arguments vs nvml.h {len(hparams)} ({sparams} vs {hparams})")
            continue
        for i, (sp, hp) in enumerate(
            zip([abi.sim_protos[fn][0], *sparams], [abi.header_protos[fn][0], *hparams], strict=True)
        ):
            what = "return" if i == 0 else f"argument {i}"
            (s_class, s_size), (h_class, h_size) = (
                map(int, abi.sim_facts[f"P:{fn}:{i}"]),
                map(int, abi.header_facts[f"P:{fn}:{i}"]),
            )
            same_kind = s_class == h_class or {s_class, h_class} <= INTLIKE
            if not same_kind or s_size != h_size:
                problems.append(
                    f"{fn} {what}: {sp!r} (class {s_class}, {s_size} B) vs nvml.h {hp!r} (class {h_class}, {h_size} B)"
                )
                continue
            s_pointee, h_pointee = _pointee(sp), _pointee(hp)
            if s_pointee == "void" and h_pointee != "void":
                if fn not in SIM_PROCESS_RECORDS and fn not in SIM_VOID_UNWRITTEN:
                    problems.append(f"{fn} {what}: void * where nvml.h has {hp!r}: add its record check")
                continue
            if (s_pointee is None) != (h_pointee is None):
                problems.append(f"{fn} {what}: {sp!r} vs nvml.h {hp!r}")
                continue
            if s_pointee is None or h_pointee == "void":
                continue
            (sq_class, sq_size), (hq_class, hq_size) = (
                map(int, abi.sim_facts[f"Q:{fn}:{i}"]),
                map(int, abi.header_facts[f"Q:{fn}:{i}"]),
            )
            if not (sq_class == hq_class or {sq_class, hq_class} <= INTLIKE) or sq_size != hq_size:
                problems.append(
                    f"{fn} {what}: points to {sq_size} B (class {sq_class}) vs nvml.h {hq_size} B (class {hq_class})"
                )
            elif hq_class in (12, 13) and s_pointee != h_pointee:
                problems.append(f"{fn} {what}: points to {s_pointee} vs nvml.h {h_pointee}")
    assert not problems, "\n".join(problems)


def _layout(facts: dict[str, list[str]], name: str) -> dict[str, tuple[int, int]]:
    out = {"": (0, int(facts[f"S:{name}"][0]))}
    prefix = f"F:{name}:"
    out.update({k[len(prefix) :]: (int(v[0]), int(v[1])) for k, v in facts.items() if k.startswith(prefix)})
    return out


def test_simulator_structs_match_nvml_h_field_by_field(abi: Abi) -> None:
    compared = [n for n in abi.sim_structs if n.startswith("nvml") and n in abi.header_structs]
    assert {"nvmlFieldValue_t", "nvmlMemory_v2_t", "nvmlEventData_t", "nvmlGpmMetricsGet_t"} <= set(compared)
    problems = []
    for name in compared:
        sim, hdr = _layout(abi.sim_facts, name), _layout(abi.header_facts, name)
        if sim != hdr:
            diff = {k: (sim.get(k), hdr.get(k)) for k in sorted(set(sim) | set(hdr)) if sim.get(k) != hdr.get(k)}
            problems.append(f"{name}: (offset, size) simulator vs nvml.h: {diff}")
    assert not problems, "\n".join(problems)
    # every nvml-named handle and struct the simulator defines is one the header has
    only_sim = [n for n in abi.sim_structs if n.startswith("nvml") and n not in abi.header_structs]
    assert only_sim == ["nvmlGpmMetricInfo_t"], only_sim  # nvml.h nests it anonymously in nvmlGpmMetric_t


def test_process_records_written_through_void_pointer(abi: Abi) -> None:
    """The simulator fills nvmlProcessInfo records by stride and offset: they must be nvml.h's."""
    body = _function_body(abi.sim_text, "fill_processes")
    writes: list[tuple[str, int]] = []
    for offset, source in re.findall(r"memcpy\(p(?: \+ (\d+))?, &(\w+), \d+\)", body):
        writes.append((source, int(offset or 0)))
    for fn, record in SIM_PROCESS_RECORDS.items():
        body = _function_body(abi.sim_text, fn)
        m = re.search(r"fill_processes\(g, count, infos, (\d+), ([01]), NO_INSTANCE\)", body)
        assert m, fn
        stride, v1 = int(m.group(1)), m.group(2) == "1"
        layout = _layout(abi.header_facts, record)
        assert stride == layout[""][1], f"{fn}: stride {stride} vs sizeof({record}) {layout[''][1]}"
        seen = {name: 0 for name in PROCESS_WRITES}
        written = {}
        for source, offset in writes:
            fields = PROCESS_WRITES[source]
            name = fields[seen[source]]
            seen[source] += 1
            written[name] = offset
        expected = {k: v[0] for k, v in layout.items() if k}
        if v1:  # the v1 records have no MIG ids; fill_processes writes them only for v2 and newer
            written = {k: v for k, v in written.items() if k in expected}
        assert written == expected, f"{fn}: offsets written {written} vs nvml.h {record} {expected}"


def test_agent_structures_match_nvml_h(abi: Abi) -> None:
    """pynvml's ctypes structures the agent reads through, and its own struct.Struct of nvmlFieldValue_t."""
    problems = []
    structs = _pynvml_structs()
    assert {"c_nvmlFieldValue_t", "c_nvmlMemory_v2_t", "c_nvmlGpmMetricsGet_t"} <= set(structs)
    for cls_name, cls in structs.items():
        name = _header_struct_name(cls_name)
        assert name in abi.header_structs, f"pynvml.{cls_name}: no {name} in nvml.h"
        hdr = _layout(abi.header_facts, name)
        ours = {"": (0, ctypes.sizeof(cls)), **_ctypes_layout(cls)}
        if ours != hdr:
            diff = {k: (ours.get(k), hdr.get(k)) for k in sorted(set(ours) | set(hdr)) if ours.get(k) != hdr.get(k)}
            problems.append(f"pynvml.{cls_name}: (offset, size) vs nvml.h {name}: {diff}")
    fmt = sensor._FIELD_VALUE.format
    codes = re.findall(r"\d*[a-zA-Z?]", fmt.lstrip("@=<>!"))
    order = [n for n, _ in abi.header_structs["nvmlFieldValue_t"]]
    hdr = _layout(abi.header_facts, "nvmlFieldValue_t")
    assert len(codes) == len(order), f"_FIELD_VALUE {fmt!r} has {len(codes)} fields vs nvml.h {order}"
    ours = {
        name: (struct.calcsize(fmt[0] + "".join(codes[:i])), struct.calcsize(fmt[0] + codes[i]))
        for i, name in enumerate(order)
    }
    assert struct.calcsize(fmt) == hdr[""][1]
    assert ours == {n: hdr[n] for n in order}, f"sensor._FIELD_VALUE {fmt!r} vs nvml.h nvmlFieldValue_t"
    assert not problems, "\n".join(problems)


def test_version_words_and_simulator_constants_match_nvml_h(abi: Abi) -> None:
    problems = []
    for expr, hname in SIM_CONSTANTS.items():
        want = int(hname) if hname.isdigit() else abi.header_value(hname)
        if abi.sim_value(expr) != want:
            problems.append(f"simulator {expr} = {abi.sim_value(expr):#x} vs nvml.h {hname} = {want:#x}")
    own = sorted(set(re.findall(r"\b(NVML_(?:SUCCESS|ERROR_[A-Z_]+))\s*=", _clean(abi.sim_text))))
    assert "NVML_ERROR_GPU_IS_LOST" in own
    for name in own:
        if abi.sim_value(name) != abi.header_value(name):
            problems.append(f"simulator {name} = {abi.sim_value(name)} vs nvml.h {abi.header_value(name)}")
    body = _function_body(abi.sim_text, "read_field")
    answered = {int(n) for n in re.findall(r"(?:case |fieldId (?:==|>=|<=) )(\d+)", body)}
    for low, high in re.findall(r"fieldId >= (\d+) && f->fieldId <= (\d+)", body):
        answered |= set(range(int(low), int(high) + 1))
    unnamed = answered - set(SIM_FIELDS)
    assert not unnamed, f"read_field answers field ids {sorted(unnamed)} that SIM_FIELDS does not name: add them"
    for number, hname in SIM_FIELDS.items():
        assert number in answered, f"SIM_FIELDS names {number} ({hname}), which read_field no longer answers"
        if abi.header_value(hname) != number:
            problems.append(f"simulator field {number} vs nvml.h {hname} = {abi.header_value(hname)}")
    # what the simulator checks versioned structs against is what pynvml hands the agent
    for name in PYNVML_EXTRA:
        if getattr(pynvml, name) != abi.header_value(name) and name != "NVML_GPM_METRIC_MAX":
            problems.append(f"pynvml.{name} = {getattr(pynvml, name):#x} vs nvml.h {abi.header_value(name):#x}")
    assert not problems, "\n".join(problems)


def test_python_constants_match_nvml_h(abi: Abi) -> None:
    """The numbers the agent, the control plane, the model, the simulator's profiles and bench/gpu_check use."""
    problems = []
    for what, value, expr in _python_constants():
        if isinstance(value, tuple) and value and value[0] == "by":  # a table keyed by a field id
            _, fid, table = value
            value = table.get(abi.header_value(fid))
        if expr.startswith("("):
            want: Any = tuple(
                tuple(abi.header_value(e) for e in _split_top(p.strip("()"), ","))
                if p.startswith("(")
                else abi.header_value(p)
                for p in _split_top(expr[1:-1], ",")
            )
            if len(want) == 1:
                want = want[0]
        else:
            want = abi.header_value(expr)
        if value != want:
            problems.append(f"{what} = {value!r} vs nvml.h {expr} = {want!r}")
    for name in _pynvml_names():  # every pynvml.NAME the NVML boundary spells out
        if name == "NVML_GPM_METRIC_MAX":
            continue  # pynvml's bound on one request's metrics, not nvml.h's metric id range
        if f"V:{name}" in abi.header_facts and getattr(pynvml, name) != abi.header_value(name):
            problems.append(f"pynvml.{name} = {getattr(pynvml, name)} vs nvml.h {abi.header_value(name)}")
    assert not problems, "\n".join(problems)


# The sensor's direct calls (C functions fetched by name and called with ctypes arguments it builds, on the hot
# path and the health reads): the arguments it passes. h: a pynvml device handle; pyint: a Python int (ctypes
# passes a C int); c_uint / c_int: by value; &c_uint / &c_ulonglong: byref of one; &S: byref (or an array) of
# pynvml's layout of nvml.h's S; gpm: a pynvml nvmlGpmSample_t.
AGENT_CALLS: dict[str, list[str]] = {
    "nvmlDeviceGetUtilizationRates": ["h", "&nvmlUtilization_t"],
    "nvmlDeviceGetMemoryInfo_v2": ["h", "&nvmlMemory_v2_t"],
    "nvmlDeviceGetMemoryInfo": ["h", "&nvmlMemory_t"],
    "nvmlDeviceGetPowerUsage": ["h", "&c_uint"],
    "nvmlDeviceGetTemperatureV": ["h", "&nvmlTemperature_t"],
    "nvmlDeviceGetTemperature": ["h", "pyint", "&c_uint"],
    "nvmlDeviceGetFanSpeed_v2": ["h", "pyint", "&c_uint"],
    "nvmlDeviceGetClockInfo": ["h", "pyint", "&c_uint"],
    "nvmlDeviceGetCurrentClocksEventReasons": ["h", "&c_ulonglong"],
    "nvmlDeviceGetCurrentClocksThrottleReasons": ["h", "&c_ulonglong"],
    "nvmlDeviceGetEnforcedPowerLimit": ["h", "&c_uint"],
    "nvmlDeviceGetPcieThroughput": ["h", "pyint", "&c_uint"],
    "nvmlDeviceGetFieldValues": ["h", "pyint", "&nvmlFieldValue_t"],
    "nvmlDeviceGetTotalEccErrors": ["h", "c_uint", "c_uint", "&c_ulonglong"],
    "nvmlDeviceGetRemappedRows": ["h", "&c_uint", "&c_uint", "&c_uint", "&c_uint"],
    "nvmlDeviceGetPcieReplayCounter": ["h", "&c_uint"],
    "nvmlDeviceGetViolationStatus": ["h", "c_uint", "&nvmlViolationTime_t"],
    "nvmlDeviceGetNvLinkState": ["h", "c_uint", "&c_uint"],
    "nvmlDeviceGetNvLinkErrorCounter": ["h", "c_uint", "c_int", "&c_ulonglong"],
    "nvmlGpmSampleGet": ["h", "gpm"],
    "nvmlGpmMigSampleGet": ["h", "c_uint", "gpm"],
    "nvmlGpmMetricsGet": ["&nvmlGpmMetricsGet_t"],
    "nvmlDeviceGetFanSpeedRPM": ["h", "&nvmlFanSpeedInfo_t"],
}
INT_BY_VALUE = {"pyint": 4, "c_uint": 4, "c_int": 4}  # bytes
INT_BY_REFERENCE = {"&c_uint": 4, "&c_ulonglong": 8}


def _aliases_of(name: str, header_text: str) -> set[str]:
    """A typedef name and the names it is an alias of, or that alias it (nvmlTemperature_t, ..._v1_t)."""
    pairs = re.findall(r"\btypedef\s+(\w+)\s+(\w+)\s*;", _clean(header_text))
    names = {name}
    for a, b in pairs * 2:
        if a in names or b in names:
            names |= {a, b}
    return names


def test_the_sensors_direct_calls_pass_what_nvml_h_declares(abi: Abi) -> None:
    """Every C function the sensor fetches by name is in AGENT_CALLS (so a new one gets checked), and each
    argument it builds has the kind and width of nvml.h's parameter."""
    called = set(re.findall(r'"(nvml[A-Z]\w*)"', (NVML_PACKAGE / "sensor.py").read_text()))
    new, gone = sorted(called - set(AGENT_CALLS)), sorted(set(AGENT_CALLS) - called)
    assert not new and not gone, f"not in AGENT_CALLS: {new}; in it but no longer called: {gone}"
    problems = []
    for fn, kinds in AGENT_CALLS.items():
        if fn not in abi.header_protos or f"P:{fn}:0" not in abi.header_facts:
            problems.append(f"{fn}: not both declared in nvml.h and exported by the simulator")
            continue
        params = abi.header_protos[fn][1]
        if len(params) != len(kinds):
            problems.append(f"{fn}: the sensor passes {len(kinds)} arguments, nvml.h declares {len(params)}")
            continue
        for i, (kind, param) in enumerate(zip(kinds, params, strict=True), start=1):
            h_class, h_size = map(int, abi.header_facts[f"P:{fn}:{i}"])
            pointee = _pointee(param)
            if kind == "h":
                ok = param.strip() == "nvmlDevice_t"
            elif kind == "gpm":
                ok = param.strip() == "nvmlGpmSample_t"
            elif kind in INT_BY_VALUE:
                ok = h_class in INTLIKE and h_size == INT_BY_VALUE[kind]
            elif kind in INT_BY_REFERENCE:
                q_class, q_size = map(int, abi.header_facts.get(f"Q:{fn}:{i}", ["0", "0"]))
                ok = pointee is not None and q_class in INTLIKE and q_size == INT_BY_REFERENCE[kind]
            else:
                ok = pointee is not None and pointee in _aliases_of(kind[1:], abi.header_text)
            if not ok:
                problems.append(f"{fn} argument {i}: the sensor passes {kind}, nvml.h declares {param!r}")
    assert not problems, "\n".join(problems)


def test_the_native_samplers_nvml_structs_are_nvml_hs(tmp_path: Path) -> None:
    """gpuprobe/nvml/native/sampler.c declares its own copies of the structs it passes to NVML (it does not
    include nvml.h, which ships only with the dev extra): compiled in one unit with the header, each copy
    must have nvml.h's size and field offsets, or the build fails here."""
    from gpuprobe.nvml import native

    pairs = {  # the sampler's struct -> (nvml.h's, the fields compared)
        "nvml_field": ("nvmlFieldValue_t", ("fieldId", "scopeId", "timestamp", "valueType", "nvmlReturn", "value")),
        "nvml_util": ("nvmlUtilization_t", ("gpu", "memory")),
        "nvml_memory_v2": ("nvmlMemory_v2_t", ("version", "total", "reserved", "free", "used")),
        "nvml_memory": ("nvmlMemory_t", ("total", "free", "used")),
        "nvml_temperature_v1": ("nvmlTemperature_v1_t", ("version", "sensorType", "temperature")),
    }
    checks = []
    for mine, (theirs, fields) in pairs.items():
        checks.append(f'_Static_assert(sizeof({mine}) == sizeof({theirs}), "sizeof {mine}");')
        checks += [f'_Static_assert(offsetof({mine}, {f}) == offsetof({theirs}, {f}), "{mine}.{f}");' for f in fields]
    unit = tmp_path / "unit.c"
    unit.write_text(
        f'#include <stddef.h>\n#include "{HEADER}"\n#include "{native.SOURCE}"\n' + "\n".join(checks) + "\n"
    )
    done = subprocess.run(
        ["gcc", "-fsyntax-only", "-Wall", "-Werror", str(unit)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
