"""Part: collector. The central collector: auth -> validate -> encode (line protocol) -> WAL -> ack; WAL -> sink ->
InfluxDB.

Modules, in the order data flows through them (docs/architecture.md, docs/operations.md, docs/schema.md):

- :mod:`.server` — ``TelemetryService.Stream`` on ``grpc.aio``; :mod:`.auth` checks credentials first
- :mod:`gpuprobe.wire.validate` — what is accepted, status codes and per-batch rejections (on the
  ground floor: the agent checks its own identity with the same rules)
- :mod:`.encode` — exact InfluxDB line protocol (the hot path)
- :mod:`.wal` — the SQLite write-ahead log; a batch is acked once committed there
- :mod:`.sink` — drains the WAL into InfluxDB (v1 ``/write`` or v2 via ``influxdb-client``)
- :mod:`.metrics`, :mod:`.runner` (processes, sd_notify), :mod:`.cli`, :mod:`.install`, :mod:`.settings`

The synthetic agents of the tests and benchmarks are :mod:`gpuprobe.app.loadgen` (top floor: they use the
agent's uplink and resolution policy, which the collector may not import).
"""
