from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Virtualization(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VIRTUALIZATION_UNSPECIFIED: _ClassVar[Virtualization]
    VIRTUALIZATION_BARE_METAL: _ClassVar[Virtualization]
    VIRTUALIZATION_PASSTHROUGH: _ClassVar[Virtualization]
    VIRTUALIZATION_VGPU: _ClassVar[Virtualization]
    VIRTUALIZATION_HOST_VGPU: _ClassVar[Virtualization]

class GpuHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_HEALTH_UNSPECIFIED: _ClassVar[GpuHealth]
    GPU_HEALTH_HEALTHY: _ClassVar[GpuHealth]
    GPU_HEALTH_DEGRADED: _ClassVar[GpuHealth]
    GPU_HEALTH_FAILED: _ClassVar[GpuHealth]

class ProbePhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_PHASE_UNSPECIFIED: _ClassVar[ProbePhase]
    PROBE_PHASE_PENDING: _ClassVar[ProbePhase]
    PROBE_PHASE_IDLE_BASELINE: _ClassVar[ProbePhase]
    PROBE_PHASE_WARMUP: _ClassVar[ProbePhase]
    PROBE_PHASE_STEADY: _ClassVar[ProbePhase]
    PROBE_PHASE_COOLDOWN: _ClassVar[ProbePhase]
    PROBE_PHASE_DONE: _ClassVar[ProbePhase]

class ProbeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROBE_STATUS_UNSPECIFIED: _ClassVar[ProbeStatus]
    PROBE_STATUS_RUNNING: _ClassVar[ProbeStatus]
    PROBE_STATUS_SUCCEEDED: _ClassVar[ProbeStatus]
    PROBE_STATUS_FAILED: _ClassVar[ProbeStatus]
    PROBE_STATUS_CANCELLED: _ClassVar[ProbeStatus]
VIRTUALIZATION_UNSPECIFIED: Virtualization
VIRTUALIZATION_BARE_METAL: Virtualization
VIRTUALIZATION_PASSTHROUGH: Virtualization
VIRTUALIZATION_VGPU: Virtualization
VIRTUALIZATION_HOST_VGPU: Virtualization
GPU_HEALTH_UNSPECIFIED: GpuHealth
GPU_HEALTH_HEALTHY: GpuHealth
GPU_HEALTH_DEGRADED: GpuHealth
GPU_HEALTH_FAILED: GpuHealth
PROBE_PHASE_UNSPECIFIED: ProbePhase
PROBE_PHASE_PENDING: ProbePhase
PROBE_PHASE_IDLE_BASELINE: ProbePhase
PROBE_PHASE_WARMUP: ProbePhase
PROBE_PHASE_STEADY: ProbePhase
PROBE_PHASE_COOLDOWN: ProbePhase
PROBE_PHASE_DONE: ProbePhase
PROBE_STATUS_UNSPECIFIED: ProbeStatus
PROBE_STATUS_RUNNING: ProbeStatus
PROBE_STATUS_SUCCEEDED: ProbeStatus
PROBE_STATUS_FAILED: ProbeStatus
PROBE_STATUS_CANCELLED: ProbeStatus

class AgentIdentity(_message.Message):
    __slots__ = ("agent_id", "host", "cluster", "cloud", "instance_type", "region", "virtualization")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CLOUD_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    VIRTUALIZATION_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    host: str
    cluster: str
    cloud: str
    instance_type: str
    region: str
    virtualization: Virtualization
    def __init__(self, agent_id: _Optional[str] = ..., host: _Optional[str] = ..., cluster: _Optional[str] = ..., cloud: _Optional[str] = ..., instance_type: _Optional[str] = ..., region: _Optional[str] = ..., virtualization: _Optional[_Union[Virtualization, str]] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "uuid", "name", "pci_bus_id", "memory_total_bytes", "power_limit_min_w", "power_limit_max_w", "power_limit_default_w", "temp_slowdown_c", "temp_shutdown_c", "temp_gpu_max_c", "temp_mem_max_c", "driver_version", "architecture", "fan_count", "passive_cooling", "compute_capability", "vbios_version", "pcie_gen_max", "pcie_width_max", "mig_enabled", "gpm_supported")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_MIN_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_MAX_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_DEFAULT_W_FIELD_NUMBER: _ClassVar[int]
    TEMP_SLOWDOWN_C_FIELD_NUMBER: _ClassVar[int]
    TEMP_SHUTDOWN_C_FIELD_NUMBER: _ClassVar[int]
    TEMP_GPU_MAX_C_FIELD_NUMBER: _ClassVar[int]
    TEMP_MEM_MAX_C_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    FAN_COUNT_FIELD_NUMBER: _ClassVar[int]
    PASSIVE_COOLING_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    VBIOS_VERSION_FIELD_NUMBER: _ClassVar[int]
    PCIE_GEN_MAX_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_MAX_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    GPM_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    power_limit_min_w: float
    power_limit_max_w: float
    power_limit_default_w: float
    temp_slowdown_c: float
    temp_shutdown_c: float
    temp_gpu_max_c: float
    temp_mem_max_c: float
    driver_version: str
    architecture: str
    fan_count: int
    passive_cooling: bool
    compute_capability: str
    vbios_version: str
    pcie_gen_max: int
    pcie_width_max: int
    mig_enabled: bool
    gpm_supported: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., power_limit_min_w: _Optional[float] = ..., power_limit_max_w: _Optional[float] = ..., power_limit_default_w: _Optional[float] = ..., temp_slowdown_c: _Optional[float] = ..., temp_shutdown_c: _Optional[float] = ..., temp_gpu_max_c: _Optional[float] = ..., temp_mem_max_c: _Optional[float] = ..., driver_version: _Optional[str] = ..., architecture: _Optional[str] = ..., fan_count: _Optional[int] = ..., passive_cooling: _Optional[bool] = ..., compute_capability: _Optional[str] = ..., vbios_version: _Optional[str] = ..., pcie_gen_max: _Optional[int] = ..., pcie_width_max: _Optional[int] = ..., mig_enabled: _Optional[bool] = ..., gpm_supported: _Optional[bool] = ...) -> None: ...
