"""Part: trainer. The bundled PyTorch workloads, run in phases (docs/trainer.md)."""
