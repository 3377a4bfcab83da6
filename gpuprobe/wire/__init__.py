"""Part: wire (ground floor). What both ends of the telemetry stream agree on, beyond the protobuf types.

- :mod:`.validate`: the rules a ``Hello`` and a batch must meet (identity labels, strings,
  timestamps, aggregates); the collector applies them to what arrives, the agent to its own identity
  before it connects;
- :mod:`.vocabulary`: a probe's phases, statuses and event kinds, by name and as protobuf values.

The agent, the collector and the control plane import it; it imports none of them
(docs/architecture.md, "Allowed imports").
"""
