"""Part: agent. dcgm-exporter's metric names for gpuprobe's ``gpu`` fields: the one table, keyed by gpuprobe field name.

The names, types and help texts are those of dcgm-exporter's ``etc/default-counters.csv`` (NVIDIA's
public repository, https://github.com/NVIDIA/dcgm-exporter; the CSV's commented-out counters and the
DCP ``DCGM_FI_PROF_*`` ones are included where NVML gives gpuprobe the value), with dcgm-exporter's
units: ``scale`` and ``divisor`` turn gpuprobe's unit into dcgm-exporter's (MiB, mJ, a ratio 0-1). gpuprobe's own
extras (what dcgm-exporter lacks) carry the ``gpuprobe_`` prefix and Prometheus' base units.

Kept on its own, with no other import, so that the field catalogue can take it over as one column.
``docs/dcgm-exporter.md`` lists what is served and what is not (and why).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class PromMetric:
    name: str
    type: str  # "gauge" or "counter", as dcgm-exporter declares it
    help: str
    scale: float = 1.0  # the metric's value is gpuprobe's times scale, divided by divisor
    divisor: float = 1.0  # (a division, so that 42 % is 0.42 exactly, not 42 * 0.01)


def _gauge(name: str, help: str, scale: float = 1.0, divisor: float = 1.0) -> PromMetric:
    return PromMetric(name, "gauge", help, scale, divisor)


def _ratio(name: str, help: str) -> PromMetric:
    """DCGM's profiling ratio (0-1) of a gpuprobe percentage."""
    return PromMetric(name, "gauge", help, divisor=100.0)


def _counter(name: str, help: str, scale: float = 1.0, divisor: float = 1.0) -> PromMetric:
    return PromMetric(name, "counter", help, scale, divisor)


#: gpuprobe field of a GPU sample -> the metrics it is served as (in this order on the page).
#: ``mem_free_bytes`` is not a sample field: it is ``mem_total_bytes - mem_used_bytes``.
GPU_FIELDS: dict[str, tuple[PromMetric, ...]] = {
    # dcgm-exporter's default counters
    "sm_clock_mhz": (_gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),),
    "mem_clock_mhz": (_gauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),),
    "mem_temp_c": (_gauge("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),),
    "temp_c": (_gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),),
    "power_w": (_gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),),
    "energy_j": (
        _counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", 1000.0),
        _counter("gpuprobe_gpu_energy_joules_total", "NVML's energy counter since the driver loaded, in J."),
    ),
    "pcie_replay_count": (_counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries."),),
    "util_pct": (_gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),),
    "mem_util_pct": (_gauge("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),),
    "mem_free_bytes": (_gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", divisor=MIB),),
    "mem_used_bytes": (_gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", divisor=MIB),),
    "remapped_rows_uncorrectable": (
        _counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors"),
    ),
    "remapped_rows_correctable": (
        _counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors"),
    ),
    "remap_failure": (_gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed"),),
    # the CSV's commented-out counters and other DCGM fields NVML gives
    "power_instant_w": (_gauge("DCGM_FI_DEV_POWER_USAGE_INSTANT", "Current instantaneous power usage (in W)."),),
    "power_limit_w": (_gauge("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Current power limit (in W)."),),
    "fan_pct": (_gauge("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %)."),),
    "clock_event_reasons": (_gauge("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Current clock event reasons (bitmask)."),),
    "remap_pending": (_gauge("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending"),),
    "power_violation_us": (
        _counter("DCGM_FI_DEV_POWER_VIOLATION", "Throttling duration due to power constraints (in us)."),
    ),
    "thermal_violation_us": (
        _counter("DCGM_FI_DEV_THERMAL_VIOLATION", "Throttling duration due to thermal constraints (in us)."),
    ),
    "sync_boost_violation_us": (
        _counter("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "Throttling duration due to sync-boost constraints (in us)."),
    ),
    "ecc_corrected_volatile": (
        _counter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors."),
    ),
    "ecc_uncorrected_volatile": (
        _counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors."),
    ),
    "ecc_corrected_aggregate": (
        _counter("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors."),
    ),
    "ecc_uncorrected_aggregate": (
        _counter("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors."),
    ),
    "retired_pages_sbe": (
        _counter("DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors."),
    ),
    "retired_pages_dbe": (
        _counter("DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors."),
    ),
    "sm_active_pct": (_ratio("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned."),),
    "sm_occupancy_pct": (_ratio("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of number of warps resident on an SM."),),
    "tensor_active_pct": (
        _ratio("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ),
    "dram_bw_util_pct": (_ratio("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active."),),
    "fp16_active_pct": (_ratio("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipe is active."),),
    "fp32_active_pct": (_ratio("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipe is active."),),
    "fp64_active_pct": (_ratio("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipe is active."),),
    # gpuprobe's extras
    "pcie_tx_bytes_per_s": (
        _gauge("gpuprobe_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput (NVML's sampled rate)."),
    ),
    "pcie_rx_bytes_per_s": (
        _gauge("gpuprobe_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput (NVML's sampled rate)."),
    ),
    "nvlink_tx_bytes_per_s": (
        _gauge("gpuprobe_gpu_nvlink_tx_bytes_per_second", "NVLink transmit throughput over all links."),
    ),
    "nvlink_rx_bytes_per_s": (
        _gauge("gpuprobe_gpu_nvlink_rx_bytes_per_second", "NVLink receive throughput over all links."),
    ),
    "fan_rpm": (_gauge("gpuprobe_gpu_fan_rpm", "Fan speed in RPM, mean over the GPU's fans."),),
    "retired_pages_pending": (
        _gauge("gpuprobe_gpu_retired_pages_pending", "1 while a page retirement waits for a reset."),
    ),
    "health": (_gauge("gpuprobe_gpu_health", "The agent's verdict: 1 healthy, 2 degraded, 3 failed (GpuHealth)."),),
    # the acoustic proxy's estimate of the GPU (an AcousticSample, not a GPU sample field: ``acoustic_`` +
    # its field name)
    "acoustic_est_dba": (_gauge("gpuprobe_gpu_acoustic_proxy_dba", "The acoustic proxy's estimate, in dB(A)."),),
    "acoustic_tdp_flag": (
        _gauge("gpuprobe_gpu_acoustic_tdp_flag", "1 while power exceeds the proxy's fraction of the TDP."),
    ),
}

#: dcgm-exporter's last-XID gauge (from the GPU events, not a sample field).
XID_LAST = _gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
#: gpuprobe's count of XID events by code (``xid`` label): each event once, so it never sticks.
XID_EVENTS = _counter("gpuprobe_gpu_xid_events_total", "XID events the GPU reported, by code (xid label).")

#: dcgm-exporter's labels of every GPU metric, in its order; ``pod``, ``namespace``, ``container`` follow
#: where the kubelet's pod-resources API assigns the GPU to a container.
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
POD_LABELS = ("pod", "namespace", "container")

#: The counters dcgm-exporter's ``etc/default-counters.csv`` enables (its uncommented lines).
DCGM_DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)

#: Default counters not served, and why (docs/dcgm-exporter.md says the same).
NOT_SERVED = {
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": "NVML gives a sampled rate, not DCGM's running KB counter:"
    " gpuprobe_gpu_pcie_tx_bytes_per_second",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": "as TX: gpuprobe_gpu_pcie_rx_bytes_per_second",
    "DCGM_FI_DEV_ENC_UTIL": "the agent does not read the encoder's utilization",
    "DCGM_FI_DEV_DEC_UTIL": "the agent does not read the decoder's utilization",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "the agent reads NVLink throughput as rates:"
    " gpuprobe_gpu_nvlink_tx_bytes_per_second, gpuprobe_gpu_nvlink_rx_bytes_per_second",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "the agent does not read vGPU licensing",
}
