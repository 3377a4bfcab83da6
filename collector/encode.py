"""Part: collector. Samples to InfluxDB line protocol, exactly (the storage schema is docs/schema.md).

How each name and value is escaped and formatted is :mod:`gpuprobe.influx.lineprotocol`'s job (the
one writer gpuprobe has); this module decides which samples and values become which lines, and
does it fast. Values that cannot be stored (NaN, beyond int64, a bad string, an unknown GPU, a
timestamp out of the window) are dropped and reported, never altered.

The hot path is :class:`StreamEncoder`, one per agent stream: the tag part of each series
(``gpu,cluster=...,host=...,uuid=... ``) is escaped once and cached. The GPU samples of a batch are
read column by column (one ``map(attrgetter(field), samples)`` per field), and presence is asked
only where a column holds zeros (an absent field reads as zero), for a whole column at once; a field
no sample has is left out altogether. All numbers are then laid out row by row in one list,
formatted by one ``orjson.dumps`` call (Ryu: about ten times faster than ``repr`` per float) and
spliced into one cached bytes ``%`` template per series and set of present fields (a field only some
samples lack is consumed by ``%.0s`` in theirs). Whole-column checks (no NaN or infinity, the uint64
columns within int64, all timestamps in the window, all GPU indices known) decide whether that fast
path applies; otherwise every sample goes through the exact, slower per-value path that also reports
what it dropped. Both paths write identical text.

The GPU health fields (ECC, remapping, violations, GPM, NVLink totals, ``health``,
``health_reason``: the field catalogue, :mod:`gpuprobe.fields`, marks them) are read by the agent
once per health interval, so nine samples of ten lack them. Which of them any sample of a batch has
is asked once per batch (the batch parsed again with its GPU samples merged into one message,
:func:`_gpu_health_fields`); a batch without them takes the fast path over the 16 per-tick fields
as before, and in a batch with them only the samples that carry one go through the exact path. The
health measurements (``gpu_event``, ``gpu_process``, ``gpu_nvlink``, ``gpu_mig``) are low volume
and take the exact path only.

GPU aggregates (``SampleBatch.gpu_aggregates``: mean, min, max and last of a GPU's fields over an
interval, one ``gpu`` point tagged ``res`` each) carry up to four times 43 fields, mostly present,
so they are read row by row: each role's present fields from one ``ListFields`` call, joined with
cached ``key=`` pieces (suffixed ``_min``, ``_max``, ``_last``), the numbers of the whole batch
formatted by one ``orjson.dumps`` call. Anything that cannot be written whole (a bad value, GPU,
interval or timestamp) sends every aggregate of the batch through the exact path, which writes the
same text and reports what it dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any

import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from gpuprobe.fields import GPU_FIELD, GPU_FIELDS
from gpuprobe.influx.lineprotocol import float_text, quote_string_field, series_prefix
from gpuprobe.influx.storable import INT64_MAX, tag_value_problem
from gpuprobe.v1 import common_pb2, telemetry_pb2
from gpuprobe.wire.validate import (
    INVALID_STRING,
    MAX_AGGREGATE_INTERVAL_MS,
    MISSING_FIELD,
    NON_FINITE_VALUE,
    TIMESTAMP_OUT_OF_RANGE,
    UNKNOWN_GPU,
    Identity,
    Limits,
    Problems,
    aggregate_problem,
    clean_string_field,
    sensor_name_problem,
)
from gpuprobe.wire.vocabulary import PHASE_NAMES, PROBE_EVENT_KIND_NAMES, STATUS_NAMES

# measurement names (docs/schema.md)
GPU = "gpu"
NODE = "node"
ACOUSTIC = "acoustic"
TRAINER = "trainer"
PROBE = "probe"
AGENT = "agent"
GPU_INFO = "gpu_info"
GPU_EVENT = "gpu_event"
GPU_PROCESS = "gpu_process"
GPU_NVLINK = "gpu_nvlink"
GPU_MIG = "gpu_mig"

_FLOAT, _INT, _BOOL = 0, 1, 2
_CACHE_LIMIT = 4096

# `device` tag of trainer points; UNSPECIFIED (an older trainer) writes no tag
TRAINER_DEVICES: dict[int, str] = {
    telemetry_pb2.TRAINER_DEVICE_CUDA: "cuda",
    telemetry_pb2.TRAINER_DEVICE_CPU: "cpu",
    telemetry_pb2.TRAINER_DEVICE_SIM: "sim",
}
# `health` string field of gpu points; UNSPECIFIED (not judged) is not written
HEALTHS: dict[int, str] = {
    common_pb2.GPU_HEALTH_HEALTHY: "healthy",
    common_pb2.GPU_HEALTH_DEGRADED: "degraded",
    common_pb2.GPU_HEALTH_FAILED: "failed",
}
# `kind` tag of gpu_event points; UNSPECIFIED is refused
GPU_EVENT_KINDS: dict[int, str] = {
    telemetry_pb2.GPU_EVENT_KIND_XID: "xid",
    telemetry_pb2.GPU_EVENT_KIND_ECC_SINGLE_BIT: "ecc_sbe",
    telemetry_pb2.GPU_EVENT_KIND_ECC_DOUBLE_BIT: "ecc_dbe",
    telemetry_pb2.GPU_EVENT_KIND_CLOCK_CHANGE: "clock_change",
    telemetry_pb2.GPU_EVENT_KIND_POWER_SOURCE_CHANGE: "power_source_change",
    telemetry_pb2.GPU_EVENT_KIND_LOST: "lost",
    telemetry_pb2.GPU_EVENT_KIND_RECOVERED: "recovered",
}
SOURCES: dict[int, str] = {
    telemetry_pb2.ACOUSTIC_SOURCE_MIC: "mic",
    telemetry_pb2.ACOUSTIC_SOURCE_PROXY: "proxy",
}


# --- per-message field tables --------------------------------------------------------------------

Spec = tuple[str, int, bool]  # proto field name (= field key), kind, optional (presence-tracked)


def _specs(message: Any, skip: Iterable[str]) -> tuple[Spec, ...]:
    from google.protobuf.descriptor import FieldDescriptor as FD

    skipped = set(skip)
    specs: list[Spec] = []
    for fd in message.DESCRIPTOR.fields:
        if fd.name in skipped:
            continue
        if fd.cpp_type in (FD.CPPTYPE_DOUBLE, FD.CPPTYPE_FLOAT):
            kind = _FLOAT
        elif fd.cpp_type in (FD.CPPTYPE_UINT32, FD.CPPTYPE_UINT64, FD.CPPTYPE_INT32, FD.CPPTYPE_INT64):
            kind = _INT
        elif fd.cpp_type == FD.CPPTYPE_BOOL:
            kind = _BOOL
        else:  # pragma: no cover - the table below lists every other field by hand
            raise TypeError(f"{message.DESCRIPTOR.name}.{fd.name}: no line-protocol kind")
        specs.append((fd.name, kind, fd.has_presence))
    return tuple(specs)


# every numeric field of a gpu point, and its string fields (the field catalogue's)
GPU_STRINGS = tuple(f.name for f in GPU_FIELDS if f.type == "string")
GPU_SPECS = _specs(telemetry_pb2.GpuSample, skip=("time_unix_ns", "gpu_index", *GPU_STRINGS))
# the fields read at every tick, the only ones of the fast path; the health fields (read once per
# health interval) send a sample through the exact path
GPU_FAST_SPECS = tuple(spec for spec in GPU_SPECS if not GPU_FIELD[spec[0]].health)
GPU_HEALTH_FIELDS = tuple(f.name for f in GPU_FIELDS if f.health)
PROCESS_SPECS = _specs(telemetry_pb2.ProcessSample, skip=("time_unix_ns", "gpu_index", "pid", "command", "cgroup"))
PROCESS_STRINGS = ("command", "cgroup")
NVLINK_SPECS = _specs(telemetry_pb2.NvLinkSample, skip=("time_unix_ns", "gpu_index", "link"))
MIG_SPECS = _specs(telemetry_pb2.MigSample, skip=("time_unix_ns", "gpu_index", "gpu_instance_id", "mig_uuid", "name"))
MIG_STRINGS = ("name",)
NODE_SPECS = _specs(telemetry_pb2.NodeSample, skip=("time_unix_ns", "hwmon_temp_c"))
ACOUSTIC_SPECS = _specs(telemetry_pb2.AcousticSample, skip=("time_unix_ns", "source", "gpu_index"))
TRAINER_SPECS = _specs(
    telemetry_pb2.TrainerSample, skip=("time_unix_ns", "probe_id", "workload", "gpu_index", "phase", "device")
)
# the numeric fields of a study's probe event (the rest are enums and strings, handled by hand)
PROBE_EVENT_SPECS = _specs(
    telemetry_pb2.ProbeEvent,
    skip=("time_unix_ns", "probe_id", "workload", "kind", "phase", "status", "message", "gpu_index", "power_limit"),
)
AGENT_SPECS = _specs(telemetry_pb2.AgentStats, skip=())
# gpu_info: the numeric fields (all presence-tracked but memory_total_bytes, which is written when
# not zero) and the free-text string fields (cleaned like ProbeEvent.message, cut to this many bytes)
GPU_INFO_SPECS: tuple[Spec, ...] = (
    ("temp_slowdown_c", _FLOAT, True),
    ("temp_shutdown_c", _FLOAT, True),
    ("temp_gpu_max_c", _FLOAT, True),
    ("temp_mem_max_c", _FLOAT, True),
    ("power_limit_min_w", _FLOAT, True),
    ("power_limit_max_w", _FLOAT, True),
    ("power_limit_default_w", _FLOAT, True),
    ("pcie_gen_max", _INT, True),
    ("pcie_width_max", _INT, True),
    ("fan_count", _INT, True),
    ("passive_cooling", _BOOL, True),
    ("mig_enabled", _BOOL, True),
    ("gpm_supported", _BOOL, True),
)
GPU_INFO_STRINGS = ("driver_version", "vbios_version", "architecture", "compute_capability")
GPU_INFO_STRING_BYTES = 256

# the GpuSample messages of a GpuAggregate and the suffix of their field keys (docs/schema.md)
AGGREGATE_ROLES = (("mean", ""), ("min", "_min"), ("max", "_max"), ("last", "_last"))
# the integer field of an aggregated point: how many samples its interval held
AGGREGATE_COUNT_FIELD = "samples"


def resolution_tag(interval_ms: int) -> str:
    """The ``res`` tag of an aggregate over ``interval_ms``: the largest whole unit of h, m, s
    that divides it, else ms (``1h``, ``5m``, ``1s``, ``90s``, ``500ms``, ``1500ms``), so each
    interval has exactly one spelling and a dashboard can write it as an InfluxQL duration."""
    for unit_ms, unit in ((3_600_000, "h"), (60_000, "m"), (1000, "s")):
        if interval_ms % unit_ms == 0:
            return f"{interval_ms // unit_ms}{unit}"
    return f"{interval_ms}ms"


_TEXT = 3  # the string fields of a gpu point (GPU_STRINGS), in _AGGREGATE_KEYS


# GpuSample field descriptor -> the key piece of the field after nothing, after a float or bool,
# after an integer (``k=``, ``,k=``, ``i,k=``), and its kind
_KeyTable = dict[Any, tuple[tuple[bytes, bytes, bytes], int]]


def _key_table(suffix: str) -> _KeyTable:
    """The gpu fields of one role of a GpuAggregate, their keys ending in ``suffix``."""
    kinds = {name: kind for name, kind, _ in GPU_SPECS} | dict.fromkeys(GPU_STRINGS, _TEXT)
    table: _KeyTable = {}
    for fd in telemetry_pb2.GpuSample.DESCRIPTOR.fields:
        if fd.name in kinds:
            key = f"{fd.name}{suffix}=".encode()
            table[fd] = ((key, b"," + key, b"i," + key), kinds[fd.name])
    return table


_AGGREGATE_KEYS = tuple((role, _key_table(suffix)) for role, suffix in AGGREGATE_ROLES)
_GPU_NAMES = tuple(name for name, _, _ in GPU_FAST_SPECS)
_N_GPU = len(_GPU_NAMES)
_ALL_GPU_FIELDS = (1 << _N_GPU) - 1
# zero of each field's Python type: list.count compares a float with 0.0 twice as fast as with 0
_GPU_ZEROS: tuple[float | int, ...] = tuple(0.0 if kind == _FLOAT else 0 for _, kind, _ in GPU_FAST_SPECS)
# the batch is read column by column: the fields in spec order, then the timestamps, the GPU indices
_GPU_COLUMNS = tuple(attrgetter(name) for name in (*_GPU_NAMES, "time_unix_ns", "gpu_index"))
# GpuSample.HasField unbound: map(_GPU_HAS, samples, repeat(name)) checks a whole column in C
_GPU_HAS: Callable[[telemetry_pb2.GpuSample, str], bool] = telemetry_pb2.GpuSample.HasField
# the columns whose type can hold values beyond int64
_UINT64_POSITIONS = tuple(
    i
    for i, fd in enumerate(telemetry_pb2.GpuSample.DESCRIPTOR.fields_by_name[n] for n in _GPU_NAMES)
    if fd.type == fd.TYPE_UINT64 or fd.type == fd.TYPE_INT64
)


def _merged_health_view() -> Any:
    """A message type that reads a serialized ``SampleBatch`` as if ``gpu_samples`` were a singular
    field of a message holding only the health fields: protobuf merges the repeated occurrences of a
    singular message field, so parsing merges every GPU sample of the batch into one message whose
    presence bits say which health fields *any* sample has, asked once per batch instead of once per
    sample and field (the other fields are skipped as unknown). Declared proto2, so that every field
    tracks presence; the types are the wire types (a bool or enum is a varint, a string bytes)."""
    types = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="gpuprobe_collector_health_view.proto", package="gpuprobe_collector_view", syntax="proto2"
    )
    health = file.message_type.add(name="Health")
    for fd in telemetry_pb2.GpuSample.DESCRIPTOR.fields:
        if fd.name in GPU_HEALTH_FIELDS:
            if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_STRING):
                kind = types.TYPE_DOUBLE if fd.type == fd.TYPE_DOUBLE else types.TYPE_BYTES
            else:
                assert fd.type in (fd.TYPE_UINT64, fd.TYPE_UINT32, fd.TYPE_BOOL, fd.TYPE_ENUM), fd.name
                kind = types.TYPE_UINT64
            health.field.add(name=fd.name, number=fd.number, label=types.LABEL_OPTIONAL, type=kind)
    view = file.message_type.add(name="MergedBatch")
    view.field.add(
        name="gpu_samples",
        number=telemetry_pb2.SampleBatch.DESCRIPTOR.fields_by_name["gpu_samples"].number,
        label=types.LABEL_OPTIONAL,
        type=types.TYPE_MESSAGE,
        type_name=".gpuprobe_collector_view.Health",
    )
    # the same, one level up: a serialized StreamRequest, as it came off the wire
    request = file.message_type.add(name="MergedRequest")
    request.field.add(
        name="batch",
        number=telemetry_pb2.StreamRequest.DESCRIPTOR.fields_by_name["batch"].number,
        label=types.LABEL_OPTIONAL,
        type=types.TYPE_MESSAGE,
        type_name=".gpuprobe_collector_view.MergedBatch",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    find = pool.FindMessageTypeByName
    return (
        message_factory.GetMessageClass(find("gpuprobe_collector_view.MergedBatch")),
        message_factory.GetMessageClass(find("gpuprobe_collector_view.MergedRequest")),
    )


_MERGED_BATCH, _MERGED_REQUEST = _merged_health_view()


def _gpu_health_fields(batch: telemetry_pb2.SampleBatch, request: bytes | None) -> list[str]:
    """The health fields (GPU_HEALTH_FIELDS) that at least one GPU sample of ``batch`` has.

    ``request`` is the serialized ``StreamRequest`` that carried ``batch``, when the caller has it:
    reading it costs about a twentieth of serializing the batch again."""
    if request is not None:
        merged = _MERGED_REQUEST.FromString(request).batch.gpu_samples
    else:
        merged = _MERGED_BATCH.FromString(batch.SerializeToString()).gpu_samples
    return [name for name in GPU_HEALTH_FIELDS if merged.HasField(name)]


def _join_rows(lines: list[tuple[bytes, int, int, bytes]], pieces: list[bytes], values: list[Any]) -> bytes | None:
    """The lines of a row-wise path: per line its series prefix, the range of its ``key=`` pieces
    and numbers, its tail. The numbers are formatted by one ``orjson.dumps`` call (as on the column
    path); None if one is NaN or infinite."""
    text = orjson.dumps(values)
    if b"null" in text:  # orjson writes NaN and the infinities as null: the exact path drops them
        return None
    numbers = text[1:-1].split(b",")
    parts: list[bytes] = []
    for prefix, start, end, tail in lines:
        chunk: list[bytes] = [b""] * (2 * (end - start))
        chunk[::2] = pieces[start:end]
        chunk[1::2] = numbers[start:end]
        parts.append(prefix)
        parts.extend(chunk)
        parts.append(tail)
    return b"".join(parts)


def _clean_text(value: str, max_bytes: int) -> str:
    """A free-text string field, cleaned and cut (validate.clean_string_field), quoted; "" if empty."""
    text = clean_string_field(value, max_bytes)
    return quote_string_field(text) if text else ""


def _checked_fields(msg: Message, specs: Sequence[Spec], problems: Problems, where: str, suffix: str = "") -> list[str]:
    """The exact ``key=value`` texts of ``msg``'s present fields (keys with ``suffix`` appended);
    what cannot be stored is reported."""
    parts: list[str] = []
    for name, kind, optional in specs:
        if optional and not msg.HasField(name):
            continue
        value = getattr(msg, name)
        if kind == _FLOAT:
            if value - value != 0.0:  # NaN or an infinity
                problems.value(NON_FINITE_VALUE, f"{where}: {name}{suffix} is {value!r}; value dropped")
                continue
            parts.append(f"{name}{suffix}={float_text(value)}")
        elif kind == _INT:
            if value > INT64_MAX:
                problems.value(
                    NON_FINITE_VALUE,
                    f"{where}: {name}{suffix}={value} is beyond the int64 range of InfluxDB integers; value dropped",
                )
                continue
            parts.append(f"{name}{suffix}={value}i")
        else:
            parts.append(f"{name}{suffix}={'true' if value else 'false'}")
    return parts


@dataclass(frozen=True)
class EncodedBatch:
    """A batch as line protocol: ``lines`` (UTF-8, each ending in ``\\n``) and what was dropped."""

    lines: bytes
    line_count: int
    sample_count: int
    problems: Problems


class StreamEncoder:
    """Encodes the batches of one agent stream; caches the escaped tag part of each series."""

    def __init__(self, identity: Identity, limits: Limits) -> None:
        self.identity = identity
        self.limits = limits
        self._identity_tags = identity.tags()
        self._node_prefix = series_prefix(NODE, self._identity_tags)
        self._agent_prefix = series_prefix(AGENT, self._identity_tags)
        self._gpu_prefixes: dict[tuple[int, str, str, str, str, str], str | tuple[int, str]] = {}
        self._templates: dict[tuple[str, int, int], tuple[bytes, bool]] = {}
        self._prefixes: dict[tuple[Any, ...], str | tuple[int, str]] = {}
        self._aggregate_prefixes: dict[tuple[str, int], bytes] = {}

    # --- public ----------------------------------------------------------------------------------

    def encode(
        self,
        batch: telemetry_pb2.SampleBatch,
        now_ns: int,
        request: bytes | None = None,
        *,
        clock_offset_ns: int | None = None,
    ) -> EncodedBatch:
        """All samples of ``batch`` that can be stored, as line protocol, plus the problems found.

        ``request``: the serialized ``StreamRequest`` that ``batch`` was parsed from, if the caller
        kept it (optional; it makes finding the health samples cheaper, the result is the same).
        ``clock_offset_ns``: how far the agent's clock was off at the stream's Hello (``clock.py``),
        stored with its health point."""
        problems = Problems(seq=batch.seq)
        low, high = self.limits.time_window_ns(now_ns)
        out: list[bytes] = []
        gpus = self._resolve_gpus(batch.gpus)
        gpu_lines = self._encode_gpu(batch, request, gpus, low, high, problems, out) if batch.gpu_samples else 0
        gpu_chunks = len(out)
        refs: dict[int, telemetry_pb2.GpuRef] | None = None
        if batch.gpu_aggregates:
            refs = {ref.index: ref for ref in batch.gpus}
            fast_aggregates = self._encode_gpu_aggregates_fast(batch.gpu_aggregates, gpus, refs, low, high)
            if fast_aggregates is not None:
                out.append(fast_aggregates[0])
                gpu_lines += fast_aggregates[1] - 1  # the chunk itself is counted below
            else:
                for i, aggregate in enumerate(batch.gpu_aggregates):
                    self._encode_gpu_aggregate(i, aggregate, gpus, refs, low, high, problems, out)
        for i, node in enumerate(batch.node_samples):
            self._encode_node(i, node, low, high, problems, out)
        for i, acoustic in enumerate(batch.acoustic_samples):
            self._encode_acoustic(i, acoustic, gpus, low, high, problems, out)
        for i, trainer in enumerate(batch.trainer_samples):
            self._encode_trainer(i, trainer, gpus, low, high, problems, out)
        for i, event in enumerate(batch.probe_events):
            self._encode_probe_event(i, event, low, high, problems, out)
        if batch.HasField("stats"):
            self._encode_stats(batch, clock_offset_ns, low, high, problems, out)
        for i, info in enumerate(batch.gpu_info):
            self._encode_gpu_info(i, info, batch.created_unix_ns, low, high, problems, out)
        if batch.gpu_events or batch.process_samples or batch.nvlink_samples or batch.mig_samples:
            if refs is None:
                refs = {ref.index: ref for ref in batch.gpus}
            for i, gpu_event in enumerate(batch.gpu_events):
                self._encode_gpu_event(i, gpu_event, gpus, refs, low, high, problems, out)
            for i, process in enumerate(batch.process_samples):
                self._encode_process(i, process, gpus, refs, low, high, problems, out)
            for i, link in enumerate(batch.nvlink_samples):
                self._encode_nvlink(i, link, gpus, refs, low, high, problems, out)
            for i, mig in enumerate(batch.mig_samples):
                self._encode_mig(i, mig, gpus, refs, low, high, problems, out)
        count = (
            len(batch.gpu_samples)
            + len(batch.gpu_aggregates)
            + len(batch.node_samples)
            + len(batch.acoustic_samples)
            + len(batch.trainer_samples)
            + len(batch.probe_events)
            + len(batch.gpu_info)
            + len(batch.gpu_events)
            + len(batch.process_samples)
            + len(batch.nvlink_samples)
            + len(batch.mig_samples)
        )
        return EncodedBatch(b"".join(out), gpu_lines + len(out) - gpu_chunks, count, problems)

    # --- shared checks ---------------------------------------------------------------------------

    def _time_ok(self, time_ns: int, low: int, high: int, problems: Problems, where: str) -> bool:
        if low <= time_ns <= high:
            return True
        if time_ns < 1:
            problems.sample(TIMESTAMP_OUT_OF_RANGE, f"{where}: time_unix_ns {time_ns} is zero or negative")
            return False
        if self.limits.timestamp_policy == "flag":
            problems.flagged_timestamps += 1
            return True
        side = "in the future" if time_ns > high else "in the past"
        limit = self.limits.max_clock_skew_s if time_ns > high else self.limits.max_sample_age_s
        problems.sample(
            TIMESTAMP_OUT_OF_RANGE,
            f"{where}: time_unix_ns {time_ns} is more than {limit:g} s {side} of the collector's clock",
        )
        return False

    def _resolve_gpus(self, refs: Iterable[telemetry_pb2.GpuRef]) -> dict[int, str | tuple[int, str]]:
        """GPU index -> the escaped ``gpu`` series prefix, or (reason, message) when it is unusable."""
        resolved: dict[int, str | tuple[int, str]] = {}
        for ref in refs:
            key = (ref.index, ref.uuid, ref.name, ref.pod, ref.namespace, ref.container)
            prefix = self._gpu_prefixes.get(key)
            if prefix is None:
                prefix = self._gpu_prefix(ref)
                if len(self._gpu_prefixes) >= _CACHE_LIMIT:
                    self._gpu_prefixes.clear()
                self._gpu_prefixes[key] = prefix
            earlier = resolved.get(ref.index)
            if earlier is not None and earlier != prefix:
                resolved[ref.index] = (
                    UNKNOWN_GPU,
                    f"gpu index {ref.index} is listed twice in SampleBatch.gpus with different uuid or name",
                )
            else:
                resolved[ref.index] = prefix
        return resolved

    def _gpu_prefix(self, ref: telemetry_pb2.GpuRef) -> str | tuple[int, str]:
        for what, value in _ref_strings(ref):
            if value:
                problem = tag_value_problem(value, self.limits.max_tag_bytes)
                if problem is not None:
                    return INVALID_STRING, f"SampleBatch.gpus index {ref.index}: {what} {value[:80]!r} {problem}"
        return series_prefix(GPU, dict(self._identity_tags, **_ref_tags(ref)))

    def _tag_problem(self, what: str, value: str) -> str | None:
        problem = tag_value_problem(value, self.limits.max_tag_bytes)
        return None if problem is None else f"{what} {value[:80]!r} {problem}"

    def _cached_prefix(self, key: tuple[Any, ...], measurement: str, tags: Mapping[str, str]) -> str:
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) >= _CACHE_LIMIT:
                self._prefixes.clear()
            prefix = self._prefixes[key] = series_prefix(measurement, tags)
        assert isinstance(prefix, str)
        return prefix

    # --- gpu: the hot path -----------------------------------------------------------------------

    def _encode_gpu(
        self,
        batch: telemetry_pb2.SampleBatch,
        request: bytes | None,
        gpus: Mapping[int, str | tuple[int, str]],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> int:
        """Appends the GPU lines to ``out`` (one chunk on the fast path); returns how many.

        Samples without health fields (the 10 Hz ones) take the fast path; the samples that carry
        health fields (once per health interval) take the exact path."""
        listed = list(batch.gpu_samples)  # the message wrappers, made once: every later pass reuses them
        health = _gpu_health_fields(batch, request)
        plain: list[tuple[int, telemetry_pb2.GpuSample]] | None = None  # None: all, at their positions
        carrying: list[tuple[int, telemetry_pb2.GpuSample]] = []
        if health:
            carries = [False] * len(listed)
            for name in health:
                if name == "health_reason":
                    column = list(map(bool, map(attrgetter(name), listed)))
                else:
                    column = list(map(_GPU_HAS, listed, repeat(name)))
                carries = list(map(bool.__or__, carries, column))
            plain = [(i, sample) for i, sample in enumerate(listed) if not carries[i]]
            carrying = [(i, sample) for i, sample in enumerate(listed) if carries[i]]
            listed = [sample for _, sample in plain]
        before = len(out)
        lines = 0
        if listed:
            prefixes = {index: prefix for index, prefix in gpus.items() if isinstance(prefix, str)}
            fast = self._encode_gpu_fast(listed, prefixes, low, high, problems) if len(prefixes) == len(gpus) else None
            if fast is not None:
                out.append(fast[0])
                lines = fast[1] - 1  # the chunk itself is counted below
            else:
                for i, sample in plain if plain is not None else enumerate(listed):
                    self._encode_gpu_checked(i, sample, gpus, low, high, problems, out)
        for i, sample in carrying:
            self._encode_gpu_checked(i, sample, gpus, low, high, problems, out)
        return lines + len(out) - before

    def _encode_gpu_fast(
        self,
        samples: list[telemetry_pb2.GpuSample],
        prefixes: dict[int, str],
        low: int,
        high: int,
        problems: Problems,
    ) -> tuple[bytes, int] | None:
        """The lines of a batch whose every value can be written (finite, within int64, every
        timestamp in the window, every GPU index known) and their count; None when one cannot, and
        then nothing has been reported yet (see the module docstring for how)."""
        n = len(samples)
        # the 16 field columns, the timestamps, the GPU indices: one C loop per column
        columns: list[list[Any]] = [list(map(column, samples)) for column in _GPU_COLUMNS]
        times = columns[_N_GPU]
        if min(times) < low or max(times) > high:
            return None
        # the uint64 columns are >= 0; only their maxima can be beyond int64
        if any(max(columns[i]) > INT64_MAX for i in _UINT64_POSITIONS):
            return None
        # an absent field reads as zero, so only a column holding zeros needs its presence asked:
        # `dropped` are the fields no sample has (left out of the numbers), `hidden` the fields that
        # only some samples lack (their zero is consumed by "%.0s")
        has = _GPU_HAS
        dropped = 0
        hidden: dict[int, int] = {}
        for bit, column in enumerate(columns[:_N_GPU]):
            if all(column):
                continue
            zero = _GPU_ZEROS[bit]
            zeros = column.count(zero)
            name = _GPU_NAMES[bit]
            if zeros > n >> 3:
                present = list(map(has, samples, repeat(name, n)))
                missing = present.count(False)
                if missing == n:
                    dropped |= 1 << bit
                    continue
                position = -1
                for _ in range(missing):
                    position = present.index(False, position + 1)
                    hidden[position] = hidden.get(position, 0) | 1 << bit
            else:
                position = -1
                for _ in range(zeros):
                    position = column.index(zero, position + 1)
                    if not has(samples[position], name):
                        hidden[position] = hidden.get(position, 0) | 1 << bit
        kept = [column for bit, column in enumerate(columns[:_N_GPU]) if not dropped >> bit & 1]
        kept.append(times)
        width = len(kept)
        flat: list[Any] = [None] * (width * n)
        for offset, column in enumerate(kept):
            flat[offset::width] = column
        text = orjson.dumps(flat)
        if b"null" in text:  # orjson writes NaN and the infinities as null: the exact path drops them
            return None
        get = self._templates.get
        chosen_by_index: dict[int, bytes] = {}
        for index, prefix in prefixes.items():
            entry = get((prefix, dropped, 0)) or self._gpu_template(prefix, dropped, 0)
            chosen_by_index[index] = entry[0]
        indexes = columns[_N_GPU + 1]
        try:
            chosen = list(map(chosen_by_index.__getitem__, indexes))
        except KeyError:  # a GPU index not in SampleBatch.gpus
            return None
        empty: list[int] = []  # the positions of samples without any value, in order
        if dropped == _ALL_GPU_FIELDS:
            empty = list(range(n))
        else:
            for position in sorted(hidden):
                prefix = prefixes[indexes[position]]
                absent = hidden[position]
                entry = get((prefix, dropped, absent)) or self._gpu_template(prefix, dropped, absent)
                chosen[position] = entry[0]
                if not entry[1]:
                    empty.append(position)
        if empty:
            # the exact path's message when the finite values of the batch add up beyond the float
            # range (the fast path did not apply there before, and a rejection keeps its first message)
            total = sum(map(sum, zip(*columns[: _N_GPU + 1], strict=True)))  # as it was summed then
            if total - total != 0.0:
                return None
            problems.sample(MISSING_FIELD, f"gpu_samples: a gpu {indexes[empty[0]]} sample has no values", len(empty))
        # "[a,b,...,z]" -> a, b, ..., z
        numbers = text.split(b",")
        numbers[0] = numbers[0][1:]
        numbers[-1] = numbers[-1][:-1]
        return b"".join(chosen) % tuple(numbers), n - len(empty)

    def _gpu_template(self, prefix: str, dropped: int, hidden: int) -> tuple[bytes, bool]:
        """The bytes ``%`` template of one series and set of present fields, and whether it writes a
        line at all. It consumes one number per field not in ``dropped``, then the timestamp; a
        ``hidden`` field's zero is formatted as nothing (``%.0s``), which is cheaper than taking it
        out of the numbers."""
        pieces = [prefix.replace("%", "%%")]
        first = True
        consumed = 1
        for bit, (name, kind, _) in enumerate(GPU_FAST_SPECS):
            if dropped >> bit & 1:
                continue
            consumed += 1
            if hidden >> bit & 1:
                pieces.append("%.0s")
                continue
            pieces.append(("" if first else ",") + (f"{name}=%si" if kind == _INT else f"{name}=%s"))
            first = False
        pieces.append(" %s\n")
        entry = ("".join(pieces).encode(), True) if not first else (consumed * b"%.0s", False)
        if len(self._templates) >= _CACHE_LIMIT:
            self._templates.clear()
        self._templates[(prefix, dropped, hidden)] = entry
        return entry

    def _encode_gpu_checked(
        self,
        i: int,
        sample: telemetry_pb2.GpuSample,
        gpus: Mapping[int, str | tuple[int, str]],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        index, time_ns = sample.gpu_index, sample.time_unix_ns
        where = f"gpu_samples[{i}] (gpu {index}, time {time_ns})"
        prefix = gpus.get(index)
        if prefix is None:
            problems.sample(UNKNOWN_GPU, f"{where}: gpu index {index} is not in SampleBatch.gpus")
            return
        if not isinstance(prefix, str):
            problems.sample(prefix[0], f"{where}: {prefix[1]}")
            return
        if not self._time_ok(time_ns, low, high, problems, where):
            return
        parts = _checked_fields(sample, GPU_SPECS, problems, where)
        health = HEALTHS.get(int(sample.health))
        if health is not None:
            parts.append(f'health="{health}"')
        reason = _clean_text(sample.health_reason, self.limits.max_string_field_bytes)
        if reason:
            parts.append(f"health_reason={reason}")
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        out.append(f"{prefix}{','.join(parts)} {time_ns}\n".encode())

    # --- gpu aggregates: one point per GPU and interval, tagged `res` -----------------------------

    def _encode_gpu_aggregate(
        self,
        i: int,
        aggregate: telemetry_pb2.GpuAggregate,
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        index, time_ns = aggregate.gpu_index, aggregate.start_unix_ns
        where = f"gpu_aggregates[{i}] (gpu {index}, start {time_ns})"
        problem = aggregate_problem(aggregate)
        if problem is not None:
            problems.sample(MISSING_FIELD, f"{where}: {problem}")
            return
        res = resolution_tag(aggregate.interval_ms)
        prefix = self._gpu_series(GPU, index, gpus, refs, {"res": res}, problems, where)
        if prefix is None or not self._time_ok(time_ns, low, high, problems, where):
            return
        parts: list[str] = []
        texts: list[str] = []  # the string fields, after every number (the fast path's order)
        limit = self.limits.max_string_field_bytes
        for role, suffix in AGGREGATE_ROLES:
            if not aggregate.HasField(role):
                continue
            sample = getattr(aggregate, role)
            parts.extend(_checked_fields(sample, GPU_SPECS, problems, where, suffix))
            health = HEALTHS.get(int(sample.health))
            if health is not None:
                texts.append(f'health{suffix}="{health}"')
            reason = _clean_text(sample.health_reason, limit)
            if reason:
                texts.append(f"health_reason{suffix}={reason}")
        parts.extend(texts)
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        out.append(f"{prefix}{','.join(parts)},samples={aggregate.sample_count}i {time_ns}\n".encode())

    def _encode_gpu_aggregates_fast(
        self,
        aggregates: Sequence[telemetry_pb2.GpuAggregate],
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
        low: int,
        high: int,
    ) -> tuple[bytes, int] | None:
        """The lines of aggregates that all can be written whole, and their count; None when one
        cannot (then :meth:`_encode_gpu_aggregate` reports it, and nothing was reported here).

        Each role's present fields come from one ``ListFields`` call (field number order, which is
        GPU_SPECS' order), the numbers of the whole batch are formatted by one ``orjson.dumps``
        and joined with cached ``key=`` pieces: the text of the exact path, at a fraction of the
        cost of asking every field's presence (see the module docstring)."""
        pieces: list[bytes] = []  # the ``key=`` piece before each number
        values: list[Any] = []  # the numbers, in the same order
        lines: list[tuple[bytes, int, int, bytes]] = []  # per line: prefix, its range in pieces, tail
        ints: list[int] = []
        keys = _AGGREGATE_KEYS
        limit = self.limits.max_string_field_bytes
        prefixes = self._aggregate_prefixes
        for aggregate in aggregates:
            interval_ms = aggregate.interval_ms
            time_ns = aggregate.start_unix_ns
            count = aggregate.sample_count
            if not (0 < interval_ms <= MAX_AGGREGATE_INTERVAL_MS and count and low <= time_ns <= high):
                return None
            index = aggregate.gpu_index
            series = gpus.get(index)
            if not isinstance(series, str):
                return None
            prefix = prefixes.get((series, interval_ms))
            if prefix is None:
                prefix = self._aggregate_prefix(series, index, interval_ms, gpus, refs)
            texts: list[bytes] = []
            start = len(pieces)
            after = 0  # what the next key follows: 0 nothing (no comma), 1 a float or bool, 2 an integer
            for role, table in keys:
                if not aggregate.HasField(role):
                    continue
                for fd, value in getattr(aggregate, role).ListFields():
                    entry = table.get(fd)
                    if entry is None:  # mean's time_unix_ns and gpu_index are not fields
                        continue
                    key, kind = entry
                    if kind == _INT:
                        pieces.append(key[after])
                        values.append(value)
                        ints.append(value)
                        after = 2
                    elif kind != _TEXT:
                        pieces.append(key[after])
                        values.append(value)
                        after = 1
                    elif fd.name == "health":
                        health = HEALTHS.get(int(value))
                        if health is not None:
                            texts.append(b'%s"%s"' % (key[0], health.encode()))
                    else:
                        text = _clean_text(value, limit)
                        if text:
                            texts.append(key[0] + text.encode())
            if not after and not texts:
                return None  # no value: the exact path reports it
            tail = b"i" if after == 2 else b""
            if texts:
                tail += (b"," if after else b"") + b",".join(texts)
            lines.append((prefix, start, len(pieces), b"%s,samples=%di %d\n" % (tail, count, time_ns)))
        if ints and max(ints) > INT64_MAX:
            return None
        joined = _join_rows(lines, pieces, values)
        return None if joined is None else (joined, len(lines))

    def _aggregate_prefix(
        self,
        series: str,
        index: int,
        interval_ms: int,
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
    ) -> bytes:
        """The series prefix (bytes) of GPU ``index``'s aggregates over ``interval_ms``; cached by the
        GPU's raw prefix, which stands for its tags."""
        unused = Problems(seq=0)  # the GPU resolved to a prefix: no tag problem can arise
        prefix = self._gpu_series(GPU, index, gpus, refs, {"res": resolution_tag(interval_ms)}, unused, "")
        assert prefix is not None and not unused
        if len(self._aggregate_prefixes) >= _CACHE_LIMIT:
            self._aggregate_prefixes.clear()
        encoded = self._aggregate_prefixes[(series, interval_ms)] = prefix.encode()
        return encoded

    # --- the other measurements (low volume: the exact path only) --------------------------------

    def _encode_node(
        self, i: int, sample: telemetry_pb2.NodeSample, low: int, high: int, problems: Problems, out: list[bytes]
    ) -> None:
        time_ns = sample.time_unix_ns
        where = f"node_samples[{i}] (time {time_ns})"
        if not self._time_ok(time_ns, low, high, problems, where):
            return
        parts = _checked_fields(sample, NODE_SPECS, problems, where)
        for name in sorted(sample.hwmon_temp_c):
            value = sample.hwmon_temp_c[name]
            problem = sensor_name_problem(name)
            if problem is not None:
                problems.value(INVALID_STRING, f"{where}: {problem}; value dropped")
            elif value - value != 0.0:
                problems.value(NON_FINITE_VALUE, f"{where}: hwmon {name} is {value!r}; value dropped")
            else:
                parts.append(f"hwmon_{name}_c={float_text(value)}")
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        out.append(f"{self._node_prefix}{','.join(parts)} {time_ns}\n".encode())

    def _gpu_tag(
        self, has_gpu: bool, index: int, gpus: Mapping[int, Any], problems: Problems, where: str
    ) -> str | None:
        """The ``gpu`` tag value ("" for none), or None when the index is unknown (reported)."""
        if not has_gpu:
            return ""
        if index not in gpus:
            problems.sample(UNKNOWN_GPU, f"{where}: gpu index {index} is not in SampleBatch.gpus")
            return None
        return str(index)

    def _encode_acoustic(
        self,
        i: int,
        sample: telemetry_pb2.AcousticSample,
        gpus: Mapping[int, Any],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        time_ns = sample.time_unix_ns
        where = f"acoustic_samples[{i}] (time {time_ns})"
        source = SOURCES.get(sample.source)
        if source is None:
            problems.sample(MISSING_FIELD, f"{where}: source is unspecified or unknown ({sample.source})")
            return
        gpu = self._gpu_tag(sample.HasField("gpu_index"), sample.gpu_index, gpus, problems, where)
        if gpu is None or not self._time_ok(time_ns, low, high, problems, where):
            return
        parts = _checked_fields(sample, ACOUSTIC_SPECS, problems, where)
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        prefix = self._cached_prefix(
            (ACOUSTIC, source, gpu), ACOUSTIC, dict(self._identity_tags, source=source, gpu=gpu)
        )
        out.append(f"{prefix}{','.join(parts)} {time_ns}\n".encode())

    def _encode_trainer(
        self,
        i: int,
        sample: telemetry_pb2.TrainerSample,
        gpus: Mapping[int, Any],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        time_ns = sample.time_unix_ns
        where = f"trainer_samples[{i}] (time {time_ns})"
        if not sample.workload:
            problems.sample(MISSING_FIELD, f"{where}: workload is empty")
            return
        phase = PHASE_NAMES.get(sample.phase)
        if phase is None:
            problems.sample(MISSING_FIELD, f"{where}: phase is unspecified or unknown ({sample.phase})")
            return
        for what, value in (("workload", sample.workload), ("probe_id", sample.probe_id)):
            problem = self._tag_problem(what, value) if value else None
            if problem is not None:
                problems.sample(INVALID_STRING, f"{where}: {problem}")
                return
        gpu = self._gpu_tag(sample.HasField("gpu_index"), sample.gpu_index, gpus, problems, where)
        if gpu is None or not self._time_ok(time_ns, low, high, problems, where):
            return
        device = TRAINER_DEVICES.get(int(sample.device), "")
        parts = _checked_fields(sample, TRAINER_SPECS, problems, where)
        parts.append(f'phase="{phase}"')
        key = (TRAINER, sample.probe_id, sample.workload, gpu, device)
        tags = dict(self._identity_tags, probe=sample.probe_id, workload=sample.workload, gpu=gpu, device=device)
        out.append(f"{self._cached_prefix(key, TRAINER, tags)}{','.join(parts)} {time_ns}\n".encode())

    def _encode_probe_event(
        self, i: int, event: telemetry_pb2.ProbeEvent, low: int, high: int, problems: Problems, out: list[bytes]
    ) -> None:
        time_ns = event.time_unix_ns
        where = f"probe_events[{i}] (time {time_ns})"
        for what, value in (("probe_id", event.probe_id), ("workload", event.workload)):
            if not value:
                problems.sample(MISSING_FIELD, f"{where}: {what} is empty")
                return
        problem = self._tag_problem("probe_id", event.probe_id)
        if problem is None:
            problem = self._tag_problem("workload", event.workload)
        if problem is not None:
            problems.sample(INVALID_STRING, f"{where}: {problem}")
            return
        texts = []
        enums: tuple[tuple[str, dict[int, str], int], ...] = (
            ("kind", PROBE_EVENT_KIND_NAMES, int(event.kind)),
            ("phase", PHASE_NAMES, int(event.phase)),
            ("status", STATUS_NAMES, int(event.status)),
        )
        for what, table, number in enums:
            text = table.get(number)
            if text is None:
                problems.sample(MISSING_FIELD, f"{where}: {what} is unspecified or unknown ({number})")
                return
            texts.append(f'{what}="{text}"')
        if not self._time_ok(time_ns, low, high, problems, where):
            return
        texts.append(f"workload={quote_string_field(event.workload)}")
        message = clean_string_field(event.message, self.limits.max_string_field_bytes)
        if message:
            texts.append(f"message={quote_string_field(message)}")
        if event.HasField("gpu_index"):
            texts.append(f'gpu="{event.gpu_index}"')
        power_limit = clean_string_field(event.power_limit, 64)
        if power_limit:
            texts.append(f"power_limit={quote_string_field(power_limit)}")
        texts.extend(_checked_fields(event, PROBE_EVENT_SPECS, problems, where))
        prefix = self._cached_prefix((PROBE, event.probe_id), PROBE, dict(self._identity_tags, probe=event.probe_id))
        out.append(f"{prefix}{','.join(texts)} {time_ns}\n".encode())

    def _encode_stats(
        self,
        batch: telemetry_pb2.SampleBatch,
        clock_offset_ns: int | None,
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        time_ns = batch.created_unix_ns
        where = f"stats (created_unix_ns {time_ns})"
        if not low <= time_ns <= high and not (time_ns >= 1 and self.limits.timestamp_policy == "flag"):
            problems.value(TIMESTAMP_OUT_OF_RANGE, f"{where}: out of range; agent health point dropped")
            return
        parts = _checked_fields(batch.stats, AGENT_SPECS, problems, where)
        if clock_offset_ns is not None:
            parts.append(f"clock_offset_s={float_text(clock_offset_ns / 1e9)}")
        if parts:
            out.append(f"{self._agent_prefix}{','.join(parts)} {time_ns}\n".encode())

    def _encode_gpu_info(
        self,
        i: int,
        info: common_pb2.GpuInfo,
        time_ns: int,
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        """One ``gpu_info`` point, stamped with the batch's creation time (a replay overwrites it)."""
        where = f"gpu_info[{i}] (gpu {info.index}, created_unix_ns {time_ns})"
        for what, value in (("uuid", info.uuid), ("name", info.name)):
            problem = self._tag_problem(what, value) if value else None
            if problem is not None:
                problems.sample(INVALID_STRING, f"{where}: {problem}")
                return
        if not self._time_ok(time_ns, low, high, problems, where):
            return
        parts = _checked_fields(info, GPU_INFO_SPECS, problems, where)
        if info.memory_total_bytes:
            parts.extend(_checked_fields(info, (("memory_total_bytes", _INT, False),), problems, where))
        for name in GPU_INFO_STRINGS:
            text = clean_string_field(getattr(info, name), GPU_INFO_STRING_BYTES)
            if text:
                parts.append(f"{name}={quote_string_field(text)}")
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        tags = dict(self._identity_tags, gpu=str(info.index), uuid=info.uuid, model=info.name)
        prefix = self._cached_prefix((GPU_INFO, info.index, info.uuid, info.name), GPU_INFO, tags)
        out.append(f"{prefix}{','.join(parts)} {time_ns}\n".encode())

    # --- the health measurements of a GPU (low volume: the exact path only) -----------------------

    def _gpu_series(
        self,
        measurement: str,
        index: int,
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
        extra: Mapping[str, str],
        problems: Problems,
        where: str,
    ) -> str | None:
        """The series prefix of a point of GPU ``index`` (its tags as on ``gpu`` points plus
        ``extra``), or None when the GPU is not usable (reported: the sample is dropped)."""
        resolved = gpus.get(index)
        if resolved is None:
            problems.sample(UNKNOWN_GPU, f"{where}: gpu index {index} is not in SampleBatch.gpus")
            return None
        if not isinstance(resolved, str):
            problems.sample(resolved[0], f"{where}: {resolved[1]}")
            return None
        for what, value in extra.items():
            problem = self._tag_problem(what, value) if value else None
            if problem is not None:
                problems.sample(INVALID_STRING, f"{where}: {problem}")
                return None
        ref = refs[index]
        key = (measurement, index, ref.uuid, ref.name, ref.pod, ref.namespace, ref.container, *extra.items())
        return self._cached_prefix(key, measurement, dict(self._identity_tags, **_ref_tags(ref), **extra))

    def _encode_gpu_event(
        self,
        i: int,
        event: telemetry_pb2.GpuEvent,
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        time_ns = event.time_unix_ns
        where = f"gpu_events[{i}] (gpu {event.gpu_index}, time {time_ns})"
        kind = GPU_EVENT_KINDS.get(int(event.kind))
        if kind is None:
            problems.sample(MISSING_FIELD, f"{where}: kind is unspecified or unknown ({int(event.kind)})")
            return
        prefix = self._gpu_series(GPU_EVENT, event.gpu_index, gpus, refs, {"kind": kind}, problems, where)
        if prefix is None or not self._time_ok(time_ns, low, high, problems, where):
            return
        name = "xid" if event.kind == telemetry_pb2.GPU_EVENT_KIND_XID else "data"
        parts = _checked_fields(event, ((name, _INT, False),), problems, where) if name == "data" else []
        if name == "xid":
            if event.data > INT64_MAX:
                problems.value(NON_FINITE_VALUE, f"{where}: xid={event.data} is beyond the int64 range; value dropped")
            else:
                parts.append(f"xid={event.data}i")
        text = _clean_text(event.text, self.limits.max_string_field_bytes)
        if text:
            parts.append(f"text={text}")
        if event.HasField("gpu_instance_id"):
            parts.append(f"gpu_instance={event.gpu_instance_id}i")
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        out.append(f"{prefix}{','.join(parts)} {time_ns}\n".encode())

    def _encode_process(
        self,
        i: int,
        sample: telemetry_pb2.ProcessSample,
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        time_ns = sample.time_unix_ns
        where = f"process_samples[{i}] (gpu {sample.gpu_index}, pid {sample.pid}, time {time_ns})"
        pid = {"pid": str(sample.pid)}
        prefix = self._gpu_series(GPU_PROCESS, sample.gpu_index, gpus, refs, pid, problems, where)
        if prefix is None or not self._time_ok(time_ns, low, high, problems, where):
            return
        parts: list[str] = []
        for name in PROCESS_STRINGS:
            text = _clean_text(getattr(sample, name), self.limits.max_string_field_bytes)
            if text:
                parts.append(f"{name}={text}")
        parts.extend(_checked_fields(sample, PROCESS_SPECS, problems, where))
        out.append(f"{prefix}{','.join(parts)} {time_ns}\n".encode())

    def _encode_nvlink(
        self,
        i: int,
        sample: telemetry_pb2.NvLinkSample,
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        time_ns = sample.time_unix_ns
        where = f"nvlink_samples[{i}] (gpu {sample.gpu_index}, link {sample.link}, time {time_ns})"
        link = {"link": str(sample.link)}
        prefix = self._gpu_series(GPU_NVLINK, sample.gpu_index, gpus, refs, link, problems, where)
        if prefix is None or not self._time_ok(time_ns, low, high, problems, where):
            return
        parts = _checked_fields(sample, NVLINK_SPECS, problems, where)
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        out.append(f"{prefix}{','.join(parts)} {time_ns}\n".encode())

    def _encode_mig(
        self,
        i: int,
        sample: telemetry_pb2.MigSample,
        gpus: Mapping[int, str | tuple[int, str]],
        refs: Mapping[int, telemetry_pb2.GpuRef],
        low: int,
        high: int,
        problems: Problems,
        out: list[bytes],
    ) -> None:
        time_ns = sample.time_unix_ns
        where = f"mig_samples[{i}] (gpu {sample.gpu_index}, gpu instance {sample.gpu_instance_id}, time {time_ns})"
        tags = {"gpu_instance": str(sample.gpu_instance_id), "mig_uuid": sample.mig_uuid}
        prefix = self._gpu_series(GPU_MIG, sample.gpu_index, gpus, refs, tags, problems, where)
        if prefix is None or not self._time_ok(time_ns, low, high, problems, where):
            return
        parts: list[str] = []
        name = _clean_text(sample.name, GPU_INFO_STRING_BYTES)
        if name:
            parts.append(f"name={name}")
        parts.extend(_checked_fields(sample, MIG_SPECS, problems, where))
        if not parts:
            problems.sample(MISSING_FIELD, f"{where}: no value that can be stored")
            return
        out.append(f"{prefix}{','.join(parts)} {time_ns}\n".encode())


# the GpuRef fields that name the pod holding the GPU, each a tag of the same name where set
POD_TAGS = ("pod", "namespace", "container")


def _ref_strings(ref: telemetry_pb2.GpuRef) -> tuple[tuple[str, str], ...]:
    """A GPU reference's strings that become tags, as the batch names them."""
    return (("uuid", ref.uuid), ("name", ref.name), *((name, getattr(ref, name)) for name in POD_TAGS))


def _ref_tags(ref: telemetry_pb2.GpuRef) -> dict[str, str]:
    """The tags of a GPU's points: index, UUID and model, and its pod where the agent knows it."""
    tags = {"gpu": str(ref.index), "uuid": ref.uuid, "model": ref.name}
    tags.update((name, value) for name in POD_TAGS if (value := getattr(ref, name)))
    return tags
