"""The GPU-node agent: sensors -> batcher -> spool -> uplink (see DESIGN.md)."""
