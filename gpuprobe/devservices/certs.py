"""Part: devservices. A throw-away PKI for TLS and mutual-TLS tests (and the demo): a CA, a server and client
certificates.

Made by :mod:`gpuprobe.pki` (what ``gpuprobe certs`` uses), valid for a day. ``make_pki`` also makes a
second, unrelated CA with its own client certificate, to test that a certificate from the wrong CA
is refused. For a trial or a fleet, use ``gpuprobe certs`` instead (docs/setup.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuprobe.pki import Issued, issue, new_ca, write_pair

#: The names the development servers listen on.
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
DAYS = 1


@dataclass(frozen=True)
class CertPair:
    cert_path: Path
    key_path: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert_path.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key_path.read_bytes()


@dataclass(frozen=True)
class Pki:
    ca: CertPair
    server: CertPair  # for localhost / 127.0.0.1 / ::1
    client: CertPair  # signed by ca
    other_ca: CertPair
    other_client: CertPair  # signed by other_ca: must be refused


def _write(directory: Path, stem: str, issued: Issued) -> CertPair:
    pair = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    write_pair(issued, pair.cert_path, pair.key_path)
    return pair


def make_pki(directory: Path, client_name: str = "agent-1") -> Pki:
    """In ``directory``: ``ca``, ``server`` (for localhost, 127.0.0.1 and ::1), ``client`` (common name
    ``client_name``), and ``other-ca`` with ``other-client``, each a ``.crt`` (0644) and a ``.key``
    (0600, owned by the caller: a server started as root that drops to another user cannot read it)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = new_ca("gpuprobe test CA", DAYS)
    other = new_ca("unrelated CA", DAYS)
    return Pki(
        ca=_write(directory, "ca", ca),
        server=_write(directory, "server", issue(ca, "localhost", DAYS, server_names=LOCAL_NAMES)),
        client=_write(directory, "client", issue(ca, client_name, DAYS)),
        other_ca=_write(directory, "other-ca", other),
        other_client=_write(directory, "other-client", issue(other, client_name, DAYS)),
    )
