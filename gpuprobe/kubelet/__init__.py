"""Part: kubelet. The kubelet's APIs that the agent reads (generated from proto/gpuprobe/kubelet; not gpuprobe's wire
contract)."""
