"""Who may send: tokens, mutual TLS, a wrong CA, plaintext against TLS; a good agent keeps being
served in the same run."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from collector_helpers import client_credentials, collector_config, raw_exchange, running, wait_until

from gpuprobe.agent.settings import TlsSettings
from gpuprobe.app.loadgen import AgentSpec, SyntheticAgent
from gpuprobe.collector.auth import AuthConfigError, parse_tokens
from gpuprobe.collector.settings import CollectorConfigError
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.devservices.certs import Pki
from gpuprobe.v1 import common_pb2, telemetry_pb2

TOKEN_A = "tok-a-0123456789abcdef"
TOKEN_B = "tok-b-0123456789abcdef"


def hello(agent_id: str) -> bytes:
    return telemetry_pb2.StreamRequest(
        hello=telemetry_pb2.Hello(identity=common_pb2.AgentIdentity(agent_id=agent_id, host=agent_id))
    ).SerializeToString()


def test_bearer_tokens_unauthenticated_permission_denied_and_revocation(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# agent token\nnode-a {TOKEN_A}\nnode-b {TOKEN_B}  # second agent\n")
    tokens.chmod(0o600)
    config = collector_config(tmp_path, influxdb.server.url, influxdb.name, tokens_file=tokens)

    async def scenario() -> None:
        async with running(config) as collector:
            target = f"127.0.0.1:{collector.port}"
            good = SyntheticAgent(target, AgentSpec("node-a", gpus=1), token=TOKEN_A)
            task = asyncio.create_task(good.run())
            good.enqueue(good.factory.batch(samples_per_gpu=10))
            await good.wait_acked(1)

            cases = [
                (None, "node-a", grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"),
                (
                    [("authorization", "Bearer wrong-token-0123456789")],
                    "node-a",
                    grpc.StatusCode.UNAUTHENTICATED,
                    "unknown",
                ),
                ([("authorization", f"Basic {TOKEN_A}")], "node-a", grpc.StatusCode.UNAUTHENTICATED, "not 'Bearer"),
                (
                    [("authorization", f"Bearer {TOKEN_B}")],
                    "node-a",
                    grpc.StatusCode.PERMISSION_DENIED,
                    "belongs to agent 'node-b'",
                ),
            ]
            for metadata, agent_id, code, detail in cases:
                got, details, responses = await raw_exchange(target, [hello(agent_id)], metadata=metadata)
                assert (got, detail in details) == (code, True), details
                assert responses == []  # nothing is answered before the credentials pass
                good.enqueue(good.factory.batch(samples_per_gpu=10))
                await good.wait_acked(good.next_seq - 1)

            got, _, _ = await raw_exchange(target, [hello("node-b")], metadata=[("authorization", f"Bearer {TOKEN_B}")])
            assert got == grpc.StatusCode.OK
            # revoking node-b's token takes effect for its next stream, without a restart
            tokens.write_text(f"node-a {TOKEN_A}\n")
            os.utime(tokens, ns=(1, 1))
            got, details, _ = await raw_exchange(
                target, [hello("node-b")], metadata=[("authorization", f"Bearer {TOKEN_B}")]
            )
            assert (got, details) == (grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token")

            await good.close()
            await task
            assert good.errors == [] and good.streams == 1
            assert collector.metrics.value("gpuprobe_collector_streams_ended_total", {"code": "UNAUTHENTICATED"}) == 4
            assert collector.metrics.value("gpuprobe_collector_streams_ended_total", {"code": "PERMISSION_DENIED"}) == 1

    asyncio.run(scenario())


def test_mutual_tls_refuses_a_wrong_ca_no_certificate_and_plaintext_while_serving_a_good_agent(
    influxdb: InfluxDBDatabase, tmp_path: Path, pki: Pki
) -> None:
    config = collector_config(
        tmp_path,
        influxdb.server.url,
        influxdb.name,
        insecure=False,
        tls_cert=pki.server.cert_path,
        tls_key=pki.server.key_path,
        tls_client_ca=pki.ca.cert_path,
    )

    async def scenario() -> None:
        async with running(config) as collector:
            target = f"127.0.0.1:{collector.port}"
            tls = TlsSettings(ca_path=pki.ca.cert_path, cert_path=pki.client.cert_path, key_path=pki.client.key_path)
            good = SyntheticAgent(target, AgentSpec("agent-tls", gpus=2), tls=tls)
            task = asyncio.create_task(good.run())
            good.enqueue(good.factory.batch(samples_per_gpu=10))
            await good.wait_acked(1)

            for name, credentials in [
                ("certificate from the wrong CA", client_credentials(pki, client="wrong_ca")),
                ("no client certificate", client_credentials(pki, client="none")),
                ("plaintext client", None),
            ]:
                got, details, responses = await raw_exchange(
                    target, [hello("intruder")], credentials=credentials, timeout_s=5
                )
                # The TLS handshake fails before any RPC exists: gRPC reports UNAVAILABLE to the client.
                assert got == grpc.StatusCode.UNAVAILABLE, (name, got, details)
                assert responses == []
                good.enqueue(good.factory.batch(samples_per_gpu=10))
                await good.wait_acked(good.next_seq - 1)

            await good.close()
            await task
            assert good.errors == [] and good.streams == 1
            await wait_until(lambda: collector.wal.depth_lines == 0, 20, "the WAL to drain")
            assert collector.metrics.value("gpuprobe_collector_streams_ended_total", {"code": "OK"}) == 1

    asyncio.run(scenario())
    (series,) = influxdb.query("SELECT count(temp_c) FROM gpu WHERE host = 'agent-tls'")
    assert series.values[0][1] == 4 * 10 * 2
    assert influxdb.query("SELECT count(temp_c) FROM gpu WHERE host = 'intruder'") == []


def test_bound_certificate_may_only_speak_for_its_own_agent_id(
    influxdb: InfluxDBDatabase, tmp_path: Path, pki: Pki
) -> None:
    config = collector_config(
        tmp_path,
        influxdb.server.url,
        influxdb.name,
        insecure=False,
        tls_cert=pki.server.cert_path,
        tls_key=pki.server.key_path,
        tls_client_ca=pki.ca.cert_path,
        tls_bind_agent_id=True,
    )

    async def scenario() -> None:
        async with running(config) as collector:
            target = f"127.0.0.1:{collector.port}"
            own = await raw_exchange(target, [hello("agent-tls")], credentials=client_credentials(pki))
            other = await raw_exchange(target, [hello("someone-else")], credentials=client_credentials(pki))
            assert own[0] == grpc.StatusCode.OK
            assert other[0] == grpc.StatusCode.PERMISSION_DENIED and "not for agent 'someone-else'" in other[1]

    asyncio.run(scenario())


def test_plaintext_or_unauthenticated_serving_needs_an_explicit_insecure(tmp_path: Path, pki: Pki) -> None:
    base = collector_config(tmp_path, "http://127.0.0.1:1", "x")
    with pytest.raises(CollectorConfigError, match="refusing to serve agents over plaintext"):
        replace(base, insecure=False).check()
    with pytest.raises(CollectorConfigError, match="no agent authentication"):
        replace(base, insecure=False, tls_cert=pki.server.cert_path, tls_key=pki.server.key_path).check()
    replace(
        base, insecure=False, tls_cert=pki.server.cert_path, tls_key=pki.server.key_path, tokens_file=tmp_path
    ).check()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node-a\n", "expected 'AGENT_ID TOKEN'"),
        ("node-a short\n", "shorter than 16"),
        (f"node-a {TOKEN_A}\nnode-a {TOKEN_B}\n", "listed twice"),
    ],
)
def test_tokens_file_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(AuthConfigError, match=message):
        parse_tokens(text, "tokens")
