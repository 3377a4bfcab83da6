"""TLS, mutual TLS and bearer tokens against a real gRPC receiver: good credentials deliver, bad ones are
refused with a clear log line while the agent keeps its spool."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import AgentFactory, Receiver, assert_no_loss_no_duplicates, machine, unique_batches, wait_until

from gpuprobe.devservices.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), client_name="node-1")


def spooled_batches(spool: Path) -> int:
    db = sqlite3.connect(spool / "spool.sqlite3")
    try:
        return int(db.execute("SELECT COUNT(*) FROM batches").fetchone()[0])
    finally:
        db.close()


def test_mutual_tls_and_bearer_token_deliver(
    tmp_path: Path, pki: Pki, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    receiver = receiver_factory(
        "--tls-cert", str(pki.server.cert_path), "--tls-key", str(pki.server.key_path),
        "--tls-client-ca", str(pki.ca.cert_path), "--token", "s3cret-token",
    )  # fmt: skip
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"])
    agent = agent_factory(
        sim, [f"localhost:{receiver.port}"],
        "--tls-ca", str(pki.ca.cert_path), "--tls-cert", str(pki.client.cert_path),
        "--tls-key", str(pki.client.key_path), "--token-file", str(token_file),
    )  # fmt: skip
    agent.wait_for_log(f"streaming to collector localhost:{receiver.port}")
    time.sleep(2)
    assert agent.terminate() == 0
    assert "everything was delivered" in agent.log()
    assert "without TLS" not in agent.log()
    assert_no_loss_no_duplicates(unique_batches(receiver.batches()), 0.1, 1)


def test_tls_with_server_name_override_and_token(
    tmp_path: Path, pki: Pki, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    receiver = receiver_factory(
        "--tls-cert", str(pki.server.cert_path), "--tls-key", str(pki.server.key_path), "--token", "t0k"
    )
    sim = machine(tmp_path / "sim", ["L4"])
    # the address is an IP, the certificate is checked against the name given here
    agent = agent_factory(
        sim, [receiver.address], "--tls-ca", str(pki.ca.cert_path), "--tls-server-name", "localhost", "--token", "t0k"
    )
    agent.wait_for_log("streaming to collector")
    wait_until(receiver.batches, 10, what="a batch")
    assert agent.terminate() == 0


BAD = {
    "wrong-token": (["--token", "guess"], r"refused the agent's credentials \(UNAUTHENTICATED"),
    "no-token": ([], r"refused the agent's credentials \(UNAUTHENTICATED"),
    "client-certificate-from-another-ca": (["other_client"], r"TLS with collector .* failed"),
    "no-client-certificate": (["no_client"], r"TLS with collector .* failed"),
    "collector-certificate-not-trusted": (["untrusted"], r"TLS with collector .* failed"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_credentials_are_refused_logged_and_the_spool_is_kept(
    case: str, tmp_path: Path, pki: Pki, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    extra, expected_log = BAD[case]
    receiver = receiver_factory(
        "--tls-cert", str(pki.server.cert_path), "--tls-key", str(pki.server.key_path),
        "--tls-client-ca", str(pki.ca.cert_path), "--token", "right",
    )  # fmt: skip
    client = pki.client
    args = ["--tls-ca", str(pki.ca.cert_path)]
    if extra == ["other_client"]:
        client = pki.other_client
    if extra == ["untrusted"]:
        args = ["--tls-ca", str(pki.other_ca.cert_path)]
    if extra != ["no_client"]:
        args += ["--tls-cert", str(client.cert_path), "--tls-key", str(client.key_path)]
    if extra and extra[0].startswith("--"):
        args += extra
    elif case != "no-token":
        args += ["--token", "right"]
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"])
    agent = agent_factory(sim, [f"localhost:{receiver.port}"], *args, "--grace", "1")
    line = agent.wait_for_log(expected_log, timeout=20)
    assert f"localhost:{receiver.port}" in line.string[line.start() - 200 : line.end() + 300]
    time.sleep(1.5)
    assert agent.terminate() == 0
    assert receiver.batches() == [], "nothing was accepted"
    assert spooled_batches(tmp_path / "spool") >= 2, "the samples stay spooled"
    assert "stay in the spool for the next start" in agent.log()
