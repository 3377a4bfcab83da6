"""Part: core. gpuprobe: distributed GPU telemetry.

Sub-packages: ``gpuprobe.sim`` (simulated GPUs at the NVML interface), ``gpuprobe.agent``,
``gpuprobe.collector``, ``gpuprobe.trainer``; ``gpuprobe.v1`` is the generated wire contract.
"""

__version__ = "0.1.0"
