"""Part: kubelet. The kubelet's pod-resources API v1, generated from proto/gpuprobe/kubelet/v1 (vendored; `make
proto`)."""
