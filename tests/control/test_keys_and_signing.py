"""Operator keys and command signatures: what verifies, and every way a command is refused before it runs."""

from __future__ import annotations

import hashlib
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprobe.control import keys, signing
from gpuprobe.v1 import control_pb2

R = control_pb2


def test_keygen_writes_a_private_key_only_its_owner_reads_and_prints_the_key_id(tmp_path: Path, gpuprobe: Any) -> None:
    done = gpuprobe("probe", "keygen", "--out", str(tmp_path / "k"), "--key-name", "alice")
    assert done.returncode == 0, done.stderr
    private, public = tmp_path / "k" / "alice.key", tmp_path / "k" / "alice.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    raw = keys.load_public(public).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key_id = hashlib.sha256(raw).digest()[:8].hex()
    assert f"key id:      {key_id}" in done.stdout
    assert keys.key_id(keys.load_private(private).public_key()) == key_id
    again = gpuprobe("probe", "keygen", "--out", str(tmp_path / "k"), "--key-name", "alice")
    assert again.returncode == 2 and "exists; use --force" in again.stderr


def test_trust_list_reads_files_and_folders_and_refuses_other_key_types(tmp_path: Path) -> None:
    a = keys.generate(tmp_path / "ops", "a")
    b = keys.generate(tmp_path / "ops", "b")
    c = keys.generate(tmp_path / "other", "c")
    trusted = keys.load_trusted([tmp_path / "ops", c.public])
    assert set(trusted) == {a.key_id, b.key_id, c.key_id}
    from cryptography.hazmat.primitives.asymmetric import ec

    rsa_like = tmp_path / "ec.pub"
    rsa_like.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(keys.KeyFileError, match="not an Ed25519 public key"):
        keys.load_trusted([rsa_like])
    with pytest.raises(keys.KeyFileError, match="cannot read"):
        keys.load_trusted([tmp_path / "missing.pub"])


@pytest.fixture
def pair(tmp_path: Path) -> tuple[object, dict[str, object]]:
    made = keys.generate(tmp_path, "op")
    return keys.load_private(made.private), keys.load_trusted([made.public])


def test_a_signed_command_verifies_and_parses_back(pair: tuple, make_start: Any) -> None:
    private, trusted = pair
    command = make_start(probe_id="p-1")
    signed = signing.sign(command, private)
    assert signing.verify(signed, trusted) == command
    signing.check_times(command, time.time_ns())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_changed_bit_breaks_the_signature(data: st.DataObject, make_start: Any) -> None:
    private = keys.Ed25519PrivateKey.generate()
    trusted = {keys.key_id(private.public_key()): private.public_key()}
    signed = signing.sign(make_start(probe_id="p-1"), private)
    field = data.draw(st.sampled_from(["payload", "signature"]))
    blob = bytearray(getattr(signed, field))
    bit = data.draw(st.integers(0, len(blob) * 8 - 1))
    blob[bit // 8] ^= 1 << (bit % 8)
    setattr(signed, field, bytes(blob))
    with pytest.raises(signing.Refusal) as refused:
        signing.verify(signed, trusted)
    assert refused.value.reason == R.REFUSAL_REASON_BAD_SIGNATURE


def test_unsigned_unknown_key_and_bad_signature_are_refused_with_the_command_id(pair: tuple, make_start: Any) -> None:
    _private, trusted = pair
    command = make_start(probe_id="p-2")
    payload = command.SerializeToString()
    cases = [
        (control_pb2.SignedCommand(payload=payload), R.REFUSAL_REASON_BAD_SIGNATURE, "not signed"),
        (
            signing.sign(command, keys.Ed25519PrivateKey.generate()),
            R.REFUSAL_REASON_UNKNOWN_KEY,
            "not in this agent's trust list",
        ),
        (
            control_pb2.SignedCommand(payload=payload, signature=b"\0" * 64, key_id=next(iter(trusted))),
            R.REFUSAL_REASON_BAD_SIGNATURE,
            "does not verify",
        ),
    ]
    for signed, reason, text in cases:
        with pytest.raises(signing.Refusal) as refused:
            signing.verify(signed, trusted)
        assert refused.value.reason == reason and text in refused.value.message
        assert refused.value.command_id == command.command_id and refused.value.probe_id == "p-2"


@pytest.mark.parametrize(
    ("change", "reason", "text"),
    [
        (lambda c, now: c.ClearField("command_id"), R.REFUSAL_REASON_MALFORMED, "no command_id"),
        (lambda c, now: c.ClearField("probe_start"), R.REFUSAL_REASON_MALFORMED, "no action"),
        (
            lambda c, now: setattr(c, "expires_at_unix_ns", c.issued_at_unix_ns),
            R.REFUSAL_REASON_MALFORMED,
            "expires before",
        ),
        (
            lambda c, now: setattr(c, "expires_at_unix_ns", c.issued_at_unix_ns + 2 * 3600 * 10**9),
            R.REFUSAL_REASON_MALFORMED,
            "over this agent's maximum",
        ),
        (
            lambda c, now: (
                setattr(c, "issued_at_unix_ns", now - 120 * 10**9),
                setattr(c, "expires_at_unix_ns", now - 60 * 10**9),
            ),
            R.REFUSAL_REASON_EXPIRED,
            "expired 60",
        ),
        (
            lambda c, now: (
                setattr(c, "issued_at_unix_ns", now + 90 * 10**9),
                setattr(c, "expires_at_unix_ns", now + 200 * 10**9),
            ),
            R.REFUSAL_REASON_ISSUED_IN_FUTURE,
            "in the future",
        ),
    ],
)
def test_incomplete_expired_and_future_commands_are_refused(
    change: Any, reason: int, text: str, make_start: Any
) -> None:
    now = time.time_ns()
    command = make_start(now_ns=now)
    change(command, now)
    with pytest.raises(signing.Refusal) as refused:
        signing.check_times(command, now)
    assert refused.value.reason == reason
    assert text in refused.value.message
