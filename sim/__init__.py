"""Part: sim. Simulated GPUs at the NVML C interface (libnvidia-ml.so.1)."""
