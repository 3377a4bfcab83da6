"""Part: nvml (ground floor). The one NVML boundary: the only package that imports ``pynvml``.

- :mod:`.errors`: NVML's return codes, and its errors translated once (:class:`~.errors.NvmlCallError`);
- :mod:`.sensor`: every field of the ``gpu`` measurement, the health reads, NVLink, GPM, MIG, the
  processes and the event set (the agent's hot path, and the control plane's GPU reads);
- :mod:`.device`: one GPU for the few calls outside the sampler, the power-limit actuator among them.

The agent, the control plane and the trainer use it; it imports nothing of theirs
(docs/architecture.md, "Allowed imports").
"""

# The SCHED_FIFO priority the native sampler's thread asks for (:mod:`.native`): the lowest, so every other
# real-time task comes first. A process gets it with CAP_SYS_NICE or with an RLIMIT_RTPRIO at least this
# high, which the installed agent unit gives without a capability (LimitRTPRIO=, gpuprobe.agent.install).
# Here, not in .native, so that the installer reads it without loading pynvml (a collector host has none).
REALTIME_PRIORITY = 1
