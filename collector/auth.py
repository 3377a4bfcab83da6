"""Part: collector. Who may send: mutual TLS and/or per-agent bearer tokens, checked when a stream starts.

* **Mutual TLS** (``--tls-client-ca``): the TLS handshake itself refuses a client without a
  certificate from that CA, before any RPC exists; such a client sees ``UNAVAILABLE`` with a
  handshake error (gRPC cannot send a status before the handshake). With
  ``--tls-bind-agent-id`` the certificate's common name (or a DNS subject alternative name) must
  also equal the ``agent_id`` of the Hello, or the stream ends with ``PERMISSION_DENIED``.
* **Tokens** (``--tokens-file``): the agent sends ``authorization: Bearer <token>`` metadata. A
  missing or unknown token ends the stream with ``UNAUTHENTICATED`` before anything is read; a
  token that belongs to another agent than the Hello names ends it with ``PERMISSION_DENIED``.
  Tokens are compared with :func:`hmac.compare_digest` against every entry (no early exit).

The tokens file has one ``AGENT_ID TOKEN`` pair per line (``#`` starts a comment); it is read
again when it changes (its modification time or size), so tokens can be added or revoked without a
restart. It should be readable by the collector only (a warning is logged otherwise).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpuprobe.errors import ConfigError
from gpuprobe.wire.validate import StreamError

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16


class AuthConfigError(ConfigError):
    """The tokens file or the TLS files cannot be used (the message says why)."""


def parse_tokens(text: str, source: str) -> dict[str, str]:
    """``agent id -> token`` from the tokens file format."""
    tokens: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise AuthConfigError(f"{source}:{number}: expected 'AGENT_ID TOKEN', got {len(parts)} words")
        agent_id, token = parts
        if agent_id in tokens:
            raise AuthConfigError(f"{source}:{number}: agent {agent_id!r} is listed twice")
        if len(token) < MIN_TOKEN_CHARS:
            raise AuthConfigError(
                f"{source}:{number}: the token of {agent_id!r} is shorter than {MIN_TOKEN_CHARS} characters"
            )
        tokens[agent_id] = token
    return tokens


def format_tokens(tokens: Mapping[str, str]) -> str:
    """The tokens file for ``agent id -> token`` (what :func:`parse_tokens` reads back)."""
    text = "".join(f"{agent_id} {token}\n" for agent_id, token in tokens.items())
    parse_tokens(text, "the tokens to write")  # the same checks as the collector's: refused here, not at its start
    return "# gpuprobe collector --tokens-file: one 'AGENT_ID TOKEN' per line\n" + text


def new_token() -> str:
    """A fresh bearer token: 48 hex characters (192 random bits)."""
    return secrets.token_hex(24)


class TokenStore:
    """The tokens file, re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature: tuple[int, int] | None = None
        self._tokens: list[tuple[bytes, str]] = []
        self._load(initial=True)

    def _load(self, *, initial: bool) -> None:
        try:
            info = self.path.stat()
            text = self.path.read_text()
            tokens = parse_tokens(text, str(self.path))
        except (OSError, UnicodeDecodeError, AuthConfigError) as exc:
            if initial:
                raise AuthConfigError(f"cannot use the tokens file: {exc}") from exc
            log.error("tokens file %s could not be re-read, keeping the previous tokens: %s", self.path, exc)
            return
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("tokens file %s is readable by group or others (mode %o)", self.path, info.st_mode & 0o777)
        self._tokens = [(token.encode(), agent) for agent, token in tokens.items()]
        self._signature = (info.st_mtime_ns, info.st_size)
        if not initial:
            log.info("tokens file %s re-read: %d agents", self.path, len(tokens))

    def _reload_if_changed(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError:
            return
        if (info.st_mtime_ns, info.st_size) != self._signature:
            with self._lock:
                if (info.st_mtime_ns, info.st_size) != self._signature:
                    self._load(initial=False)

    def agent_for(self, token: str) -> str | None:
        """The agent this token belongs to, or None. Constant time in the token's content."""
        self._reload_if_changed()
        presented = token.encode()
        found: str | None = None
        for expected, agent in self._tokens:
            if hmac.compare_digest(presented, expected) and found is None:
                found = agent
        return found

    def __len__(self) -> int:
        return len(self._tokens)


@dataclass(frozen=True)
class Principal:
    """What the credentials of one stream prove."""

    token_agent: str | None = None
    certificate_names: tuple[str, ...] = ()


class Authenticator:
    def __init__(self, tokens: TokenStore | None, *, mtls: bool, bind_certificate: bool) -> None:
        self.tokens = tokens
        self.mtls = mtls
        self.bind_certificate = bind_certificate

    def authenticate(
        self, metadata: Iterable[tuple[str, str | bytes]], auth_context: dict[str, list[bytes]]
    ) -> Principal:
        """Checks the stream's credentials; :class:`StreamError` ``UNAUTHENTICATED`` when they fail."""
        names: tuple[str, ...] = ()
        if self.mtls:
            raw = list(auth_context.get("x509_common_name", [])) + list(
                auth_context.get("x509_subject_alternative_name", [])
            )
            names = tuple(n.decode(errors="replace") if isinstance(n, bytes) else str(n) for n in raw)
            if not names and not auth_context.get("x509_pem_cert"):
                raise StreamError(grpc.StatusCode.UNAUTHENTICATED, "no verified client certificate")
        agent: str | None = None
        if self.tokens is not None:
            header = None
            for key, value in metadata:
                if key.lower() == "authorization":
                    header = value.decode(errors="replace") if isinstance(value, bytes) else value
                    break
            if header is None:
                raise StreamError(
                    grpc.StatusCode.UNAUTHENTICATED, "missing bearer token (metadata 'authorization: Bearer <token>')"
                )
            scheme, _, token = header.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise StreamError(grpc.StatusCode.UNAUTHENTICATED, "the authorization metadata is not 'Bearer <token>'")
            agent = self.tokens.agent_for(token.strip())
            if agent is None:
                raise StreamError(grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token")
        return Principal(token_agent=agent, certificate_names=names)

    def authorize(self, principal: Principal, agent_id: str) -> None:
        """Whether these credentials may speak for ``agent_id``; :class:`StreamError` ``PERMISSION_DENIED``."""
        if principal.token_agent is not None and principal.token_agent != agent_id:
            raise StreamError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the bearer token belongs to agent {principal.token_agent!r}, not {agent_id!r}",
            )
        if self.mtls and self.bind_certificate and agent_id not in principal.certificate_names:
            raise StreamError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the client certificate ({', '.join(principal.certificate_names) or 'no name'}) "
                f"is not for agent {agent_id!r}",
            )


def server_credentials(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> grpc.ServerCredentials:
    """TLS credentials; with ``client_ca_file`` the handshake requires a client certificate from it."""
    try:
        pair = (key_file.read_bytes(), cert_file.read_bytes())
        client_ca = client_ca_file.read_bytes() if client_ca_file is not None else None
    except OSError as exc:
        raise AuthConfigError(f"cannot read the TLS files: {exc}") from exc
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)
