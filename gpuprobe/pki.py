"""Part: core. X.509 certificates for gpuprobe's TLS: a CA, server certificates and client certificates.

The one place certificates are made (with ``cryptography``): ``gpuprobe certs`` writes a set for a
trial or a small fleet, and the development servers' throw-away PKI
(:func:`gpuprobe.devservices.certs.make_pki`) is built from the same pieces. Keys are ECDSA P-256,
which gRPC, Mosquitto (OpenSSL) and InfluxDB (Go) all accept.

A server certificate names every DNS name and IP address clients connect to as subject alternative
names (clients check those, not the common name). A client certificate's common name is the
node's name: the collector's ``--tls-bind-agent-id`` compares it with the agent id, and Mosquitto's
``use_identity_as_username`` takes it as the MQTT user name.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: A certificate's start is back-dated this much, so that a peer whose clock is a little behind
#: accepts a certificate made a moment ago.
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, in memory."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder, days: float) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return builder.not_valid_before(now - BACKDATE).not_valid_after(now + dt.timedelta(days=days))


def new_ca(common_name: str, days: float) -> Issued:
    """A self-signed CA that may sign certificates (and nothing else)."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return Issued(_validity(builder, days).sign(key, hashes.SHA256()), key)


def subject_alternative_name(name: str) -> x509.GeneralName:
    """An IP address entry for an address, a DNS entry for anything else."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue(ca: Issued, common_name: str, days: float, *, server_names: Sequence[str] = ()) -> Issued:
    """A leaf certificate signed by ``ca``: a server certificate for ``server_names`` (DNS names and IP
    addresses) when any are given, otherwise a client certificate whose common name is ``common_name``."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if server_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([subject_alternative_name(n) for n in server_names]), critical=False
        )
    return Issued(_validity(builder, days).sign(ca.key, hashes.SHA256()), key)


def load(cert_path: Path, key_path: Path) -> Issued:
    """A certificate and its key from PEM files (a CA made earlier, to sign more certificates)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise ValueError(f"{key_path} is not the ECDSA key of {cert_path}")
    return Issued(cert, key)


def write_private(path: Path, data: bytes) -> None:
    """Write a secret (a private key, a token) created with mode 0600, so it is never readable by
    others, not even for a moment; replaces ``path`` atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def write_public(path: Path, data: bytes) -> None:
    """Write a certificate, readable by everyone (0644)."""
    path.write_bytes(data)
    path.chmod(0o644)


def write_pair(issued: Issued, cert_path: Path, key_path: Path) -> None:
    write_public(cert_path, issued.cert_pem)
    write_private(key_path, issued.key_pem)
