"""Part: control. Signing and checking probe commands (docs/wire.md, "Commands"; docs/control.md).

The operator serializes a ``Command`` once and signs exactly those bytes with Ed25519; the agent
verifies the signature over the bytes as received, *before* parsing them, and never re-serializes.
:func:`verify` and :func:`check_times` are the agent's steps 1-3; each failure is a :class:`Refusal`
carrying the contract's ``RefusalReason`` and a message for the operator.
"""

from __future__ import annotations

import time
import uuid

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from google.protobuf.message import DecodeError

from gpuprobe.control.keys import key_id
from gpuprobe.control.settings import DEFAULT_CLOCK_SKEW_S, DEFAULT_MAX_LIFETIME_S
from gpuprobe.errors import ProtocolError
from gpuprobe.v1 import control_pb2

DEFAULT_LIFETIME_S = 300.0

REASON_NAMES = {
    value: name.removeprefix("REFUSAL_REASON_").lower()
    for name, value in control_pb2.RefusalReason.items()
    if value != control_pb2.REFUSAL_REASON_UNSPECIFIED
}


class Refusal(ProtocolError):
    """Why an agent refuses a command; ``command_id`` is known once the payload parsed."""

    def __init__(self, reason: int, message: str, command_id: str = "", probe_id: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.command_id = command_id
        self.probe_id = probe_id

    @property
    def reason_name(self) -> str:
        return REASON_NAMES.get(self.reason, str(self.reason))


def new_command(
    *,
    issuer: str,
    lifetime_s: float = DEFAULT_LIFETIME_S,
    now_ns: int | None = None,
    command_id: str | None = None,
) -> control_pb2.Command:
    """A command with a fresh UUID, issued now, expiring after ``lifetime_s``; set its action after."""
    now = time.time_ns() if now_ns is None else now_ns
    return control_pb2.Command(
        command_id=command_id or str(uuid.uuid4()),
        issued_at_unix_ns=now,
        expires_at_unix_ns=now + int(lifetime_s * 1e9),
        issuer=issuer,
    )


def sign(command: control_pb2.Command, private_key: Ed25519PrivateKey) -> control_pb2.SignedCommand:
    payload = command.SerializeToString(deterministic=True)
    return control_pb2.SignedCommand(
        payload=payload, signature=private_key.sign(payload), key_id=key_id(private_key.public_key())
    )


def _peek_ids(payload: bytes) -> tuple[str, str]:
    """The command and probe ids of an *unverified* payload, for the reply (empty if it does not parse)."""
    try:
        command = control_pb2.Command.FromString(payload)
    except DecodeError:
        return "", ""
    return command.command_id, _probe_id(command)


def _probe_id(command: control_pb2.Command) -> str:
    action = command.WhichOneof("action")
    if action == "probe_start":
        return command.probe_start.probe_id
    if action == "probe_cancel":
        return command.probe_cancel.probe_id
    return ""


def verify(signed: control_pb2.SignedCommand, trusted: dict[str, Ed25519PublicKey]) -> control_pb2.Command:
    """Steps 1-2: a trusted key, a valid signature over the payload as received, then a parse."""
    if not signed.signature and not signed.key_id:
        command_id, probe_id = _peek_ids(signed.payload)
        raise Refusal(control_pb2.REFUSAL_REASON_BAD_SIGNATURE, "the command is not signed", command_id, probe_id)
    public_key = trusted.get(signed.key_id)
    if public_key is None:
        command_id, probe_id = _peek_ids(signed.payload)
        raise Refusal(
            control_pb2.REFUSAL_REASON_UNKNOWN_KEY,
            f"key {signed.key_id or '(none)'} is not in this agent's trust list",
            command_id,
            probe_id,
        )
    try:
        public_key.verify(signed.signature, signed.payload)
    except InvalidSignature:
        command_id, probe_id = _peek_ids(signed.payload)
        raise Refusal(
            control_pb2.REFUSAL_REASON_BAD_SIGNATURE,
            f"the signature does not verify with key {signed.key_id}",
            command_id,
            probe_id,
        ) from None
    try:
        command = control_pb2.Command.FromString(signed.payload)
    except DecodeError as e:
        raise Refusal(control_pb2.REFUSAL_REASON_MALFORMED, f"the signed payload is not a Command: {e}") from None
    return command


def check_times(
    command: control_pb2.Command,
    now_ns: int,
    max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S,
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
) -> None:
    """Steps 2-3: complete (id, action, a sane lifetime), not expired, not issued in the future."""
    command_id, probe_id = command.command_id, _probe_id(command)

    def refuse(reason: int, message: str) -> Refusal:
        return Refusal(reason, message, command_id, probe_id)

    if not command_id:
        raise refuse(control_pb2.REFUSAL_REASON_MALFORMED, "the command has no command_id")
    if command.WhichOneof("action") is None:
        raise refuse(control_pb2.REFUSAL_REASON_MALFORMED, "the command has no action")
    lifetime_s = (command.expires_at_unix_ns - command.issued_at_unix_ns) / 1e9
    if lifetime_s <= 0:
        raise refuse(control_pb2.REFUSAL_REASON_MALFORMED, "the command expires before it was issued")
    if lifetime_s > max_lifetime_s:
        raise refuse(
            control_pb2.REFUSAL_REASON_MALFORMED,
            f"the command's lifetime of {lifetime_s:.0f} s is over this agent's maximum of {max_lifetime_s:.0f} s",
        )
    if now_ns >= command.expires_at_unix_ns:
        ago = (now_ns - command.expires_at_unix_ns) / 1e9
        raise refuse(control_pb2.REFUSAL_REASON_EXPIRED, f"the command expired {ago:.1f} s ago")
    ahead = (command.issued_at_unix_ns - now_ns) / 1e9
    if ahead > clock_skew_s:
        raise refuse(
            control_pb2.REFUSAL_REASON_ISSUED_IN_FUTURE,
            f"the command was issued {ahead:.1f} s in the future (allowed clock skew {clock_skew_s:.0f} s)",
        )


def probe_id_of(command: control_pb2.Command) -> str:
    return _probe_id(command)
