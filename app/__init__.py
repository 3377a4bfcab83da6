"""Part: top. The top floor: the ``gpuprobe`` command (``cli``, run as ``python -m gpuprobe.app``), ``gpuprobe demo``
(``demo``) and the collector's synthetic agents (``loadgen``). It wires the parts together and may
import every one; nothing imports it (docs/architecture.md, "Allowed imports")."""
