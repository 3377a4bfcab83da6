from gpuprobe.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadSize(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_SIZE_UNSPECIFIED: _ClassVar[WorkloadSize]
    WORKLOAD_SIZE_TINY: _ClassVar[WorkloadSize]
    WORKLOAD_SIZE_FULL: _ClassVar[WorkloadSize]

class RefusalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_REASON_UNSPECIFIED: _ClassVar[RefusalReason]
    REFUSAL_REASON_BAD_SIGNATURE: _ClassVar[RefusalReason]
    REFUSAL_REASON_UNKNOWN_KEY: _ClassVar[RefusalReason]
    REFUSAL_REASON_MALFORMED: _ClassVar[RefusalReason]
    REFUSAL_REASON_EXPIRED: _ClassVar[RefusalReason]
    REFUSAL_REASON_ISSUED_IN_FUTURE: _ClassVar[RefusalReason]
    REFUSAL_REASON_REPLAYED: _ClassVar[RefusalReason]
    REFUSAL_REASON_UNKNOWN_WORKLOAD: _ClassVar[RefusalReason]
    REFUSAL_REASON_NOT_SELECTED: _ClassVar[RefusalReason]
    REFUSAL_REASON_BUSY: _ClassVar[RefusalReason]
    REFUSAL_REASON_UNKNOWN_PROBE: _ClassVar[RefusalReason]
    REFUSAL_REASON_INVALID_ARGUMENT: _ClassVar[RefusalReason]
    REFUSAL_REASON_TRAINER_UNAVAILABLE: _ClassVar[RefusalReason]
    REFUSAL_REASON_INTERNAL: _ClassVar[RefusalReason]
    REFUSAL_REASON_GPU_FAILED: _ClassVar[RefusalReason]

class AgentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AGENT_STATE_UNSPECIFIED: _ClassVar[AgentState]
    AGENT_STATE_ONLINE: _ClassVar[AgentState]
    AGENT_STATE_OFFLINE: _ClassVar[AgentState]
    AGENT_STATE_LOST: _ClassVar[AgentState]
WORKLOAD_SIZE_UNSPECIFIED: WorkloadSize
WORKLOAD_SIZE_TINY: WorkloadSize
WORKLOAD_SIZE_FULL: WorkloadSize
REFUSAL_REASON_UNSPECIFIED: RefusalReason
REFUSAL_REASON_BAD_SIGNATURE: RefusalReason
REFUSAL_REASON_UNKNOWN_KEY: RefusalReason
REFUSAL_REASON_MALFORMED: RefusalReason
REFUSAL_REASON_EXPIRED: RefusalReason
REFUSAL_REASON_ISSUED_IN_FUTURE: RefusalReason
REFUSAL_REASON_REPLAYED: RefusalReason
REFUSAL_REASON_UNKNOWN_WORKLOAD: RefusalReason
REFUSAL_REASON_NOT_SELECTED: RefusalReason
REFUSAL_REASON_BUSY: RefusalReason
REFUSAL_REASON_UNKNOWN_PROBE: RefusalReason
REFUSAL_REASON_INVALID_ARGUMENT: RefusalReason
REFUSAL_REASON_TRAINER_UNAVAILABLE: RefusalReason
REFUSAL_REASON_INTERNAL: RefusalReason
REFUSAL_REASON_GPU_FAILED: RefusalReason
AGENT_STATE_UNSPECIFIED: AgentState
AGENT_STATE_ONLINE: AgentState
AGENT_STATE_OFFLINE: AgentState
AGENT_STATE_LOST: AgentState

class SignedCommand(_message.Message):
    __slots__ = ("payload", "signature", "key_id")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    signature: bytes
    key_id: str
    def __init__(self, payload: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("command_id", "issued_at_unix_ns", "expires_at_unix_ns", "issuer", "probe_start", "probe_cancel")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    PROBE_START_FIELD_NUMBER: _ClassVar[int]
    PROBE_CANCEL_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    issued_at_unix_ns: int
    expires_at_unix_ns: int
    issuer: str
    probe_start: ProbeStart
    probe_cancel: ProbeCancel
    def __init__(self, command_id: _Optional[str] = ..., issued_at_unix_ns: _Optional[int] = ..., expires_at_unix_ns: _Optional[int] = ..., issuer: _Optional[str] = ..., probe_start: _Optional[_Union[ProbeStart, _Mapping[str, object]]] = ..., probe_cancel: _Optional[_Union[ProbeCancel, _Mapping[str, object]]] = ...) -> None: ...

class ProbeStart(_message.Message):
    __slots__ = ("probe_id", "workload", "size", "start_at_unix_ns", "duration_s", "idle_baseline_s", "warmup_s", "cooldown_s", "batch_size", "selector", "gpu_indices", "points")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    START_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_BASELINE_S_FIELD_NUMBER: _ClassVar[int]
    WARMUP_S_FIELD_NUMBER: _ClassVar[int]
    COOLDOWN_S_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    workload: str
    size: WorkloadSize
    start_at_unix_ns: int
    duration_s: float
    idle_baseline_s: float
    warmup_s: float
    cooldown_s: float
    batch_size: int
    selector: NodeSelector
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    points: _containers.RepeatedCompositeFieldContainer[StudyPoint]
    def __init__(self, probe_id: _Optional[str] = ..., workload: _Optional[str] = ..., size: _Optional[_Union[WorkloadSize, str]] = ..., start_at_unix_ns: _Optional[int] = ..., duration_s: _Optional[float] = ..., idle_baseline_s: _Optional[float] = ..., warmup_s: _Optional[float] = ..., cooldown_s: _Optional[float] = ..., batch_size: _Optional[int] = ..., selector: _Optional[_Union[NodeSelector, _Mapping[str, object]]] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., points: _Optional[_Iterable[_Union[StudyPoint, _Mapping[str, object]]]] = ...) -> None: ...

class StudyPoint(_message.Message):
    __slots__ = ("workload", "batch_size", "power_limit")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    workload: str
    batch_size: int
    power_limit: PowerLimit
    def __init__(self, workload: _Optional[str] = ..., batch_size: _Optional[int] = ..., power_limit: _Optional[_Union[PowerLimit, _Mapping[str, object]]] = ...) -> None: ...

class PowerLimit(_message.Message):
    __slots__ = ("percent_of_max", "watts")
    PERCENT_OF_MAX_FIELD_NUMBER: _ClassVar[int]
    WATTS_FIELD_NUMBER: _ClassVar[int]
    percent_of_max: float
    watts: float
    def __init__(self, percent_of_max: _Optional[float] = ..., watts: _Optional[float] = ...) -> None: ...

class NodeSelector(_message.Message):
    __slots__ = ("all_agents", "hosts", "clusters", "clouds", "instance_types", "regions")
    ALL_AGENTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    CLOUDS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    all_agents: bool
    hosts: _containers.RepeatedScalarFieldContainer[str]
    clusters: _containers.RepeatedScalarFieldContainer[str]
    clouds: _containers.RepeatedScalarFieldContainer[str]
    instance_types: _containers.RepeatedScalarFieldContainer[str]
    regions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, all_agents: _Optional[bool] = ..., hosts: _Optional[_Iterable[str]] = ..., clusters: _Optional[_Iterable[str]] = ..., clouds: _Optional[_Iterable[str]] = ..., instance_types: _Optional[_Iterable[str]] = ..., regions: _Optional[_Iterable[str]] = ...) -> None: ...

class ProbeCancel(_message.Message):
    __slots__ = ("probe_id",)
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    def __init__(self, probe_id: _Optional[str] = ...) -> None: ...

class CommandReply(_message.Message):
    __slots__ = ("command_id", "host", "accepted", "reason", "message", "time_unix_ns", "probe_id")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    host: str
    accepted: bool
    reason: RefusalReason
    message: str
    time_unix_ns: int
    probe_id: str
    def __init__(self, command_id: _Optional[str] = ..., host: _Optional[str] = ..., accepted: _Optional[bool] = ..., reason: _Optional[_Union[RefusalReason, str]] = ..., message: _Optional[str] = ..., time_unix_ns: _Optional[int] = ..., probe_id: _Optional[str] = ...) -> None: ...

class AgentPresence(_message.Message):
    __slots__ = ("state", "identity", "agent_version", "gpus", "last_seen_unix_ns", "started_unix_ns", "workloads", "probe_id", "sample_interval_s", "uplink_connected", "spool_bytes", "last_ack_unix_ns", "gpu_health", "clock_offset_s")
    STATE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    UPLINK_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    SPOOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_ACK_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_HEALTH_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_S_FIELD_NUMBER: _ClassVar[int]
    state: AgentState
    identity: _common_pb2.AgentIdentity
    agent_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuInfo]
    last_seen_unix_ns: int
    started_unix_ns: int
    workloads: _containers.RepeatedScalarFieldContainer[str]
    probe_id: str
    sample_interval_s: float
    uplink_connected: bool
    spool_bytes: int
    last_ack_unix_ns: int
    gpu_health: _containers.RepeatedCompositeFieldContainer[GpuHealthStatus]
    clock_offset_s: float
    def __init__(self, state: _Optional[_Union[AgentState, str]] = ..., identity: _Optional[_Union[_common_pb2.AgentIdentity, _Mapping[str, object]]] = ..., agent_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.GpuInfo, _Mapping[str, object]]]] = ..., last_seen_unix_ns: _Optional[int] = ..., started_unix_ns: _Optional[int] = ..., workloads: _Optional[_Iterable[str]] = ..., probe_id: _Optional[str] = ..., sample_interval_s: _Optional[float] = ..., uplink_connected: _Optional[bool] = ..., spool_bytes: _Optional[int] = ..., last_ack_unix_ns: _Optional[int] = ..., gpu_health: _Optional[_Iterable[_Union[GpuHealthStatus, _Mapping[str, object]]]] = ..., clock_offset_s: _Optional[float] = ...) -> None: ...

class GpuHealthStatus(_message.Message):
    __slots__ = ("index", "health", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    health: _common_pb2.GpuHealth
    reason: str
    def __init__(self, index: _Optional[int] = ..., health: _Optional[_Union[_common_pb2.GpuHealth, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ProbeProgress(_message.Message):
    __slots__ = ("probe_id", "host", "time_unix_ns", "phase", "status", "step", "samples_per_s", "fraction_done", "started_unix_ns", "workload")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    FRACTION_DONE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    host: str
    time_unix_ns: int
    phase: _common_pb2.ProbePhase
    status: _common_pb2.ProbeStatus
    step: int
    samples_per_s: float
    fraction_done: float
    started_unix_ns: int
    workload: str
    def __init__(self, probe_id: _Optional[str] = ..., host: _Optional[str] = ..., time_unix_ns: _Optional[int] = ..., phase: _Optional[_Union[_common_pb2.ProbePhase, str]] = ..., status: _Optional[_Union[_common_pb2.ProbeStatus, str]] = ..., step: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., fraction_done: _Optional[float] = ..., started_unix_ns: _Optional[int] = ..., workload: _Optional[str] = ...) -> None: ...

class ProbeMetrics(_message.Message):
    __slots__ = ("gpu_index", "gpu_uuid", "samples_per_s", "energy_j", "j_per_sample", "mean_power_w", "peak_power_w", "peak_temp_c", "samples", "idle_power_w")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    J_PER_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    MEAN_POWER_W_FIELD_NUMBER: _ClassVar[int]
    PEAK_POWER_W_FIELD_NUMBER: _ClassVar[int]
    PEAK_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    IDLE_POWER_W_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    gpu_uuid: str
    samples_per_s: float
    energy_j: float
    j_per_sample: float
    mean_power_w: float
    peak_power_w: float
    peak_temp_c: float
    samples: int
    idle_power_w: float
    def __init__(self, gpu_index: _Optional[int] = ..., gpu_uuid: _Optional[str] = ..., samples_per_s: _Optional[float] = ..., energy_j: _Optional[float] = ..., j_per_sample: _Optional[float] = ..., mean_power_w: _Optional[float] = ..., peak_power_w: _Optional[float] = ..., peak_temp_c: _Optional[float] = ..., samples: _Optional[int] = ..., idle_power_w: _Optional[float] = ...) -> None: ...

class PointResult(_message.Message):
    __slots__ = ("index", "workload", "batch_size", "power_limit", "gpus", "total", "refused", "device")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    index: int
    workload: str
    batch_size: int
    power_limit: str
    gpus: _containers.RepeatedCompositeFieldContainer[ProbeMetrics]
    total: ProbeMetrics
    refused: str
    device: str
    def __init__(self, index: _Optional[int] = ..., workload: _Optional[str] = ..., batch_size: _Optional[int] = ..., power_limit: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[ProbeMetrics, _Mapping[str, object]]]] = ..., total: _Optional[_Union[ProbeMetrics, _Mapping[str, object]]] = ..., refused: _Optional[str] = ..., device: _Optional[str] = ...) -> None: ...

class ProbeResult(_message.Message):
    __slots__ = ("probe_id", "host", "status", "message", "workload", "size", "batch_size", "started_unix_ns", "ended_unix_ns", "steady_start_unix_ns", "steady_end_unix_ns", "gpus", "total", "points", "device")
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    STEADY_START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    STEADY_END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    probe_id: str
    host: str
    status: _common_pb2.ProbeStatus
    message: str
    workload: str
    size: WorkloadSize
    batch_size: int
    started_unix_ns: int
    ended_unix_ns: int
    steady_start_unix_ns: int
    steady_end_unix_ns: int
    gpus: _containers.RepeatedCompositeFieldContainer[ProbeMetrics]
    total: ProbeMetrics
    points: _containers.RepeatedCompositeFieldContainer[PointResult]
    device: str
    def __init__(self, probe_id: _Optional[str] = ..., host: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.ProbeStatus, str]] = ..., message: _Optional[str] = ..., workload: _Optional[str] = ..., size: _Optional[_Union[WorkloadSize, str]] = ..., batch_size: _Optional[int] = ..., started_unix_ns: _Optional[int] = ..., ended_unix_ns: _Optional[int] = ..., steady_start_unix_ns: _Optional[int] = ..., steady_end_unix_ns: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[ProbeMetrics, _Mapping[str, object]]]] = ..., total: _Optional[_Union[ProbeMetrics, _Mapping[str, object]]] = ..., points: _Optional[_Iterable[_Union[PointResult, _Mapping[str, object]]]] = ..., device: _Optional[str] = ...) -> None: ...
