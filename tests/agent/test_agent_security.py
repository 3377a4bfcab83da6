"""TLS, mutual TLS and bearer tokens against a real gRPC receiver: good credentials deliver, bad ones are
refused with a clear log line while the agent keeps its spool."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import (
    AgentFactory,
    Receiver,
    assert_no_loss_no_duplicates,
    machine,
    unique_batches,
    wait_for_batches,
)
from support import clean_env, free_port, gpuprobe_command, stays, wait_until

from gpuprobe.devservices.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), client_name="node-1")


def spooled_batches(spool: Path) -> int:
    if not (spool / "spool.sqlite3").exists():
        return 0
    db = sqlite3.connect(spool / "spool.sqlite3")
    try:
        return int(db.execute("SELECT COUNT(*) FROM batches").fetchone()[0])
    except sqlite3.OperationalError:  # the agent has not created the table yet
        return 0
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
    wait_for_batches(receiver, lambda got: len(got) >= 2, "2 batches over mutual TLS", agent=agent)
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
    wait_until(receiver.batches, 10, "a batch")
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
    wait_until(lambda: spooled_batches(tmp_path / "spool") >= 2, 20, "2 batches spooled", interval_s=0.2)
    assert agent.terminate() == 0
    assert receiver.batches() == [], "nothing was accepted"
    assert spooled_batches(tmp_path / "spool") >= 2, "the samples stay spooled"
    assert "stay in the spool for the next start" in agent.log()


def test_an_identity_influxdb_cannot_store_is_refused_at_start_with_the_collectors_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [*gpuprobe_command(), "agent", "--collector", "127.0.0.1:1", "--host", 'n"q\\', "--spool", str(tmp_path / "s")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "Hello.identity.agent_id 'n\"q\\\\' ends with a backslash" in result.stderr
    assert "the collector would refuse this agent's stream" in result.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was opened


def test_a_collector_that_refuses_the_identity_is_retried_slowly_with_an_error(
    tmp_path: Path, agent_factory: AgentFactory
) -> None:
    port = free_port()
    metrics_port = free_port()
    with (tmp_path / "collector.log").open("wb") as log:
        collector = subprocess.Popen(
            [
                *gpuprobe_command(),
                "collector",
                "--insecure",
                "--listen",
                f"127.0.0.1:{port}",
                "--max-tag-bytes",
                "4",  # stricter than the agent's own check: "node-1" is too long here
                "--influx-url",
                f"http://127.0.0.1:{free_port()}",
                "--influx-db",
                "unused",
                "--wal",
                str(tmp_path / "wal"),
                "--metrics-listen",
                f"127.0.0.1:{metrics_port}",
            ],
            env=clean_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        # the collector serving before the agent starts: its Hello is then refused before any batch is
        # written. (Started together on a busy machine, the agent had spooled batches and wrote one as the
        # collector refused the Hello; gRPC then reports INTERNAL for the write and the agent, without the
        # refusal's reason, reconnected at once: a second refused stream.)
        wait_until(
            lambda: re.search(r"serving on port \d+", (tmp_path / "collector.log").read_text()),
            60,
            "the collector serving",
            interval_s=0.1,
            describe=lambda: (tmp_path / "collector.log").read_text()[-2000:],
        )
        sim = machine(tmp_path / "sim", ["L4"])
        agent = agent_factory(sim, [f"127.0.0.1:{port}"], "--auth-retry", "30")
        agent.wait_for_log(r"ERROR .*collector 127\.0\.0\.1:\d+ refused the agent \(INVALID_ARGUMENT: ", timeout=30)

        def refused_streams() -> float:
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            return sum(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith('gpuprobe_collector_streams_ended_total{code="INVALID_ARGUMENT"}')
            )

        # with the ordinary backoff (--reconnect-min/max 0.2..1 s) 3 s would be several more attempts; with
        # --auth-retry 30 the collector sees no second stream
        wait_until(lambda: refused_streams() >= 1, 10, "the collector to count the refused stream", interval_s=0.2)
        one = "one refused stream at the collector"
        stays(
            lambda: refused_streams() == 1, 3.0, one, interval_s=0.2, describe=lambda: (refused_streams(), agent.log())
        )
        assert refused_streams() == 1
        assert "retrying in 30 s" in agent.log()
        assert agent.running()  # it samples and spools meanwhile
    finally:
        collector.terminate()
        collector.wait(20)


def test_a_host_name_that_does_not_resolve_is_reported_as_dns_not_tls(
    tmp_path: Path, pki: Pki, agent_factory: AgentFactory
) -> None:
    """It was "TLS ... failed ... usually means the collector refused the client certificate"."""
    sim = machine(tmp_path / "sim", ["L4"])
    agent = agent_factory(
        sim, ["nosuchhost.invalid:7447"], "--tls-ca", str(pki.ca.cert_path),
        "--tls-cert", str(pki.client.cert_path), "--tls-key", str(pki.client.key_path), "--grace", "0",
    )  # fmt: skip
    line = agent.wait_for_log(r"cannot resolve the collector's host name nosuchhost\.invalid[^\n]*", timeout=30)
    assert "DNS" in line.group(0) and "--collector" in line.group(0), line.group(0)
    assert agent.terminate() == 0
    assert "TLS with collector" not in agent.log() and "client certificate" not in agent.log(), agent.log()


def test_a_plaintext_agent_against_a_tls_collector_is_told_to_use_tls(
    tmp_path: Path, pki: Pki, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    """It was only "UNAVAILABLE ... Socket closed"."""
    receiver = receiver_factory("--tls-cert", str(pki.server.cert_path), "--tls-key", str(pki.server.key_path))
    sim = machine(tmp_path / "sim", ["L4"])
    agent = agent_factory(sim, [f"localhost:{receiver.port}"], "--grace", "0")
    line = agent.wait_for_log(rf"collector localhost:{receiver.port} speaks TLS[^\n]*", timeout=30)
    assert "--tls-ca" in line.group(0), line.group(0)
    assert agent.terminate() == 0
    assert receiver.batches() == []


def test_a_refused_token_is_named_at_every_attempt_even_with_batches_waiting(
    tmp_path: Path, receiver_factory: Callable[..., Receiver], agent_factory: AgentFactory
) -> None:
    """A collector that refuses the token at the start of the stream while the agent has spooled batches
    to send: every attempt ends with UNAUTHENTICATED and waits --auth-retry. Batches written before the
    Welcome raced the refusal, gRPC then reported INTERNAL with the reason lost (grpc/grpc#36066), and
    every other attempt was logged as a plain disconnect and retried on the ordinary backoff."""
    receiver = receiver_factory("--token", "right")
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB", "H100-SXM5-80GB"])
    agent = agent_factory(
        sim, [receiver.address], "--token", "guess", "--auth-retry", "0.2", "--metrics-listen", "127.0.0.1:0"
    )
    wait_until(lambda: spooled_batches(tmp_path / "spool") >= 2, 20, "2 batches spooled", interval_s=0.1)
    wait_until(lambda: agent.metrics()["gpuprobe_agent_reconnects_total"] >= 12, 30, "12 attempts", interval_s=0.2)
    assert "refused the agent's credentials (UNAUTHENTICATED" in agent.log()
    assert "reason is lost" not in agent.log()
    assert "retrying in 0.2 s" in agent.log()
    assert agent.terminate() == 0
    assert receiver.batches() == []
