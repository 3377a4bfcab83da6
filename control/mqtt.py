"""Part: control. Connecting to the MQTT broker: URL, user name and password, TLS, and clear errors.

``--broker mqtt://HOST[:PORT]`` (plain, port 1883) or ``mqtts://HOST[:PORT]`` (TLS, port 8883).
TLS verifies the broker's certificate against ``--mqtt-ca`` (or the system's roots) and presents a
client certificate with ``--mqtt-cert``/``--mqtt-key`` (Mosquitto's ``require_certificate``).
User name and password authenticate against Mosquitto's ``password_file``; prefer
``--mqtt-password-file`` (or ``GPUPROBE_MQTT_PASSWORD``) to a password on the command line.

Every client speaks MQTT 5 and sets the content type of what it publishes
(``application/x-protobuf; proto=gpuprobe.v1.<Message>``, docs/wire.md).
"""

from __future__ import annotations

import socket
import ssl
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuprobe.config import ConfigError, Option

DEFAULT_BROKER = "mqtt://127.0.0.1:1883"

MQTT_OPTIONS = [
    Option(
        "broker",
        "MQTT broker URL: mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS)",
        default=DEFAULT_BROKER,
        metavar="URL",
    ),
    Option("mqtt_username", "MQTT user name (Mosquitto password_file)", default="", metavar="NAME"),
    Option(
        "mqtt_password",
        "MQTT password (prefer --mqtt-password-file or the environment)",
        default="",
        metavar="PASSWORD",
    ),
    Option("mqtt_password_file", "file whose first line is the MQTT password", Path, metavar="FILE"),
    Option(
        "mqtt_ca",
        "CA certificate (PEM) that signed the broker's certificate; implies TLS",
        Path,
        metavar="FILE",
        default_text="system roots",
    ),
    Option("mqtt_cert", "client certificate (PEM) for TLS client authentication", Path, metavar="FILE"),
    Option("mqtt_key", "private key (PEM) of --mqtt-cert", Path, metavar="FILE"),
]


def content_type(message_name: str) -> str:
    return f"application/x-protobuf; proto=gpuprobe.v1.{message_name}"


@dataclass(frozen=True)
class BrokerSettings:
    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    @classmethod
    def from_values(cls, values: dict[str, Any], *, missing_files_ok: bool = False) -> BrokerSettings:
        """The checked broker settings; ``missing_files_ok`` (the installer's check) accepts a password,
        CA, certificate or key file that does not exist yet (one that exists is read and checked)."""
        url = values["broker"]
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ConfigError(f"--broker {url!r}: the scheme must be mqtt:// or mqtts://")
        if not parts.hostname:
            raise ConfigError(f"--broker {url!r} names no host")
        try:
            port_given = parts.port
        except ValueError:
            raise ConfigError(f"--broker {url!r} has a bad port") from None
        tls = parts.scheme in ("mqtts", "ssl") or values.get("mqtt_ca") is not None
        password: str | None = values.get("mqtt_password") or None
        password_file: Path | None = values.get("mqtt_password_file")
        if password_file is not None and missing_files_ok and not password_file.exists():
            password = ""  # put in place later: the user-name rule below still applies
        elif password_file is not None:
            try:
                text = password_file.read_text()
            except OSError as e:
                raise ConfigError(f"--mqtt-password-file {password_file}: {e.strerror or e}") from None
            password = text.splitlines()[0] if text.strip() else ""
        username = values.get("mqtt_username") or None
        if password is not None and username is None:
            raise ConfigError("an MQTT password needs a user name (--mqtt-username)")
        cert, key = values.get("mqtt_cert"), values.get("mqtt_key")
        if (cert is None) != (key is None):
            raise ConfigError("--mqtt-cert and --mqtt-key go together")
        for name in ("mqtt_ca", "mqtt_cert", "mqtt_key"):
            path = values.get(name)
            if path is not None and not Path(path).is_file() and not (missing_files_ok and not Path(path).exists()):
                raise ConfigError(f"--{name.replace('_', '-')} {path}: no such file")
        return cls(
            host=parts.hostname,
            port=port_given or (8883 if tls else 1883),
            tls=tls or cert is not None,
            username=username,
            password=password,
            ca_file=values.get("mqtt_ca"),
            cert_file=cert,
            key_file=key,
        )

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None and self.key_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


def make_client(
    settings: BrokerSettings,
    *,
    identifier: str | None = None,
    will: Any = None,
    keepalive: int = 30,
    timeout_s: float = 10.0,
) -> Any:
    """An ``aiomqtt.Client`` (MQTT 5) for ``settings``; enter it with ``async with`` to connect."""
    import aiomqtt

    return aiomqtt.Client(
        settings.host,
        settings.port,
        username=settings.username,
        password=settings.password,
        identifier=identifier or f"gpuprobe-{uuid.uuid4().hex[:12]}",
        protocol=aiomqtt.ProtocolVersion.V5,
        will=will,
        keepalive=keepalive,
        timeout=timeout_s,
        tls_context=settings.tls_context(),
    )


def publish_properties(message_name: str, expiry_s: int | None = None) -> Any:
    """MQTT 5 PUBLISH properties: the content type, and a message expiry where given."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ContentType = content_type(message_name)
    if expiry_s is not None:
        props.MessageExpiryInterval = max(1, int(expiry_s))
    return props


def will_properties(message_name: str) -> Any:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.WILLMESSAGE)  # type: ignore[no-untyped-call]
    props.ContentType = content_type(message_name)
    return props


# CONNACK reason codes that mean "your credentials are wrong or not allowed" (MQTT 3.1.1 and 5).
_AUTH_CODES = {
    4: "bad user name or password",
    5: "not authorized",
    134: "bad user name or password",
    135: "not authorized",
}


def is_auth_error(error: BaseException) -> bool:
    rc = getattr(error, "rc", None)
    value = getattr(rc, "value", rc)
    return isinstance(value, int) and value in _AUTH_CODES


def describe_error(error: BaseException, settings: BrokerSettings) -> str:
    """One sentence for an operator: what failed and what to check."""
    who = f" as {settings.username!r}" if settings.username else " without a user name"
    if is_auth_error(error):
        rc = getattr(error, "rc", None)
        reason = _AUTH_CODES[getattr(rc, "value", rc)]  # type: ignore[index]
        hint = (
            "check --mqtt-username and --mqtt-password(-file)"
            if settings.username
            else "the broker needs a user name and password"
        )
        return f"the MQTT broker {settings.url} refused the connection{who}: {reason} ({hint})"
    text = str(error) or type(error).__name__
    causes = _causes(error)
    if any(isinstance(e, ConnectionRefusedError) for e in causes) or "Connection refused" in text:
        # the cause is that nothing listens there: the user name (or its absence) is beside the point
        return (
            f"nothing listens at the MQTT broker {settings.url} (connection refused): start the broker, or point"
            " --broker at it (mqtt://HOST:1883, or mqtts://HOST:8883 for TLS)"
        )
    if any(isinstance(e, socket.gaierror) for e in causes) or any(m in text for m in _DNS_FAILURES):
        return f"cannot resolve the MQTT broker's host name {settings.host} (DNS: {text}): check --broker"
    if isinstance(error, ssl.SSLError) or "CERTIFICATE" in text.upper() or "SSL" in text.upper():
        return f"TLS with the MQTT broker {settings.url} failed: {text} (check --mqtt-ca, --mqtt-cert, --mqtt-key)"
    if "timed out" in text.lower() and not settings.tls:
        return (
            f"the MQTT broker {settings.url} did not answer ({text}): if that port expects TLS (8883 usually"
            " does), use mqtts:// and --mqtt-ca"
        )
    return f"cannot talk to the MQTT broker {settings.url}{who}: {text}"


_DNS_FAILURES = ("Name or service not known", "Temporary failure in name resolution", "nodename nor servname")


def _causes(error: BaseException) -> list[BaseException]:
    """The error and the exceptions it was raised from (aiomqtt wraps the socket's error)."""
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
