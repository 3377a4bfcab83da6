"""Part: influx. Everything gpuprobe says to InfluxDB, in one place: the collector's sink, ``gpuprobe model``, the
dashboards' tests and the development servers all use it.

- :mod:`.lineprotocol`: writing points exactly (escaping, field values);
- :mod:`.storable`: what line protocol can store (tag values, int64), standard library only;
- :mod:`.influxql`: quoting for InfluxQL, reading ``/query`` answers, :class:`~.influxql.InfluxError`;
- :mod:`.answers`: what a write answer means (:func:`~.answers.classify`) and InfluxDB's error text;
- :mod:`.settings`: :class:`~.settings.InfluxSettings`, where InfluxDB is and how to authenticate;
- :mod:`.client`: a synchronous v1 client (query, write, ping) on httpx.
- :mod:`.retention`: retention policies, 10 s and 1 min rollups and their continuous queries
  (``gpuprobe collector --init-db``), and the ``rp_config`` the dashboards pick a policy from.
- :mod:`.eventreads`: reading the event measurements from the ``events`` policy and the default one.

The writer and the client need orjson and httpx, which the ``collector`` and ``model`` extras carry;
a GPU node imports only :mod:`.storable` (its agent checks its identity labels as the collector
does). Nothing is imported here, so each user loads only the submodules it needs.
"""
