"""Part: devservices. A real Prometheus 2.x server (Debian's ``prometheus``) on a free loopback port, scraping given
targets.

Its data (``--storage.tsdb.path``) and generated config are under ``base_dir``; queries go through
its HTTP API (``/api/v1/query``, ``/api/v1/label/NAME/values``) with the standard library.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any, ClassVar

from gpuprobe.devservices._process import ServerProcess
from gpuprobe.devservices.errors import DevServiceError
from gpuprobe.devservices.ports import LOOPBACK, free_port


class PrometheusServer(ServerProcess):
    """``prometheus --config.file CONF`` scraping ``targets`` (``HOST:PORT``, path ``/metrics``) every
    ``scrape_interval_s`` in one job named ``job``."""

    display_name: ClassVar[str] = "prometheus"
    package: ClassVar[str] = "prometheus"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        targets: Sequence[str],
        *,
        job: str = "gpuprobe",
        scrape_interval_s: float = 1.0,
        port: int | None = None,
        binary: str | os.PathLike[str] = "prometheus",
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(
            base_dir,
            binary=binary,
            log_name="prometheus.log",
            auto_ports=port is None,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self._port = free_port() if port is None else port
        self.targets = list(targets)
        self.job = job
        self.scrape_interval_s = scrape_interval_s

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self._port}"

    # --- ServerProcess -----------------------------------------------------------------------------

    def _choose_new_ports(self) -> None:
        self._port = free_port()

    def _prepare(self) -> list[str]:
        interval = f"{round(self.scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": self.job, "static_configs": [{"targets": self.targets}]}],
        }
        path = self.base_dir / "prometheus.yml"
        path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
        (self.base_dir / "data").mkdir(exist_ok=True)
        return [
            f"--config.file={path}",
            f"--storage.tsdb.path={self.base_dir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self._port}",
            "--log.level=warn",
        ]

    def _is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=0.5) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    # --- the HTTP API ------------------------------------------------------------------------------

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise DevServiceError(f"prometheus {path} {params}: HTTP {e.code}: {e.read().decode()[:500]}") from e
        if body.get("status") != "success":
            raise DevServiceError(f"prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, promql: str, time_s: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...labels}, "value": [t, "v"]}, ...]``."""
        params = {"query": promql}
        if time_s is not None:
            params["time"] = repr(time_s)
        data = self._get("/api/v1/query", params)
        if data["resultType"] != "vector":
            raise DevServiceError(f"prometheus {promql!r}: a {data['resultType']}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range_vector(self, promql: str, time_s: float | None = None) -> list[dict[str, Any]]:
        """A range-vector selector's samples: ``[{"metric": {...}, "values": [[t, "v"], ...]}, ...]``."""
        params = {"query": promql}
        if time_s is not None:
            params["time"] = repr(time_s)
        data = self._get("/api/v1/query", params)
        if data["resultType"] != "matrix":
            raise DevServiceError(f"prometheus {promql!r}: a {data['resultType']}, not a matrix")
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """Grafana's ``label_values(MATCH, LABEL)``."""
        values: list[str] = self._get(f"/api/v1/label/{label}/values", {"match[]": match})
        return values

    def targets_up(self) -> dict[str, str]:
        """Scrape target -> its health (``up``, ``down``, ``unknown``)."""
        data = self._get("/api/v1/targets", {})
        return {t["labels"]["instance"]: t["health"] for t in data["activeTargets"]}
