"""The bundled PyTorch workloads, run in phases (see DESIGN.md)."""
