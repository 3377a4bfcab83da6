"""Part: sim. GPU profiles for the simulator: real datasheet figures plus the documented thermal ground truth.

Identity, memory, power limits, clocks, temperature thresholds, peak fp16 tensor throughput and
memory bandwidth are the figures the real parts report (NVIDIA datasheets and public
``nvidia-smi -q`` dumps). Idle power and the thermal parameters (``ambient_c``, ``r_th_c_per_w``,
``tau_s``, ``r_fast_c_per_w``, ``tau_fast_s``, ``inlet_c_per_w``, ``inlet_tau_s``, ``slot_offset_c``,
``fan_conductance_floor``, the memory's) are not published by NVIDIA: they are chosen to be
representative and are the *ground truth* the model fits are checked against
(``gpuprobe.sim.thermal`` computes the figures a fit should recover). The DVFS curve (``uncore_power_share``,
``voltage_*``) and the achievable efficiencies are the simulator's *model* choices, calibrated in
``gpuprobe.sim.perf`` against published training throughput (``docs/simulator.md`` lists every
parameter and is checked against this table by the tests).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpuprobe.errors import ConfigError

GIB = 1024**3
MIB = 1024**2

# nvmlDeviceArchitecture_t
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9

# nvmlBrandType_t
# nvmlBrandType_t. Drivers report the datacenter parts (A100, H100, H200, L4) as NVML_BRAND_NVIDIA ("Product
# Brand : NVIDIA" in public nvidia-smi -q dumps of them, drivers 525-560), not the older NVML_BRAND_TESLA (2)
BRAND_GEFORCE = 5
BRAND_NVIDIA = 14

# nvmlGpuVirtualizationMode_t, as nvmlDeviceGetVirtualizationMode reports it
VIRT_NONE = 0
VIRT_PASSTHROUGH = 1
VIRT_VGPU = 2
VIRT_NAMES: dict[str, int] = {"none": VIRT_NONE, "passthrough": VIRT_PASSTHROUGH, "vgpu": VIRT_VGPU}
# Throughput lost to virtualization when a GPU's virt_overhead_pct is not set (derived from its mode).
# Published overheads: PCIe passthrough costs about 0-2 % of bare-metal training throughput, NVIDIA
# vGPU (time-sliced, full-GPU profile) about 3-6 %; the defaults sit in those ranges.
DEFAULT_VIRT_OVERHEAD_PCT: dict[int, float] = {VIRT_NONE: 0.0, VIRT_PASSTHROUGH: 1.0, VIRT_VGPU: 4.5}


@dataclass(frozen=True)
class GpuProfile:
    """Everything the C library needs to simulate one GPU model. Units are in the names."""

    name: str  # the profile's name on the command line
    nvml_name: str  # what nvmlDeviceGetName returns
    architecture: int
    brand: int
    cuda_cc_major: int
    cuda_cc_minor: int
    pci_device_id: int  # (device << 16) | vendor, as in nvmlPciInfo_t.pciDeviceId
    memory_total_bytes: int
    memory_reserved_bytes: int  # used by the driver even with no process
    # power
    idle_w: float
    peak_demand_w: float  # what the chip would draw at 100 % utilization without a power cap
    limit_default_w: float  # TDP; the enforced limit until someone sets another
    limit_min_w: float
    limit_max_w: float
    power_usage_is_average: bool  # GetPowerUsage: 1 s average on Ampere (not GA100) and newer
    # thermal ground truth (docs/simulator.md, "Temperature"; gpuprobe.sim.thermal): the die is
    # T = T_amb + slot_offset + dT_inlet + dT_fast + dT_slow, three first-order stages
    ambient_c: float
    r_th_c_per_w: float  # TOTAL own-power resistance, fast + slow stage, at full fan on fan-cooled parts
    tau_s: float  # the slow (heatsink) stage's time constant, at full fan
    r_fast_c_per_w: float  # the fast (die) stage's share of r_th_c_per_w; the slow stage has the rest
    tau_fast_s: float  # the fast stage's time constant (0: it settles within a tick)
    inlet_c_per_w: float  # inlet air warming per W of the whole machine's GPU power
    inlet_tau_s: float  # the inlet air's time constant
    slot_offset_c: float  # this slot's constant offset over the room (a hotter slot: > 0)
    # the heatsink's conductance at 0 % fan relative to 100 % (1: the fan does not matter; passive parts)
    fan_conductance_floor: float
    mem_r_th_c_per_w: float
    mem_tau_s: float
    mem_temp_supported: bool
    # thresholds (nvmlTemperatureThresholds_t)
    shutdown_c: int
    slowdown_c: int
    gpu_max_c: int
    mem_max_c: int
    # clocks
    sm_clock_max_mhz: int
    sm_clock_base_mhz: int
    sm_clock_idle_mhz: int
    mem_clock_mhz: int
    # thermal slowdown cuts the active power (above idle) to this fraction; the SM clock is then the
    # one the DVFS curve below gives for that power
    throttle_clock_factor: float
    # DVFS model (docs/simulator.md, "Clocks: the DVFS curve"): the active power at SM clock fraction x is
    # (P(u) - P_idle) * (s + (1 - s) * x * v(x)^2), v the voltage relative to the one at the maximum clock
    uncore_power_share: float  # s: active power that does not scale with the SM clock (memory, fabric)
    voltage_floor: float  # v below the knee: the lowest voltage the chip runs at, relative to v(1)
    voltage_knee: float  # the clock fraction above which the voltage has to rise with the clock
    voltage_exponent: float  # v(x) = floor + (1 - floor) * ((x - knee) / (1 - knee)) ** exponent above it
    # cooling: fans only on fan-cooled cards; passive parts answer NOT_SUPPORTED
    fan_count: int
    fan_min_pct: int
    fan_t_low_c: float  # fan at its minimum below this temperature
    fan_t_high_c: float  # fan at 100 % above this temperature
    # other activity, proportional to utilization
    mem_util_per_util: float
    pcie_bytes_per_s_at_full_util: float
    pcie_gen: int
    pcie_width: int
    ecc_supported: bool
    # performance (gpuprobe.sim.perf): datasheet peaks and the fractions of them training reaches
    peak_fp16_tflops: float  # dense fp16/bf16 tensor throughput (fp32 accumulate), no sparsity
    mem_bandwidth_gb_s: float  # device memory bandwidth, GB/s (10^9 B/s)
    compute_efficiency: float  # of peak_fp16_tflops, reached by transformer training at the maximum clock
    memory_efficiency: float  # of mem_bandwidth_gb_s, reached by training's activation and parameter traffic
    # virtualization, per GPU: the mode nvmlDeviceGetVirtualizationMode reports and what it costs
    virt: int = VIRT_NONE
    virt_overhead_pct: float | None = None  # None: derived from virt (DEFAULT_VIRT_OVERHEAD_PCT)
    # health (docs/simulator.md, "Health"): NVLink links (0: none, NVLink calls answer NOT_SUPPORTED),
    # whether uncorrectable ECC errors remap rows (Ampere and newer) or retire pages (older parts)
    nvlink_links: int = 0
    # NVLink error counters that answer NOT_SUPPORTED (nvml.h: the DL counters on Blackwell and newer): bit c
    # for nvmlNvLinkErrorCounter_t c (1 DL_REPLAY, 2 DL_RECOVERY, 4 DL_CRC_FLIT, 8 DL_CRC_DATA, 16 DL_ECC_DATA);
    # their total fields (52, 59, 38, 45) too
    nvlink_unsupported_counters: int = 0
    row_remapping: bool = False
    # MIG: 0 off; N (1-7, MIG-capable datacenter parts only) splits the GPU into N 1g instances
    mig_instances: int = 0

    @property
    def mig_capable(self) -> bool:
        """A100, H100, H200: the datacenter parts of compute capability x.0 (as nvmlDeviceGetMigMode says)."""
        return self.brand == BRAND_NVIDIA and self.architecture >= ARCH_AMPERE and self.cuda_cc_minor == 0

    @property
    def gpm_supported(self) -> bool:
        """GPU performance monitoring (nvmlGpm*): Hopper and newer."""
        return self.architecture >= ARCH_HOPPER

    @property
    def passive(self) -> bool:
        return self.fan_count == 0

    def power_w(self, util_pct: float, limit_w: float | None = None) -> float:
        """Steady power at a utilization, capped by the power limit (no thermal slowdown)."""
        demand_w = self.idle_w + (self.peak_demand_w - self.idle_w) * util_pct / 100.0
        return min(demand_w, self.limit_default_w if limit_w is None else limit_w)


# The inlet air of a machine warms by about 1 °C per kW its GPUs draw and settles in minutes; no slot is
# hotter than another unless a test or a user sets one (chosen, representative: docs/simulator.md).
_AIRFLOW = dict(inlet_c_per_w=0.001, inlet_tau_s=120.0, slot_offset_c=0.0)

_DATACENTER = dict(
    brand=BRAND_NVIDIA,
    fan_count=0,
    fan_min_pct=0,
    fan_t_low_c=0.0,
    fan_t_high_c=0.0,
    fan_conductance_floor=1.0,  # passive: the chassis fans, not the GPU, move the air
    **_AIRFLOW,
    ecc_supported=True,
    mem_temp_supported=True,
    throttle_clock_factor=0.7,
)

PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in [
        GpuProfile(
            name="A100-SXM4-80GB",
            nvlink_links=12,
            row_remapping=True,
            nvml_name="NVIDIA A100-SXM4-80GB",
            architecture=ARCH_AMPERE,
            cuda_cc_major=8,
            cuda_cc_minor=0,
            pci_device_id=0x20B210DE,
            memory_total_bytes=81920 * MIB,
            memory_reserved_bytes=512 * MIB,
            idle_w=55.0,
            peak_demand_w=440.0,
            limit_default_w=400.0,
            limit_min_w=100.0,
            limit_max_w=400.0,
            power_usage_is_average=False,  # GA100 reports instantaneous power
            ambient_c=30.0,
            r_th_c_per_w=0.11,
            tau_s=25.0,
            r_fast_c_per_w=0.05,
            tau_fast_s=2.0,
            mem_r_th_c_per_w=0.09,
            mem_tau_s=40.0,
            shutdown_c=92,
            slowdown_c=89,
            gpu_max_c=85,
            mem_max_c=95,
            sm_clock_max_mhz=1410,
            sm_clock_base_mhz=1095,
            sm_clock_idle_mhz=210,
            mem_clock_mhz=1593,
            mem_util_per_util=0.45,
            pcie_bytes_per_s_at_full_util=4.0e9,
            pcie_gen=4,
            pcie_width=16,
            peak_fp16_tflops=312.0,
            mem_bandwidth_gb_s=2039.0,
            compute_efficiency=0.35,
            memory_efficiency=0.8,
            uncore_power_share=0.0,
            voltage_floor=0.8,
            voltage_knee=0.85,
            voltage_exponent=6.0,
            **_DATACENTER,  # type: ignore[arg-type]
        ),
        GpuProfile(
            name="H100-SXM5-80GB",
            nvlink_links=18,
            row_remapping=True,
            nvml_name="NVIDIA H100 80GB HBM3",
            architecture=ARCH_HOPPER,
            cuda_cc_major=9,
            cuda_cc_minor=0,
            pci_device_id=0x233010DE,
            memory_total_bytes=81559 * MIB,
            memory_reserved_bytes=530 * MIB,
            idle_w=70.0,
            peak_demand_w=760.0,
            limit_default_w=700.0,
            limit_min_w=200.0,
            limit_max_w=700.0,
            power_usage_is_average=True,
            ambient_c=30.0,
            r_th_c_per_w=0.07,
            tau_s=30.0,
            r_fast_c_per_w=0.032,
            tau_fast_s=1.5,
            mem_r_th_c_per_w=0.06,
            mem_tau_s=45.0,
            shutdown_c=92,
            slowdown_c=89,
            gpu_max_c=87,
            mem_max_c=95,
            sm_clock_max_mhz=1980,
            sm_clock_base_mhz=1590,
            sm_clock_idle_mhz=345,
            mem_clock_mhz=2619,
            mem_util_per_util=0.5,
            pcie_bytes_per_s_at_full_util=8.0e9,
            pcie_gen=5,
            pcie_width=16,
            peak_fp16_tflops=989.0,
            mem_bandwidth_gb_s=3350.0,
            compute_efficiency=0.195,
            memory_efficiency=0.8,
            uncore_power_share=0.08,
            voltage_floor=0.82,
            voltage_knee=0.85,
            voltage_exponent=6.0,
            **_DATACENTER,  # type: ignore[arg-type]
        ),
        GpuProfile(
            name="H200-SXM-141GB",
            nvlink_links=18,
            row_remapping=True,
            nvml_name="NVIDIA H200",
            architecture=ARCH_HOPPER,
            cuda_cc_major=9,
            cuda_cc_minor=0,
            pci_device_id=0x233510DE,
            memory_total_bytes=143771 * MIB,
            memory_reserved_bytes=560 * MIB,
            idle_w=75.0,
            peak_demand_w=760.0,
            limit_default_w=700.0,
            limit_min_w=200.0,
            limit_max_w=700.0,
            power_usage_is_average=True,
            ambient_c=30.0,
            r_th_c_per_w=0.068,
            tau_s=32.0,
            r_fast_c_per_w=0.03,
            tau_fast_s=1.5,
            mem_r_th_c_per_w=0.058,
            mem_tau_s=48.0,
            shutdown_c=92,
            slowdown_c=89,
            gpu_max_c=87,
            mem_max_c=95,
            sm_clock_max_mhz=1980,
            sm_clock_base_mhz=1590,
            sm_clock_idle_mhz=345,
            mem_clock_mhz=3201,
            mem_util_per_util=0.55,
            pcie_bytes_per_s_at_full_util=8.0e9,
            pcie_gen=5,
            pcie_width=16,
            peak_fp16_tflops=989.0,
            mem_bandwidth_gb_s=4800.0,
            compute_efficiency=0.22,
            memory_efficiency=0.8,
            uncore_power_share=0.05,
            voltage_floor=0.85,
            voltage_knee=0.85,
            voltage_exponent=6.0,
            **_DATACENTER,  # type: ignore[arg-type]
        ),
        GpuProfile(
            name="L4",
            nvlink_links=0,
            row_remapping=True,
            nvml_name="NVIDIA L4",
            architecture=ARCH_ADA,
            cuda_cc_major=8,
            cuda_cc_minor=9,
            pci_device_id=0x27B810DE,
            memory_total_bytes=23034 * MIB,
            memory_reserved_bytes=300 * MIB,
            idle_w=16.0,
            peak_demand_w=78.0,
            limit_default_w=72.0,
            limit_min_w=40.0,
            limit_max_w=72.0,
            power_usage_is_average=True,
            ambient_c=30.0,
            r_th_c_per_w=0.70,
            tau_s=40.0,
            r_fast_c_per_w=0.31,
            tau_fast_s=2.5,
            mem_r_th_c_per_w=0.60,
            mem_tau_s=55.0,
            shutdown_c=95,
            slowdown_c=92,
            gpu_max_c=88,
            mem_max_c=95,
            sm_clock_max_mhz=2040,
            sm_clock_base_mhz=795,
            sm_clock_idle_mhz=210,
            mem_clock_mhz=6251,
            mem_util_per_util=0.4,
            pcie_bytes_per_s_at_full_util=2.0e9,
            pcie_gen=4,
            pcie_width=16,
            peak_fp16_tflops=121.0,
            mem_bandwidth_gb_s=300.0,
            compute_efficiency=0.65,
            memory_efficiency=0.8,
            uncore_power_share=0.2,
            voltage_floor=0.75,
            voltage_knee=0.85,
            voltage_exponent=6.0,
            **_DATACENTER,  # type: ignore[arg-type]
        ),
        GpuProfile(
            name="RTX-4090",
            nvml_name="NVIDIA GeForce RTX 4090",
            architecture=ARCH_ADA,
            brand=BRAND_GEFORCE,
            cuda_cc_major=8,
            cuda_cc_minor=9,
            pci_device_id=0x268410DE,
            memory_total_bytes=24564 * MIB,
            memory_reserved_bytes=400 * MIB,
            idle_w=20.0,
            peak_demand_w=480.0,
            limit_default_w=450.0,
            limit_min_w=150.0,
            limit_max_w=600.0,
            power_usage_is_average=True,
            ambient_c=25.0,
            r_th_c_per_w=0.11,
            tau_s=20.0,
            r_fast_c_per_w=0.05,
            tau_fast_s=1.0,
            mem_r_th_c_per_w=0.10,
            mem_tau_s=30.0,
            mem_temp_supported=False,  # GeForce boards do not expose the memory sensor through NVML
            shutdown_c=95,
            slowdown_c=92,
            gpu_max_c=90,
            mem_max_c=95,
            sm_clock_max_mhz=2520,
            sm_clock_base_mhz=2235,
            sm_clock_idle_mhz=210,
            mem_clock_mhz=10501,
            throttle_clock_factor=0.7,
            fan_count=2,
            fan_min_pct=30,
            fan_t_low_c=40.0,
            fan_t_high_c=83.0,
            # the heatsink passes about half its full-fan heat flow at fan stop (chosen, representative)
            fan_conductance_floor=0.5,
            **_AIRFLOW,  # type: ignore[arg-type]
            mem_util_per_util=0.35,
            pcie_bytes_per_s_at_full_util=4.0e9,
            pcie_gen=4,
            pcie_width=16,
            peak_fp16_tflops=165.2,
            mem_bandwidth_gb_s=1008.0,
            compute_efficiency=0.55,
            memory_efficiency=0.8,
            uncore_power_share=0.2,
            voltage_floor=0.95,
            voltage_knee=0.85,
            voltage_exponent=6.0,
            ecc_supported=False,
        ),
    ]
}


MAX_MIG_INSTANCES = 7  # 1g instances on a 7-slice GPU (A100, H100, H200)

# Simulated GPM activity per workload (docs/simulator.md, "GPM"): each metric as a fraction of the GPU's
# utilization, in the C library's order (sm_util, sm_occupancy, any_tensor_util, dram_bw_util, fp16_util,
# fp32_util, fp64_util). Chosen, representative: not measured. sm_util <= 1 keeps SM activity at or
# below the utilization NVML reports (a kernel running on some SMs counts as utilization). Row 0 is a
# load that names no workload. The row index is the workload's id in the events file: append only.
GPM_METRICS: tuple[str, ...] = (
    "sm_util",
    "sm_occupancy",
    "any_tensor_util",
    "dram_bw_util",
    "fp16_util",
    "fp32_util",
    "fp64_util",
)
WORKLOAD_ACTIVITY: dict[str, tuple[float, float, float, float, float, float, float]] = {
    "generic": (0.85, 0.35, 0.30, 0.40, 0.05, 0.15, 0.0),
    "idle": (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    "resnet50": (0.90, 0.45, 0.35, 0.55, 0.10, 0.20, 0.0),
    "bert-base": (0.92, 0.40, 0.55, 0.45, 0.08, 0.12, 0.0),
    "gpt": (0.95, 0.40, 0.70, 0.50, 0.06, 0.10, 0.0),
    "matmul-burn": (0.98, 0.30, 0.92, 0.20, 0.01, 0.03, 0.0),
}
WORKLOAD_IDS: dict[str, int] = {name: i for i, name in enumerate(WORKLOAD_ACTIVITY)}


class UnknownProfileError(ConfigError):
    pass


def get_profile(name: str) -> GpuProfile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(PROFILES)
        raise UnknownProfileError(f"unknown GPU profile {name!r}; known profiles: {known}") from None


def parse_profile_list(spec: str, gpus: int | None, default_count: int = 1) -> list[GpuProfile]:
    """``H100-SXM5-80GB`` or ``4xH100-SXM5-80GB,2xL4`` -> one profile per GPU.

    A single profile without a count is repeated ``gpus`` times (``default_count`` when ``gpus`` is
    None); a list must describe exactly ``gpus`` GPUs when both are given.
    """
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise UnknownProfileError("empty --profile")
    result: list[GpuProfile] = []
    counted = False
    for part in parts:
        count_str, sep, name = part.partition("x")
        if sep and count_str.isdigit():
            counted = True
            result.extend([get_profile(name)] * int(count_str))
        else:
            result.append(get_profile(part))
    if len(result) == 1 and not counted:
        return result * (default_count if gpus is None else gpus)
    if gpus is None:
        return result
    if len(result) != gpus:
        raise UnknownProfileError(f"--profile {spec!r} describes {len(result)} GPUs but --gpus is {gpus}")
    return result


_FIELD_TYPES: dict[str, str] = {f.name: str(f.type) for f in dataclasses.fields(GpuProfile)}
_NOT_OVERRIDABLE = ("name", "nvml_name")


def parse_value(key: str, raw: str) -> object:
    """One parameter of a profile from its text (``--set GPU.KEY=VALUE``, a machine's ``sim.conf``).

    ``virt`` takes a name (none, passthrough, vgpu) or NVML's number; ``virt_overhead_pct`` takes
    ``auto`` (or ``None``) for the value derived from ``virt``. Raises ValueError for a bad value."""
    kind = _FIELD_TYPES[key]
    text = raw.strip()
    if kind == "bool":
        if text.lower() not in ("0", "1", "true", "false"):
            raise ValueError(raw)
        return text.lower() in ("1", "true")
    if key == "virt":
        mode = VIRT_NAMES[text.lower()] if text.lower() in VIRT_NAMES else int(text)
        if mode not in VIRT_NAMES.values():
            raise ValueError(raw)
        return mode
    if kind == "int":
        return int(text)
    if kind == "float | None":
        if text.lower() in ("none", "auto"):
            return None
        value = float(text)
        if not 0.0 <= value < 100.0:
            raise ValueError(raw)
        return value
    if kind == "float":
        return float(text)
    return raw


def with_overrides(profile: GpuProfile, overrides: dict[str, str]) -> GpuProfile:
    """A copy of ``profile`` with some parameters replaced (``--set 3.r_th_c_per_w=0.09``, ``--set 0.virt=vgpu``)."""
    changes: dict[str, object] = {}
    for key, raw in overrides.items():
        if key not in _FIELD_TYPES or key in _NOT_OVERRIDABLE:
            raise UnknownProfileError(f"cannot override {key!r}; parameters: {', '.join(sorted(_FIELD_TYPES))}")
        try:
            changes[key] = parse_value(key, raw)
        except ValueError:
            hint = f" (one of {', '.join(VIRT_NAMES)}, or 0-2)" if key == "virt" else ""
            hint = " (auto, or a percentage 0 <= pct < 100)" if key == "virt_overhead_pct" else hint
            raise UnknownProfileError(f"bad value {raw!r} for {key}{hint}") from None
    result = dataclasses.replace(profile, **changes)  # type: ignore[arg-type]
    problem = thermal_problem(result)
    if problem:
        raise UnknownProfileError(f"bad thermal parameters for {profile.name}: {problem}")
    problem = health_problem(result)
    if problem:
        raise UnknownProfileError(f"bad parameters for {profile.name}: {problem}")
    return result


def health_problem(profile: GpuProfile) -> str | None:
    """Why the NVLink, ECC or MIG parameters cannot describe this GPU, or None."""
    p = profile
    if not 0 <= p.nvlink_links <= 18:
        return f"nvlink_links ({p.nvlink_links}) must be between 0 and 18"
    if not 0 <= p.nvlink_unsupported_counters < 32:
        return f"nvlink_unsupported_counters ({p.nvlink_unsupported_counters}) is a mask of counters 0-4 (0-31)"
    if not 0 <= p.mig_instances <= MAX_MIG_INSTANCES:
        return f"mig_instances ({p.mig_instances}) must be between 0 and {MAX_MIG_INSTANCES}"
    if p.mig_instances and not p.mig_capable:
        return f"{p.name} does not support MIG (A100, H100 and H200 do)"
    return None


def thermal_problem(profile: GpuProfile) -> str | None:
    """Why the thermal parameters cannot describe a GPU (the C library would divide by zero or run a stage
    backwards), or None."""
    p = profile
    if not p.tau_s > 0 or not p.mem_tau_s > 0:
        return f"tau_s ({p.tau_s}) and mem_tau_s ({p.mem_tau_s}) must be > 0"
    if not 0 <= p.r_fast_c_per_w <= p.r_th_c_per_w:
        return f"r_fast_c_per_w ({p.r_fast_c_per_w}) must be between 0 and r_th_c_per_w ({p.r_th_c_per_w})"
    if p.tau_fast_s < 0 or p.inlet_tau_s < 0 or p.inlet_c_per_w < 0:
        return "tau_fast_s, inlet_tau_s and inlet_c_per_w must be >= 0"
    if not 0 < p.fan_conductance_floor <= 1:
        return f"fan_conductance_floor ({p.fan_conductance_floor}) must be > 0 and <= 1"
    return None


def virt_overhead_pct(profile: GpuProfile) -> float:
    """The throughput a GPU loses to virtualization: its own ``virt_overhead_pct``, or the mode's default."""
    if profile.virt_overhead_pct is not None:
        return profile.virt_overhead_pct
    return DEFAULT_VIRT_OVERHEAD_PCT[profile.virt]
