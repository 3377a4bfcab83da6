"""Part: control. Operator keys: Ed25519 key pairs that sign probe commands, and the agents' trust list.

Files (PEM, as ``openssl pkey`` reads them):

- ``NAME.key``: the private key, PKCS#8, mode 0600. It stays with the operator (or in a secret store);
  ``gpuprobe probe start --key NAME.key`` signs with it.
- ``NAME.pub``: the public key, SubjectPublicKeyInfo. Agents trust it with ``--trusted-keys``
  (a file, or a folder whose ``*.pub`` files are all trusted).

The key id (``SignedCommand.key_id``) is the lowercase hex of the first 8 bytes of the SHA-256 of
the raw 32-byte public key; ``gpuprobe probe keygen`` prints it and agents log it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpuprobe.errors import ConfigError


class KeyFileError(ConfigError):
    """A key file that is missing, unreadable or not an Ed25519 key."""


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).digest()[:8].hex()


@dataclass(frozen=True)
class KeyPaths:
    private: Path
    public: Path
    key_id: str


def generate(out_dir: Path, name: str = "operator", force: bool = False) -> KeyPaths:
    """Write a new key pair ``out_dir/NAME.key`` (0600) and ``NAME.pub``."""
    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"key name {name!r} must be a plain file name")
    out_dir.mkdir(parents=True, exist_ok=True)
    private_path, public_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    if not force:
        for path in (private_path, public_path):
            if path.exists():
                raise KeyFileError(
                    f"{path} exists; use --force to replace it (agents that trust the old key will refuse)"
                )
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    tmp = private_path.with_suffix(".key.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    tmp.replace(private_path)
    public_path.write_bytes(public_pem)
    return KeyPaths(private_path, public_path, key_id(key.public_key()))


def load_private(path: Path, password: bytes | None = None) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KeyFileError(f"cannot read the signing key {path}: {e.strerror or e}") from None
    try:
        key = serialization.load_pem_private_key(data, password=password)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path} is not a readable PEM private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise KeyFileError(f"cannot read the public key {path}: {e.strerror or e}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"{path} is not a readable PEM public key: {e}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def load_trusted(paths: Iterable[Path]) -> dict[str, Ed25519PublicKey]:
    """The trust list: key id -> public key, from files and folders of ``*.pub`` files."""
    trusted: dict[str, Ed25519PublicKey] = {}
    for path in paths:
        files = sorted(path.glob("*.pub")) if path.is_dir() else [path]
        if path.is_dir() and not files:
            raise KeyFileError(f"{path} holds no *.pub files")
        for file in files:
            key = load_public(file)
            trusted[key_id(key)] = key
    return trusted
