"""Part: influx. Where InfluxDB is and how to talk to it: one :class:`InfluxSettings` for the collector and the model.

The field names are the collector's (``--influx-db`` is :attr:`InfluxSettings.database`,
``--influx-rp`` is :attr:`InfluxSettings.retention_policy`); ``gpuprobe model`` uses the v1 fields
only. The request details that follow from the settings (authentication, write parameters, TLS
verification) are derived here once, for the synchronous client and the collector's async writer.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InfluxSettings:
    """The ``--influx-*`` options: every one of ``gpuprobe collector``'s, the v1 ones of ``gpuprobe model``."""

    url: str = "http://127.0.0.1:8086"
    api: str = "v1"  # "v1": /write (1.x, and 2.x/3.x compatibility); "v2": /api/v2/write via influxdb-client
    database: str = "gpuprobe"  # v1
    retention_policy: str = ""  # v1; empty: the database's default
    username: str = ""  # v1 basic auth
    password: str = ""
    token: str = ""  # v1: "Authorization: Token ..."; v2: required
    org: str = ""  # v2
    bucket: str = ""  # v2
    create_database: bool = False  # v1: CREATE DATABASE (and the retention policy) at start and on a 404
    retention: str = ""  # duration of a created retention policy, e.g. "90d"; empty: infinite
    ca_file: str = ""  # CA bundle for an https:// URL; empty: the system's
    timeout_s: float = 30.0  # of each connect, read and write of one request
    gzip_level: int = 1  # 0: no compression (v2: any level > 0 means gzip)

    @classmethod
    def from_option_values(cls, values: Mapping[str, Any], **more: Any) -> InfluxSettings:
        """From the ``--influx-*`` options every command that reads or writes InfluxDB declares (the v1
        ones: ``influx_url``, ``influx_db``, ``influx_rp``, ``influx_username``, ``influx_password``,
        ``influx_token``, ``influx_timeout``); ``more`` sets the fields only some commands have."""
        return cls(
            url=values["influx_url"],
            database=values["influx_db"],
            retention_policy=values["influx_rp"],
            username=values["influx_username"],
            password=values["influx_password"],
            token=values["influx_token"],
            timeout_s=values["influx_timeout"],
            **more,
        )

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    def auth_headers(self) -> dict[str, str]:
        """``Authorization``: the token when there is one (2.x and 3.x through the v1 API), else basic
        authentication with user name and password (1.x), else nothing."""
        if self.token:
            return {"Authorization": f"Token {self.token}"}
        if self.username or self.password:
            pair = f"{self.username}:{self.password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        return {}

    def write_params(self, database: str | None = None, retention_policy: str | None = None) -> dict[str, str]:
        """The query parameters of ``POST /write`` (precision ns), for this database or another one."""
        params = {"db": self.database if database is None else database, "precision": "ns"}
        rp = self.retention_policy if retention_policy is None else retention_policy
        if rp:
            params["rp"] = rp
        return params

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx verifies the server's certificate with: :attr:`ca_file`, else the system's CAs."""
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
