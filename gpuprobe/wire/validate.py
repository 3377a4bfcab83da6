"""Part: wire (ground floor). What the collector accepts from an agent, and what it answers when something is wrong.

The collector applies these rules to every stream (``collector/server.py``, ``collector/encode.py``);
the agent applies the identity rules (:func:`check_hello`) to its own labels before it connects
(``agent/identity.py``), so a bad label is refused at start, not by every collector it tries.

Two kinds of problem, as the wire contract (docs/wire.md) defines them:

* **Stream errors** break the contract of the stream itself (no ``Hello`` first, a batch for another
  agent, a sequence number that does not increase, an undecodable message, a bad identity label).
  They end the stream with a gRPC status code and a message the agent logs: :class:`StreamError`.
* **Content problems** concern single values or samples of one batch (NaN, an unknown GPU index, a
  timestamp far from the collector's clock, a bad string). The collector drops what it cannot
  store, writes the rest, and reports it in the batch's ``Ack.rejections``: :class:`Problems`
  collects them while a batch is encoded and turns them into ``BatchRejection`` messages.

Every check here is about what can be *stored exactly*; there are no plausibility checks on
measured values (a GPU at 101 % utilization is stored as sent).

String rules (tag values: identity labels, GPU uuid and model, workload, probe id):

* empty means "not known": the tag is omitted (where the tag is required, the sample is refused);
* at most ``Limits.max_tag_bytes`` bytes of UTF-8;
* no control characters (U+0000-U+001F, U+007F-U+009F; so no newline, carriage return or tab) and
  no lone surrogates: refused with ``INVALID_STRING``. A newline could otherwise end the line and
  inject a second point;
* not ending with a backslash: InfluxDB's line-protocol parser (1.x and 2.x) reads a trailing
  backslash as escaping the separator after it, so such a value cannot be written at all;
* everything else (commas, spaces, ``=``, quotes, inner backslashes, any Unicode) is escaped by
  :mod:`gpuprobe.influx.lineprotocol` and reads back exactly.

The string checks themselves are line protocol's (:func:`gpuprobe.influx.storable.tag_value_problem`);
this module applies them with the collector's limits and turns them into stream errors and reports.

Free-text string *fields* (``ProbeEvent.message``, ``GpuSample.health_reason``, ``GpuEvent.text``,
``ProcessSample.command`` and ``cgroup``: the last two come from the node's processes, so anyone
who can start a process there chooses them) are not refused: control characters are replaced by a
space and the text is cut to ``Limits.max_string_field_bytes`` (``GpuInfo`` strings and
``MigSample.name``: 256 bytes); quotes and backslashes are escaped when the line is written. Invalid
UTF-8 cannot reach this point: protobuf refuses to decode a ``string`` field that holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import grpc

from gpuprobe.errors import ProtocolError
from gpuprobe.influx.storable import CONTROL_CHARS, INT64_MAX, tag_value_problem
from gpuprobe.v1 import common_pb2, telemetry_pb2

NS_PER_S = 1_000_000_000
#: A collector moves the timestamps of an agent whose clock is this far off its own (in s, either way;
#: ``collector/clock.py``); below it they are stored as stamped.
CLOCK_CORRECTED_FROM_S = 1.0
#: The response header a collector sends once it has checked a stream's credentials (docs/wire.md): an
#: agent writes its Hello after it, so that a refusal ends a stream the agent has not written to.
STREAM_ACCEPTED_HEADER = ("gpuprobe-stream", "accepted")

# hwmon sensor names as the contract defines them (lower case, digits, underscore).
_SENSOR_NAME = re.compile(r"[a-z0-9_]{1,64}")

RejectReason = telemetry_pb2.RejectReason
NON_FINITE_VALUE = telemetry_pb2.REJECT_REASON_NON_FINITE_VALUE
INVALID_STRING = telemetry_pb2.REJECT_REASON_INVALID_STRING
UNKNOWN_GPU = telemetry_pb2.REJECT_REASON_UNKNOWN_GPU
TIMESTAMP_OUT_OF_RANGE = telemetry_pb2.REJECT_REASON_TIMESTAMP_OUT_OF_RANGE
MISSING_FIELD = telemetry_pb2.REJECT_REASON_MISSING_FIELD

#: Prometheus label of each reason (``rejected-by-reason`` metrics).
REASON_LABELS: dict[int, str] = {
    NON_FINITE_VALUE: "non_finite_value",
    INVALID_STRING: "invalid_string",
    UNKNOWN_GPU: "unknown_gpu",
    TIMESTAMP_OUT_OF_RANGE: "timestamp_out_of_range",
    MISSING_FIELD: "missing_field",
    telemetry_pb2.REJECT_REASON_SINK_REFUSED: "sink_refused",
}

VIRT_TAGS: dict[int, str] = {
    common_pb2.VIRTUALIZATION_UNSPECIFIED: "unknown",
    common_pb2.VIRTUALIZATION_BARE_METAL: "bare_metal",
    common_pb2.VIRTUALIZATION_PASSTHROUGH: "passthrough",
    common_pb2.VIRTUALIZATION_VGPU: "vgpu",
    common_pb2.VIRTUALIZATION_HOST_VGPU: "host_vgpu",
}


@dataclass(frozen=True)
class Limits:
    """The validation settings of one collector (``gpuprobe collector`` options)."""

    #: A sample more than this far in the future of the collector's clock is out of range, in s.
    max_clock_skew_s: float = 600.0
    #: A sample older than this is out of range, in s (agents replay their spool after outages).
    max_sample_age_s: float = 7 * 24 * 3600.0
    #: ``reject``: out-of-range samples are refused (TIMESTAMP_OUT_OF_RANGE). ``flag``: they are
    #: stored, counted and logged. Zero and negative timestamps are always refused.
    timestamp_policy: str = "reject"
    #: Longest tag value, in bytes of UTF-8.
    max_tag_bytes: int = 256
    #: Longest free-text string field (``ProbeEvent.message``, ``GpuSample.health_reason``,
    #: ``GpuEvent.text``, ``ProcessSample.command`` and ``cgroup``), in bytes of UTF-8; longer is cut.
    max_string_field_bytes: int = 4096
    #: Largest serialized ``StreamRequest``, in bytes (gRPC refuses larger with RESOURCE_EXHAUSTED).
    max_message_bytes: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.timestamp_policy not in ("reject", "flag"):
            raise ValueError(f"timestamp_policy must be reject or flag, not {self.timestamp_policy!r}")
        if self.max_clock_skew_s < 0 or self.max_sample_age_s <= 0:
            raise ValueError("max_clock_skew_s must be >= 0 and max_sample_age_s > 0")
        if self.max_tag_bytes < 1 or self.max_string_field_bytes < 1:
            raise ValueError("max_tag_bytes and max_string_field_bytes must be at least 1")
        if self.max_message_bytes < 4 * 1024 * 1024:
            raise ValueError("max_message_bytes must be at least 4 MiB (the wire contract's minimum)")

    def time_window_ns(self, now_ns: int) -> tuple[int, int]:
        """The accepted ``(lowest, highest)`` sample timestamps at ``now_ns`` (both inclusive, >= 1)."""
        low = max(1, now_ns - int(self.max_sample_age_s * NS_PER_S))
        high = min(INT64_MAX, now_ns + int(self.max_clock_skew_s * NS_PER_S))
        return low, high


class StreamError(ProtocolError):
    """Ends the stream with ``code`` and ``message`` (which the agent logs)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def clean_string_field(value: str, max_bytes: int) -> str:
    """Free text for a string field: control characters become spaces, cut to ``max_bytes`` of UTF-8."""
    if CONTROL_CHARS.search(value) is not None:
        value = CONTROL_CHARS.sub(" ", value)
    if len(value) * 4 > max_bytes:
        raw = value.encode()
        if len(raw) > max_bytes:
            value = raw[:max_bytes].decode(errors="ignore")
    return value


#: Longest interval of a ``GpuAggregate``, in ms (one hour).
MAX_AGGREGATE_INTERVAL_MS = 3_600_000


def aggregate_problem(aggregate: telemetry_pb2.GpuAggregate) -> str | None:
    """Why a ``GpuAggregate`` cannot be stored at all (refused with ``MISSING_FIELD``), or None.

    The checks it shares with raw samples (the GPU index, the timestamp window, the values) are the
    encoder's, made the same way for both."""
    if not 0 < aggregate.interval_ms <= MAX_AGGREGATE_INTERVAL_MS:
        return f"interval_ms {aggregate.interval_ms} is not between 1 and {MAX_AGGREGATE_INTERVAL_MS} (1 h)"
    if aggregate.sample_count < 1:
        return "sample_count is 0 (an aggregate covers at least one sample)"
    return None


def sensor_name_problem(name: str) -> str | None:
    """Why an hwmon sensor name cannot become the field key ``hwmon_<name>_c``, or None."""
    if _SENSOR_NAME.fullmatch(name) is None:
        shown = name if len(name) <= 80 else name[:80] + "..."
        return f"hwmon sensor name {shown!r} is not 1-64 characters of [a-z0-9_]"
    return None


@dataclass(frozen=True)
class Identity:
    """An agent's checked identity labels, from its ``Hello``. Empty strings mean "not known"."""

    agent_id: str
    host: str
    cluster: str = ""
    cloud: str = ""
    instance_type: str = ""
    region: str = ""
    virt: str = "unknown"

    def tags(self) -> dict[str, str]:
        """The identity tags every point of this agent carries (empty labels left out)."""
        pairs = {
            "host": self.host,
            "cluster": self.cluster,
            "cloud": self.cloud,
            "instance_type": self.instance_type,
            "region": self.region,
            "virt": self.virt,
        }
        return {key: value for key, value in pairs.items() if value}


def check_hello(hello: telemetry_pb2.Hello, limits: Limits) -> Identity:
    """The agent's identity, or :class:`StreamError` ``INVALID_ARGUMENT`` naming the bad label.

    ``agent_id`` and ``host`` are required. A label that cannot be stored as a tag ends the stream:
    every point of the agent would carry it, so storing anything would be wrong.
    """
    if not hello.HasField("identity"):
        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "Hello.identity is missing")
    ident = hello.identity
    if not ident.agent_id:
        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "Hello.identity.agent_id is empty")
    if not ident.host:
        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "Hello.identity.host is empty")
    problem = _label_problem("agent_id", ident.agent_id, limits)
    if problem is not None:
        raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, problem)
    for name in ("host", "cluster", "cloud", "instance_type", "region"):
        value: str = getattr(ident, name)
        if value:
            problem = _label_problem(name, value, limits)
            if problem is not None:
                raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, problem)
    if any(char in ident.host for char in "/+#"):
        raise StreamError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Hello.identity.host {ident.host!r} contains '/', '+' or '#' (not allowed in host names)",
        )
    return Identity(
        agent_id=ident.agent_id,
        host=ident.host,
        cluster=ident.cluster,
        cloud=ident.cloud,
        instance_type=ident.instance_type,
        region=ident.region,
        virt=VIRT_TAGS.get(ident.virtualization, "unknown"),
    )


def _label_problem(name: str, value: str, limits: Limits) -> str | None:
    problem = tag_value_problem(value, limits.max_tag_bytes)
    if problem is None:
        return None
    shown = value if len(value) <= 80 else value[:80] + "..."
    return f"Hello.identity.{name} {shown!r} {problem}"


@dataclass
class _ReasonTally:
    first_message: str
    values: int = 0
    samples: int = 0


@dataclass
class Problems:
    """The content problems of one batch, per reason: the first message, values and samples dropped."""

    seq: int
    by_reason: dict[int, _ReasonTally] = field(default_factory=dict)
    flagged_timestamps: int = 0

    def value(self, reason: int, message: str) -> None:
        """One value (a field) was dropped; the rest of its sample is stored."""
        self._tally(reason, message).values += 1

    def sample(self, reason: int, message: str, count: int = 1) -> None:
        """``count`` whole samples were dropped."""
        self._tally(reason, message).samples += count

    def _tally(self, reason: int, message: str) -> _ReasonTally:
        tally = self.by_reason.get(reason)
        if tally is None:
            tally = self.by_reason[reason] = _ReasonTally(message)
        return tally

    def __bool__(self) -> bool:
        return bool(self.by_reason)

    @property
    def rejected_samples(self) -> int:
        return sum(t.samples for t in self.by_reason.values())

    def rejections(self) -> list[telemetry_pb2.BatchRejection]:
        """One ``BatchRejection`` per reason: its first message and how many were dropped."""
        out = []
        for reason, tally in self.by_reason.items():
            extra = []
            if tally.samples:
                extra.append(f"{tally.samples} sample(s) dropped")
            if tally.values:
                extra.append(f"{tally.values} value(s) dropped")
            out.append(
                telemetry_pb2.BatchRejection(
                    seq=self.seq,
                    reason=reason,  # type: ignore[arg-type]
                    message=f"{tally.first_message} ({', '.join(extra)} for this reason in the batch)",
                    rejected_samples=min(tally.samples, 2**32 - 1),
                )
            )
        return out
