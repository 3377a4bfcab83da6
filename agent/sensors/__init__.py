"""Part: agent. The agent's sensors: GPU (NVML), host (psutil, hwmon), acoustics (microphone and proxy)."""
