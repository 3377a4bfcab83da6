"""Part: dashboards. The Grafana dashboards and alert rules, generated from what gpuprobe stores
(``python -m gpuprobe.dashboards.grafana``; docs/dashboards.md). It reads the schema's names from
the ground floor and imports no other part; nothing but tests imports it."""
