"""Part: v1. Generated wire contract (gpuprobe.v1) from proto/gpuprobe/v1; regenerate with `make proto`."""
