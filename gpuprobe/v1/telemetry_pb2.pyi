from gpuprobe.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GpuEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_EVENT_KIND_UNSPECIFIED: _ClassVar[GpuEventKind]
    GPU_EVENT_KIND_XID: _ClassVar[GpuEventKind]
    GPU_EVENT_KIND_ECC_SINGLE_BIT: _ClassVar[GpuEventKind]
    GPU_EVENT_KIND_ECC_DOUBLE_BIT: _ClassVar[GpuEventKind]
    GPU_EVENT_KIND_CLOCK_CHANGE: _ClassVar[GpuEventKind]
    GPU_EVENT_KIND_POWER_SOURCE_CHANGE: _ClassVar[GpuEventKind]
    GPU_EVENT_KIND_LOST: _ClassVar[GpuEventKind]
    GPU_EVENT_KIND_RECOVERED: _ClassVar[GpuEventKind]

class AcousticSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACOUSTIC_SOURCE_UNSPECIFIED: _ClassVar[AcousticSource]
    ACOUSTIC_SOURCE_MIC: _ClassVar[AcousticSource]
    ACOUSTIC_SOURCE_PROXY: _ClassVar[AcousticSource]

class TrainerDevice(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINER_DEVICE_UNSPECIFIED: _ClassVar[TrainerDevice]
    TRAINER_DEVICE_CUDA: _ClassVar[TrainerDevice]
    TRAINER_DEVICE_CPU: _ClassVar[TrainerDevice]
    TRAINER_DEVICE_SIM: _ClassVar[TrainerDevice]

class ProbeEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_EVENT_KIND_UNSPECIFIED: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_START: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_PHASE_CHANGE: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_END: _ClassVar[ProbeEventKind]
    PROBE_EVENT_KIND_POINT_REFUSED: _ClassVar[ProbeEventKind]

class RejectReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECT_REASON_UNSPECIFIED: _ClassVar[RejectReason]
    REJECT_REASON_NON_FINITE_VALUE: _ClassVar[RejectReason]
    REJECT_REASON_INVALID_STRING: _ClassVar[RejectReason]
    REJECT_REASON_UNKNOWN_GPU: _ClassVar[RejectReason]
    REJECT_REASON_TIMESTAMP_OUT_OF_RANGE: _ClassVar[RejectReason]
    REJECT_REASON_MISSING_FIELD: _ClassVar[RejectReason]
    REJECT_REASON_SINK_REFUSED: _ClassVar[RejectReason]
GPU_EVENT_KIND_UNSPECIFIED: GpuEventKind
GPU_EVENT_KIND_XID: GpuEventKind
GPU_EVENT_KIND_ECC_SINGLE_BIT: GpuEventKind
GPU_EVENT_KIND_ECC_DOUBLE_BIT: GpuEventKind
GPU_EVENT_KIND_CLOCK_CHANGE: GpuEventKind
GPU_EVENT_KIND_POWER_SOURCE_CHANGE: GpuEventKind
GPU_EVENT_KIND_LOST: GpuEventKind
GPU_EVENT_KIND_RECOVERED: GpuEventKind
ACOUSTIC_SOURCE_UNSPECIFIED: AcousticSource
ACOUSTIC_SOURCE_MIC: AcousticSource
ACOUSTIC_SOURCE_PROXY: AcousticSource
TRAINER_DEVICE_UNSPECIFIED: TrainerDevice
TRAINER_DEVICE_CUDA: TrainerDevice
TRAINER_DEVICE_CPU: TrainerDevice
TRAINER_DEVICE_SIM: TrainerDevice
PROBE_EVENT_KIND_UNSPECIFIED: ProbeEventKind
PROBE_EVENT_KIND_START: ProbeEventKind
PROBE_EVENT_KIND_PHASE_CHANGE: ProbeEventKind
PROBE_EVENT_KIND_END: ProbeEventKind
PROBE_EVENT_KIND_POINT_REFUSED: ProbeEventKind
REJECT_REASON_UNSPECIFIED: RejectReason
REJECT_REASON_NON_FINITE_VALUE: RejectReason
REJECT_REASON_INVALID_STRING: RejectReason
REJECT_REASON_UNKNOWN_GPU: RejectReason
REJECT_REASON_TIMESTAMP_OUT_OF_RANGE: RejectReason
REJECT_REASON_MISSING_FIELD: RejectReason
REJECT_REASON_SINK_REFUSED: RejectReason

class StreamRequest(_message.Message):
    __slots__ = ("hello", "batch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    batch: SampleBatch
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping[str, object]]] = ..., batch: _Optional[_Union[SampleBatch, _Mapping[str, object]]] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("welcome", "ack")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    ack: Ack
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping[str, object]]] = ..., ack: _Optional[_Union[Ack, _Mapping[str, object]]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("identity", "agent_version", "sample_interval_s", "gpus", "spool_id", "oldest_unacked_seq", "newest_unacked_seq", "time_unix_ns")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SPOOL_ID_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    NEWEST_UNACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    identity: _common_pb2.AgentIdentity
    agent_version: str
    sample_interval_s: float
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuInfo]
    spool_id: str
    oldest_unacked_seq: int
    newest_unacked_seq: int
    time_unix_ns: int
    def __init__(self, identity: _Optional[_Union[_common_pb2.AgentIdentity, _Mapping[str, object]]] = ..., agent_version: _Optional[str] = ..., sample_interval_s: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.GpuInfo, _Mapping[str, object]]]] = ..., spool_id: _Optional[str] = ..., oldest_unacked_seq: _Optional[int] = ..., newest_unacked_seq: _Optional[int] = ..., time_unix_ns: _Optional[int] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("collector_id", "collector_version", "max_message_bytes", "time_unix_ns")
    COLLECTOR_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    collector_id: str
    collector_version: str
    max_message_bytes: int
    time_unix_ns: int
    def __init__(self, collector_id: _Optional[str] = ..., collector_version: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., time_unix_ns: _Optional[int] = ...) -> None: ...

class SampleBatch(_message.Message):
    __slots__ = ("agent_id", "seq", "created_unix_ns", "gpus", "gpu_samples", "node_samples", "acoustic_samples", "trainer_samples", "probe_events", "stats", "gpu_info", "gpu_events", "process_samples", "nvlink_samples", "mig_samples", "gpu_aggregates")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NODE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ACOUSTIC_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAINER_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROBE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    GPU_INFO_FIELD_NUMBER: _ClassVar[int]
    GPU_EVENTS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NVLINK_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MIG_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GPU_AGGREGATES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    seq: int
    created_unix_ns: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuRef]
    gpu_samples: _containers.RepeatedCompositeFieldContainer[GpuSample]
    node_samples: _containers.RepeatedCompositeFieldContainer[NodeSample]
    acoustic_samples: _containers.RepeatedCompositeFieldContainer[AcousticSample]
    trainer_samples: _containers.RepeatedCompositeFieldContainer[TrainerSample]
    probe_events: _containers.RepeatedCompositeFieldContainer[ProbeEvent]
    stats: AgentStats
    gpu_info: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuInfo]
    gpu_events: _containers.RepeatedCompositeFieldContainer[GpuEvent]
    process_samples: _containers.RepeatedCompositeFieldContainer[ProcessSample]
    nvlink_samples: _containers.RepeatedCompositeFieldContainer[NvLinkSample]
    mig_samples: _containers.RepeatedCompositeFieldContainer[MigSample]
    gpu_aggregates: _containers.RepeatedCompositeFieldContainer[GpuAggregate]
    def __init__(self, agent_id: _Optional[str] = ..., seq: _Optional[int] = ..., created_unix_ns: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuRef, _Mapping[str, object]]]] = ..., gpu_samples: _Optional[_Iterable[_Union[GpuSample, _Mapping[str, object]]]] = ..., node_samples: _Optional[_Iterable[_Union[NodeSample, _Mapping[str, object]]]] = ..., acoustic_samples: _Optional[_Iterable[_Union[AcousticSample, _Mapping[str, object]]]] = ..., trainer_samples: _Optional[_Iterable[_Union[TrainerSample, _Mapping[str, object]]]] = ..., probe_events: _Optional[_Iterable[_Union[ProbeEvent, _Mapping[str, object]]]] = ..., stats: _Optional[_Union[AgentStats, _Mapping[str, object]]] = ..., gpu_info: _Optional[_Iterable[_Union[_common_pb2.GpuInfo, _Mapping[str, object]]]] = ..., gpu_events: _Optional[_Iterable[_Union[GpuEvent, _Mapping[str, object]]]] = ..., process_samples: _Optional[_Iterable[_Union[ProcessSample, _Mapping[str, object]]]] = ..., nvlink_samples: _Optional[_Iterable[_Union[NvLinkSample, _Mapping[str, object]]]] = ..., mig_samples: _Optional[_Iterable[_Union[MigSample, _Mapping[str, object]]]] = ..., gpu_aggregates: _Optional[_Iterable[_Union[GpuAggregate, _Mapping[str, object]]]] = ...) -> None: ...

class GpuAggregate(_message.Message):
    __slots__ = ("start_unix_ns", "interval_ms", "gpu_index", "sample_count", "mean", "min", "max", "last")
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    start_unix_ns: int
    interval_ms: int
    gpu_index: int
    sample_count: int
    mean: GpuSample
    min: GpuSample
    max: GpuSample
    last: GpuSample
    def __init__(self, start_unix_ns: _Optional[int] = ..., interval_ms: _Optional[int] = ..., gpu_index: _Optional[int] = ..., sample_count: _Optional[int] = ..., mean: _Optional[_Union[GpuSample, _Mapping[str, object]]] = ..., min: _Optional[_Union[GpuSample, _Mapping[str, object]]] = ..., max: _Optional[_Union[GpuSample, _Mapping[str, object]]] = ..., last: _Optional[_Union[GpuSample, _Mapping[str, object]]] = ...) -> None: ...

class GpuRef(_message.Message):
    __slots__ = ("index", "uuid", "name", "pod", "namespace", "container")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    pod: str
    namespace: str
    container: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., pod: _Optional[str] = ..., namespace: _Optional[str] = ..., container: _Optional[str] = ...) -> None: ...

class AgentStats(_message.Message):
    __slots__ = ("dropped_samples", "dropped_batches", "read_errors", "missed_ticks", "spool_bytes")
    DROPPED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    READ_ERRORS_FIELD_NUMBER: _ClassVar[int]
    MISSED_TICKS_FIELD_NUMBER: _ClassVar[int]
    SPOOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    dropped_samples: int
    dropped_batches: int
    read_errors: int
    missed_ticks: int
    spool_bytes: int
    def __init__(self, dropped_samples: _Optional[int] = ..., dropped_batches: _Optional[int] = ..., read_errors: _Optional[int] = ..., missed_ticks: _Optional[int] = ..., spool_bytes: _Optional[int] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("time_unix_ns", "gpu_index", "util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "power_instant_w", "energy_j", "temp_c", "mem_temp_c", "fan_pct", "sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "clock_event_reasons", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate", "ecc_uncorrected_aggregate", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure", "pcie_replay_count", "power_violation_us", "thermal_violation_us", "sync_boost_violation_us", "fan_rpm", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_util_pct", "fp16_active_pct", "fp32_active_pct", "fp64_active_pct", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "health", "health_reason")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    MEM_UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_INSTANT_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    TEMP_C_FIELD_NUMBER: _ClassVar[int]
    MEM_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    FAN_PCT_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    PCIE_TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PCIE_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_SBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_DBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAP_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAP_FAILURE_FIELD_NUMBER: _ClassVar[int]
    PCIE_REPLAY_COUNT_FIELD_NUMBER: _ClassVar[int]
    POWER_VIOLATION_US_FIELD_NUMBER: _ClassVar[int]
    THERMAL_VIOLATION_US_FIELD_NUMBER: _ClassVar[int]
    SYNC_BOOST_VIOLATION_US_FIELD_NUMBER: _ClassVar[int]
    FAN_RPM_FIELD_NUMBER: _ClassVar[int]
    SM_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    SM_OCCUPANCY_PCT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    DRAM_BW_UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    FP16_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    FP32_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    FP64_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    NVLINK_TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    NVLINK_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    gpu_index: int
    util_pct: float
    mem_util_pct: float
    mem_used_bytes: int
    mem_total_bytes: int
    power_w: float
    power_instant_w: float
    energy_j: float
    temp_c: float
    mem_temp_c: float
    fan_pct: float
    sm_clock_mhz: int
    mem_clock_mhz: int
    power_limit_w: float
    clock_event_reasons: int
    pcie_tx_bytes_per_s: float
    pcie_rx_bytes_per_s: float
    ecc_corrected_volatile: int
    ecc_uncorrected_volatile: int
    ecc_corrected_aggregate: int
    ecc_uncorrected_aggregate: int
    retired_pages_sbe: int
    retired_pages_dbe: int
    retired_pages_pending: bool
    remapped_rows_correctable: int
    remapped_rows_uncorrectable: int
    remap_pending: bool
    remap_failure: bool
    pcie_replay_count: int
    power_violation_us: int
    thermal_violation_us: int
    sync_boost_violation_us: int
    fan_rpm: float
    sm_active_pct: float
    sm_occupancy_pct: float
    tensor_active_pct: float
    dram_bw_util_pct: float
    fp16_active_pct: float
    fp32_active_pct: float
    fp64_active_pct: float
    nvlink_tx_bytes_per_s: float
    nvlink_rx_bytes_per_s: float
    health: _common_pb2.GpuHealth
    health_reason: str
    def __init__(self, time_unix_ns: _Optional[int] = ..., gpu_index: _Optional[int] = ..., util_pct: _Optional[float] = ..., mem_util_pct: _Optional[float] = ..., mem_used_bytes: _Optional[int] = ..., mem_total_bytes: _Optional[int] = ..., power_w: _Optional[float] = ..., power_instant_w: _Optional[float] = ..., energy_j: _Optional[float] = ..., temp_c: _Optional[float] = ..., mem_temp_c: _Optional[float] = ..., fan_pct: _Optional[float] = ..., sm_clock_mhz: _Optional[int] = ..., mem_clock_mhz: _Optional[int] = ..., power_limit_w: _Optional[float] = ..., clock_event_reasons: _Optional[int] = ..., pcie_tx_bytes_per_s: _Optional[float] = ..., pcie_rx_bytes_per_s: _Optional[float] = ..., ecc_corrected_volatile: _Optional[int] = ..., ecc_uncorrected_volatile: _Optional[int] = ..., ecc_corrected_aggregate: _Optional[int] = ..., ecc_uncorrected_aggregate: _Optional[int] = ..., retired_pages_sbe: _Optional[int] = ..., retired_pages_dbe: _Optional[int] = ..., retired_pages_pending: _Optional[bool] = ..., remapped_rows_correctable: _Optional[int] = ..., remapped_rows_uncorrectable: _Optional[int] = ..., remap_pending: _Optional[bool] = ..., remap_failure: _Optional[bool] = ..., pcie_replay_count: _Optional[int] = ..., power_violation_us: _Optional[int] = ..., thermal_violation_us: _Optional[int] = ..., sync_boost_violation_us: _Optional[int] = ..., fan_rpm: _Optional[float] = ..., sm_active_pct: _Optional[float] = ..., sm_occupancy_pct: _Optional[float] = ..., tensor_active_pct: _Optional[float] = ..., dram_bw_util_pct: _Optional[float] = ..., fp16_active_pct: _Optional[float] = ..., fp32_active_pct: _Optional[float] = ..., fp64_active_pct: _Optional[float] = ..., nvlink_tx_bytes_per_s: _Optional[float] = ..., nvlink_rx_bytes_per_s: _Optional[float] = ..., health: _Optional[_Union[_common_pb2.GpuHealth, str]] = ..., health_reason: _Optional[str] = ...) -> None: ...

class GpuEvent(_message.Message):
    __slots__ = ("time_unix_ns", "gpu_index", "kind", "data", "text", "gpu_instance_id")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    gpu_index: int
    kind: GpuEventKind
    data: int
    text: str
    gpu_instance_id: int
    def __init__(self, time_unix_ns: _Optional[int] = ..., gpu_index: _Optional[int] = ..., kind: _Optional[_Union[GpuEventKind, str]] = ..., data: _Optional[int] = ..., text: _Optional[str] = ..., gpu_instance_id: _Optional[int] = ...) -> None: ...

class ProcessSample(_message.Message):
    __slots__ = ("time_unix_ns", "gpu_index", "pid", "command", "cgroup", "used_memory_bytes", "sm_pct", "mem_util_pct", "energy_j", "ended")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SM_PCT_FIELD_NUMBER: _ClassVar[int]
    MEM_UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    gpu_index: int
    pid: int
    command: str
    cgroup: str
    used_memory_bytes: int
    sm_pct: float
    mem_util_pct: float
    energy_j: float
    ended: bool
    def __init__(self, time_unix_ns: _Optional[int] = ..., gpu_index: _Optional[int] = ..., pid: _Optional[int] = ..., command: _Optional[str] = ..., cgroup: _Optional[str] = ..., used_memory_bytes: _Optional[int] = ..., sm_pct: _Optional[float] = ..., mem_util_pct: _Optional[float] = ..., energy_j: _Optional[float] = ..., ended: _Optional[bool] = ...) -> None: ...

class NvLinkSample(_message.Message):
    __slots__ = ("time_unix_ns", "gpu_index", "link", "tx_bytes_per_s", "rx_bytes_per_s", "crc_flit_errors", "crc_data_errors", "replay_errors", "recovery_errors")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    CRC_FLIT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    CRC_DATA_ERRORS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    gpu_index: int
    link: int
    tx_bytes_per_s: float
    rx_bytes_per_s: float
    crc_flit_errors: int
    crc_data_errors: int
    replay_errors: int
    recovery_errors: int
    def __init__(self, time_unix_ns: _Optional[int] = ..., gpu_index: _Optional[int] = ..., link: _Optional[int] = ..., tx_bytes_per_s: _Optional[float] = ..., rx_bytes_per_s: _Optional[float] = ..., crc_flit_errors: _Optional[int] = ..., crc_data_errors: _Optional[int] = ..., replay_errors: _Optional[int] = ..., recovery_errors: _Optional[int] = ...) -> None: ...

class MigSample(_message.Message):
    __slots__ = ("time_unix_ns", "gpu_index", "gpu_instance_id", "mig_uuid", "name", "mem_used_bytes", "mem_total_bytes", "multiprocessor_count", "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_bw_util_pct", "fp16_active_pct", "fp32_active_pct", "fp64_active_pct")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MIG_UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MULTIPROCESSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    SM_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    SM_OCCUPANCY_PCT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    DRAM_BW_UTIL_PCT_FIELD_NUMBER: _ClassVar[int]
    FP16_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    FP32_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    FP64_ACTIVE_PCT_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    gpu_index: int
    gpu_instance_id: int
    mig_uuid: str
    name: str
    mem_used_bytes: int
    mem_total_bytes: int
    multiprocessor_count: int
    sm_active_pct: float
    sm_occupancy_pct: float
    tensor_active_pct: float
    dram_bw_util_pct: float
    fp16_active_pct: float
    fp32_active_pct: float
    fp64_active_pct: float
    def __init__(self, time_unix_ns: _Optional[int] = ..., gpu_index: _Optional[int] = ..., gpu_instance_id: _Optional[int] = ..., mig_uuid: _Optional[str] = ..., name: _Optional[str] = ..., mem_used_bytes: _Optional[int] = ..., mem_total_bytes: _Optional[int] = ..., multiprocessor_count: _Optional[int] = ..., sm_active_pct: _Optional[float] = ..., sm_occupancy_pct: _Optional[float] = ..., tensor_active_pct: _Optional[float] = ..., dram_bw_util_pct: _Optional[float] = ..., fp16_active_pct: _Optional[float] = ..., fp32_active_pct: _Optional[float] = ..., fp64_active_pct: _Optional[float] = ...) -> None: ...

class NodeSample(_message.Message):
    __slots__ = ("time_unix_ns", "cpu_pct", "mem_used_bytes", "mem_total_bytes", "load1", "hwmon_temp_c")
    class HwmonTempCEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    CPU_PCT_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    HWMON_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    cpu_pct: float
    mem_used_bytes: int
    mem_total_bytes: int
    load1: float
    hwmon_temp_c: _containers.ScalarMap[str, float]
    def __init__(self, time_unix_ns: _Optional[int] = ..., cpu_pct: _Optional[float] = ..., mem_used_bytes: _Optional[int] = ..., mem_total_bytes: _Optional[int] = ..., load1: _Optional[float] = ..., hwmon_temp_c: _Optional[_Mapping[str, float]] = ...) -> None: ...

class AcousticSample(_message.Message):
    __slots__ = ("time_unix_ns", "source", "gpu_index", "laeq_db", "laf_db", "est_dba", "tdp_flag")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAEQ_DB_FIELD_NUMBER: _ClassVar[int]
    LAF_DB_FIELD_NUMBER: _ClassVar[int]
    EST_DBA_FIELD_NUMBER: _ClassVar[int]
    TDP_FLAG_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    source: AcousticSource
    gpu_index: int
    laeq_db: float
    laf_db: float
    est_dba: float
    tdp_flag: bool
    def __init__(self, time_unix_ns: _Optional[int] = ..., source: _Optional[_Union[AcousticSource, str]] = ..., gpu_index: _Optional[int] = ..., laeq_db: _Optional[float] = ..., laf_db: _Optional[float] = ..., est_dba: _Optional[float] = ..., tdp_flag: _Optional[bool] = ...) -> None: ...

class TrainerSample(_message.Message):
    __slots__ = ("time_unix_ns", "probe_id", "workload", "gpu_index", "step", "samples_per_s", "step_time_s", "loss", "batch_size", "phase", "device", "point")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    probe_id: str
    workload: str
    gpu_index: int
    step: int
    samples_per_s: float
    step_time_s: float
    loss: float
    batch_size: int
    phase: _common_pb2.ProbePhase
    device: TrainerDevice
    point: int
    def __init__(self, time_unix_ns: _Optional[int] = ..., probe_id: _Optional[str] = ..., workload: _Optional[str] = ..., gpu_index: _Optional[int] = ..., step: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., step_time_s: _Optional[float] = ..., loss: _Optional[float] = ..., batch_size: _Optional[int] = ..., phase: _Optional[_Union[_common_pb2.ProbePhase, str]] = ..., device: _Optional[_Union[TrainerDevice, str]] = ..., point: _Optional[int] = ...) -> None: ...

class ProbeEvent(_message.Message):
    __slots__ = ("time_unix_ns", "probe_id", "workload", "kind", "phase", "status", "message", "gpu_index", "point", "batch_size", "power_limit", "power_limit_w", "temp_slowdown_c", "steady_samples")
    TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PROBE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    TEMP_SLOWDOWN_C_FIELD_NUMBER: _ClassVar[int]
    STEADY_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    time_unix_ns: int
    probe_id: str
    workload: str
    kind: ProbeEventKind
    phase: _common_pb2.ProbePhase
    status: _common_pb2.ProbeStatus
    message: str
    gpu_index: int
    point: int
    batch_size: int
    power_limit: str
    power_limit_w: float
    temp_slowdown_c: float
    steady_samples: int
    def __init__(self, time_unix_ns: _Optional[int] = ..., probe_id: _Optional[str] = ..., workload: _Optional[str] = ..., kind: _Optional[_Union[ProbeEventKind, str]] = ..., phase: _Optional[_Union[_common_pb2.ProbePhase, str]] = ..., status: _Optional[_Union[_common_pb2.ProbeStatus, str]] = ..., message: _Optional[str] = ..., gpu_index: _Optional[int] = ..., point: _Optional[int] = ..., batch_size: _Optional[int] = ..., power_limit: _Optional[str] = ..., power_limit_w: _Optional[float] = ..., temp_slowdown_c: _Optional[float] = ..., steady_samples: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("durable_seq", "rejections")
    DURABLE_SEQ_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    durable_seq: int
    rejections: _containers.RepeatedCompositeFieldContainer[BatchRejection]
    def __init__(self, durable_seq: _Optional[int] = ..., rejections: _Optional[_Iterable[_Union[BatchRejection, _Mapping[str, object]]]] = ...) -> None: ...

class BatchRejection(_message.Message):
    __slots__ = ("seq", "reason", "message", "rejected_samples")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    reason: RejectReason
    message: str
    rejected_samples: int
    def __init__(self, seq: _Optional[int] = ..., reason: _Optional[_Union[RejectReason, str]] = ..., message: _Optional[str] = ..., rejected_samples: _Optional[int] = ...) -> None: ...
