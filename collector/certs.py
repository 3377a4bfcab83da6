"""Part: collector. ``gpuprobe certs``: the certificates and tokens a TLS set-up needs, in one folder.

A CA; one server certificate for the names clients connect to, used by the collector (and by
Mosquitto and InfluxDB where they run on the same host); one client certificate and one bearer token
per node; and the collector's tokens file (:func:`gpuprobe.collector.auth.format_tokens`). Every
private key and token is written 0600 and owned by whoever ran the command, which is what a
service started by that user reads; a service that runs as its own user (``mosquitto``,
``influxdb``, ``gpuprobe``) gets its own copy: ``install -o USER -m 0600 SRC DEST``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprobe.config import ConfigError

#: What a node name may be: it is a file name here, the agent id (``--host``) the tokens file and a
#: client certificate name, and the MQTT user name the shipped ACL matches.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True)
class CertFile:
    path: Path
    private: bool
    purpose: str


@dataclass(frozen=True)
class Layout:
    """The files of one ``gpuprobe certs --out DIR`` (their names are the documented interface)."""

    out: Path
    nodes: tuple[str, ...]

    @property
    def ca_cert(self) -> Path:
        return self.out / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.out / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.out / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.out / "server.key"

    @property
    def tokens(self) -> Path:
        return self.out / "tokens"

    def node_cert(self, node: str) -> Path:
        return self.out / "nodes" / f"{node}.crt"

    def node_key(self, node: str) -> Path:
        return self.out / "nodes" / f"{node}.key"

    def node_token(self, node: str) -> Path:
        return self.out / "nodes" / f"{node}.token"

    def files(self) -> Iterator[CertFile]:
        yield CertFile(
            self.ca_cert,
            False,
            "the CA: agents --tls-ca, collector --tls-client-ca, Mosquitto cafile, operators --mqtt-ca",
        )
        yield CertFile(self.ca_key, True, "signs the certificates; no service reads it: keep it offline")
        yield CertFile(
            self.server_cert,
            False,
            "for every --server-name: collector --tls-cert, Mosquitto certfile, InfluxDB https-certificate",
        )
        yield CertFile(
            self.server_key, True, "its key: collector --tls-key, Mosquitto keyfile, InfluxDB https-private-key"
        )
        yield CertFile(self.tokens, True, "the collector's --tokens-file, one 'AGENT_ID TOKEN' line per node")
        for node in self.nodes:
            yield CertFile(
                self.node_cert(node),
                False,
                f"agent --tls-cert (or --mqtt-cert) on {node}; its name is {node}, for --tls-bind-agent-id",
            )
            yield CertFile(self.node_key(node), True, f"agent --tls-key (or --mqtt-key) on {node}")
            yield CertFile(self.node_token(node), True, f"agent --token-file on {node}")


def file_table(files: list[CertFile], indent: str = "") -> str:
    """One line per file: its path, its mode and what it is for (the help and the command's output)."""
    width = max(len(str(f.path)) for f in files)
    return "\n".join(f"{indent}{f.path!s:<{width}}  {'0600' if f.private else '0644'}  {f.purpose}" for f in files)


def help_table() -> str:
    """The files of ``--out DIR`` for ``--help``, one node standing for each."""
    return file_table(list(Layout(Path("."), ("NODE",)).files()), indent="  ")


def check_node_names(nodes: list[str]) -> tuple[str, ...]:
    for node in nodes:
        if not NODE_NAME.fullmatch(node):
            raise ConfigError(
                f"--node {node!r}: a node name is 1 to 63 letters, digits, '.', '-' or '_' and starts with a letter"
                " or digit (it is the agent's --host and a file name)"
            )
    duplicates = sorted({n for n in nodes if nodes.count(n) > 1})
    if duplicates:
        raise ConfigError(f"--node {duplicates[0]} is given twice")
    return tuple(nodes)


def write_all(layout: Layout, server_names: list[str], days: float, force: bool) -> list[CertFile]:
    """Make and write every file of ``layout``; nothing is written when one exists and not ``force``."""
    from gpuprobe import pki
    from gpuprobe.collector.auth import format_tokens, new_token

    files = list(layout.files())
    if not force:
        _refuse_existing([f.path for f in files])
    (layout.out / "nodes").mkdir(parents=True, exist_ok=True)
    ca = pki.new_ca("gpuprobe CA", days)
    pki.write_pair(ca, layout.ca_cert, layout.ca_key)
    server = pki.issue(ca, server_names[0], days, server_names=server_names)
    pki.write_pair(server, layout.server_cert, layout.server_key)
    tokens = {node: new_token() for node in layout.nodes}
    for node in layout.nodes:
        pki.write_pair(pki.issue(ca, node, days), layout.node_cert(node), layout.node_key(node))
        pki.write_private(layout.node_token(node), (tokens[node] + "\n").encode())
    pki.write_private(layout.tokens, format_tokens(tokens).encode())
    return files


def add_nodes(layout: Layout, days: float) -> list[CertFile]:
    """Sign ``layout.nodes`` with the CA already in ``layout.out`` and add their tokens to its tokens
    file (the collector reads it again when it changes: no restart). Nodes that have files or a token
    already are refused."""
    from gpuprobe import pki
    from gpuprobe.collector.auth import AuthConfigError, format_tokens, new_token, parse_tokens

    if not layout.nodes:
        raise ConfigError(f"{layout.ca_cert} exists: give --node NAME to add nodes, or --force to start anew")
    node_files = [f for f in layout.files() if f.path.parent == layout.out / "nodes"]
    _refuse_existing(
        [f.path for f in node_files],
        "the node has its files already: choose another name, or delete its files and its line in tokens first",
    )
    try:
        ca = pki.load(layout.ca_cert, layout.ca_key)
        tokens = parse_tokens(layout.tokens.read_text(), str(layout.tokens)) if layout.tokens.exists() else {}
    except (ValueError, AuthConfigError) as e:
        raise ConfigError(str(e)) from None
    listed = [node for node in layout.nodes if node in tokens]
    if listed:
        raise ConfigError(f"{layout.tokens} already has a token for {listed[0]}")
    (layout.out / "nodes").mkdir(parents=True, exist_ok=True)
    for node in layout.nodes:
        tokens[node] = new_token()
        pki.write_pair(pki.issue(ca, node, days), layout.node_cert(node), layout.node_key(node))
        pki.write_private(layout.node_token(node), (tokens[node] + "\n").encode())
    pki.write_private(layout.tokens, format_tokens(tokens).encode())
    return [*node_files, *(f for f in layout.files() if f.path == layout.tokens)]


def _refuse_existing(
    paths: list[Path], hint: str = "use --force to replace them (the certificates and tokens in use stop working)"
) -> None:
    existing = [p for p in paths if p.exists()]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise ConfigError(f"{existing[0]} exists{more}; {hint}")


def run(values: dict[str, Any]) -> int:
    def fail(message: str) -> int:
        print(f"gpuprobe certs: error: {message}", file=sys.stderr)
        return 2

    if values["out"] is None:
        return fail("--out DIR is required")
    server_names: list[str] = values["server_name"] or []
    if values["days"] <= 0:
        return fail("--days must be positive")
    try:
        layout = Layout(Path(values["out"]), check_node_names(values["node"] or []))
        # a CA already there and no server names: more nodes for the same CA and tokens file
        adding = not server_names and not values["force"] and layout.ca_cert.exists() and layout.ca_key.exists()
        if not adding and not server_names:
            return fail("give the names clients connect to: --server-name NAME (DNS name or IP address, repeatable)")
        if adding:
            files = add_nodes(layout, values["days"])
        else:
            files = write_all(layout, server_names, values["days"], values["force"])
    except ConfigError as e:
        return fail(str(e))
    except OSError as e:
        return fail(f"cannot write {e.filename}: {e.strerror}")
    print(file_table(files))
    if adding:
        print(
            f"\nsigned by {layout.ca_cert}; valid {values['days']:g} days. Copy {layout.tokens} over the collector's"
            " --tokens-file: it is read again when it changes, no restart."
        )
    else:
        print(
            f"\nserver certificate for: {', '.join(server_names)}; valid {values['days']:g} days."
            "\nThe 0600 files belong to you: a service that runs as its own user needs its own copy, e.g."
            f"\n  install -o mosquitto -m 0600 {layout.server_key} /etc/mosquitto/gpuprobe/server.key"
        )
    return 0
