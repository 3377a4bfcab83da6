"""Part: agent. The GPU-node agent: sensors -> batcher -> spool -> uplink (docs/agent.md, docs/architecture.md)."""
