"""Authenticated MQTT: passwords, the example ACL in deploy/mosquitto, TLS, and clear errors when they are wrong."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.control import keys, signing, topics
from gpuprobe.devservices import MosquittoServer, free_port
from gpuprobe.devservices.certs import make_pki
from gpuprobe.v1 import control_pb2

ROOT = Path(__file__).resolve().parents[2]
ACL = ROOT / "deploy" / "mosquitto" / "acl"
CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.conf"


def _secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def secured(tmp_path: Path) -> Any:
    """Mosquitto with the example ACL, accounts for an operator and two agents, and a TLS listener."""
    pki = make_pki(tmp_path / "pki")
    tls_port = free_port()
    users = {"operator": "op-secret", "gpu-a": "a-secret", "gpu-b": "b-secret"}
    extra = "\n".join(
        [
            f"listener {tls_port} 127.0.0.1",
            f"cafile {pki.ca.cert_path}",
            f"certfile {pki.server.cert_path}",
            f"keyfile {pki.server.key_path}",
        ]
    )
    with MosquittoServer(tmp_path / "broker", users=users, acl_file=ACL, extra_config=extra) as broker:
        broker.tls_url = f"mqtts://127.0.0.1:{tls_port}"  # type: ignore[attr-defined]
        broker.pki = pki  # type: ignore[attr-defined]
        yield broker


def test_wrong_or_missing_credentials_are_refused_with_a_clear_error(
    secured: Any, make_cli: Any, tmp_path: Path
) -> None:
    wrong = make_cli(secured.url, ["--mqtt-username", "operator", "--mqtt-password", "nope"])("fleet")
    assert wrong.returncode == 1
    # Mosquitto 2.0 answers a wrong password with "not authorized" (MQTT 5 reason 0x87), 2.0.15+ with 0x86
    prefix = f"gpuprobe fleet: error: the MQTT broker {secured.url} refused the connection as 'operator': "
    hint = " (check --mqtt-username and --mqtt-password(-file))"
    assert (
        prefix + "not authorized" + hint in wrong.stderr or prefix + "bad user name or password" + hint in wrong.stderr
    )
    anonymous = make_cli(secured.url)("fleet")
    assert anonymous.returncode == 1
    assert f"the MQTT broker {secured.url} refused the connection without a user name" in anonymous.stderr
    right = make_cli(
        secured.url, ["--mqtt-username", "operator", "--mqtt-password-file", str(_secret(tmp_path / "pw", "op-secret"))]
    )
    assert right("fleet").returncode == 0


def test_an_agent_with_a_wrong_password_logs_why_and_keeps_trying(secured: Any, fleet: Any, tmp_path: Path) -> None:
    agent = fleet.agent(
        secured.url, "gpu-a", start=False,
        extra_args=["--mqtt-username", "gpu-a", "--mqtt-password", "wrong", "--auth-retry", "1"],
    )  # fmt: skip
    agent.start(wait_connected=False)
    log = agent.wait_log("check --mqtt-username", count=2, timeout_s=30)
    assert f"the MQTT broker {secured.url} refused the connection as 'gpu-a': " in log
    assert "retrying in 1 s" in log
    assert agent.proc.poll() is None


def test_agents_and_operators_work_within_the_example_acl(
    secured: Any, fleet: Any, operator_key: Any, make_cli: Any, make_operator: Any, make_start: Any, tmp_path: Path
) -> None:
    a = fleet.agent(
        secured.url, "gpu-a",
        extra_args=["--mqtt-username", "gpu-a", "--mqtt-password-file", str(_secret(tmp_path / "a", "a-secret"))],
    )  # fmt: skip
    op_args = ["--mqtt-username", "operator", "--mqtt-password-file", str(_secret(tmp_path / "op", "op-secret"))]
    cli = make_cli(secured.url, op_args)
    listed = json.loads(cli("fleet", "--json").stdout)
    assert [(p["host"], p["state"]) for p in listed] == [("gpu-a", "online")]

    started = cli("probe", "start", "--workload", "idle", "--duration", "1", "--nodes", "gpu-a", "--start-in", "1s",
                  "--idle-baseline", "0", "--warmup", "0", "--cooldown", "0", "--key", str(operator_key.private),
                  "--probe-id", "p-acl")  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    done = cli("probe", "results", "p-acl", "--wait", "30", "--json")
    assert done.returncode == 0, done.stdout + done.stderr

    # another agent's account may neither publish commands (even validly signed ones) nor pose as gpu-a
    b = make_operator(secured.url, {"mqtt_username": "gpu-b", "mqtt_password": "b-secret"})
    command = make_start(hosts=["gpu-a"])
    assert b.send(signing.sign(command, keys.load_private(operator_key.private)), command, {"gpu-a"}, wait_s=2) == []
    fake = control_pb2.AgentPresence(state=control_pb2.AGENT_STATE_ONLINE)
    fake.identity.host = "gpu-c"
    b.publish(topics.presence("gpu-c"), fake.SerializeToString(), retain=True)
    b.publish(topics.results("p-acl", "gpu-c"), control_pb2.ProbeResult(host="gpu-c").SerializeToString(), retain=True)
    assert [(p["host"], p["state"]) for p in json.loads(cli("fleet", "--json").stdout)] == [("gpu-a", "online")]
    assert [r["host"] for r in json.loads(cli("probe", "results", "p-acl", "--json").stdout)["results"]] == ["gpu-a"]
    assert a.log().count("accepted command") == 1


def test_tls_with_the_right_ca_works_and_with_another_ca_fails_clearly(
    secured: Any, fleet: Any, make_cli: Any, tmp_path: Path
) -> None:
    pki = secured.pki
    agent = fleet.agent(
        secured.tls_url, "gpu-b",
        extra_args=["--mqtt-ca", str(pki.ca.cert_path), "--mqtt-username", "gpu-b", "--mqtt-password", "b-secret"],
    )  # fmt: skip
    assert "connected to " + secured.tls_url in agent.log()
    creds = ["--mqtt-username", "operator", "--mqtt-password", "op-secret"]
    ok = make_cli(secured.tls_url, ["--mqtt-ca", str(pki.ca.cert_path), *creds])("fleet", "--json")
    assert ok.returncode == 0, ok.stderr
    assert [p["host"] for p in json.loads(ok.stdout)] == ["gpu-b"]
    bad = make_cli(secured.tls_url, ["--mqtt-ca", str(pki.other_ca.cert_path), *creds])("fleet")
    assert bad.returncode == 1
    assert f"TLS with the MQTT broker {secured.tls_url} failed" in bad.stderr
    assert "certificate verify failed" in bad.stderr


def test_the_example_mosquitto_conf_runs_with_tls_passwords_and_the_acl(tmp_path: Path, make_cli: Any) -> None:
    """deploy/mosquitto/mosquitto.conf as shipped, with only its paths and ports moved into a temporary folder."""
    pki = make_pki(tmp_path / "pki")
    etc = tmp_path / "etc"
    etc.mkdir()
    for src, name in (
        (pki.server.cert_path, "server.crt"),
        (pki.server.key_path, "server.key"),
        (pki.ca.cert_path, "ca.crt"),
    ):
        (etc / name).write_bytes(src.read_bytes())
    (etc / "acl").write_text(ACL.read_text())
    subprocess.run(
        ["mosquitto_passwd", "-c", "-b", str(etc / "passwd"), "operator", "op-secret"], check=True, capture_output=True
    )
    tls_port, plain_port = free_port(), free_port()
    conf = CONF.read_text()
    conf = conf.replace("/etc/mosquitto/gpuprobe/", f"{etc}/").replace("/var/lib/mosquitto/", f"{tmp_path}/")
    conf = conf.replace("listener 8883", f"listener {tls_port} 127.0.0.1").replace(
        "listener 1883", f"listener {plain_port}"
    )
    if os.geteuid() == 0:
        conf += "\nuser root\n"
    (tmp_path / "mosquitto.conf").write_text(conf)
    mosquitto = next(p for p in ("/usr/sbin/mosquitto", "/usr/bin/mosquitto") if Path(p).exists())
    with (tmp_path / "mosquitto.log").open("wb") as log:
        proc = subprocess.Popen([mosquitto, "-c", str(tmp_path / "mosquitto.conf")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", tls_port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "mosquitto.log").read_text()
                assert time.monotonic() < deadline, "mosquitto did not open its TLS listener"
                time.sleep(0.05)
        url = f"mqtts://127.0.0.1:{tls_port}"
        ok = make_cli(
            url, ["--mqtt-ca", str(pki.ca.cert_path), "--mqtt-username", "operator", "--mqtt-password", "op-secret"]
        )
        assert ok("fleet").returncode == 0
        anonymous = make_cli(f"mqtt://127.0.0.1:{plain_port}")("fleet")
        assert anonymous.returncode == 1 and "refused the connection without a user name" in anonymous.stderr
        # every warning Mosquitto gives at start is one the ACL's comments name as expected
        warnings = [
            w
            for w in re.findall(r"Warning: .*", (tmp_path / "mosquitto.log").read_text())
            if "should not be run as root" not in w  # this test's `user root` above, not the shipped files
        ]
        assert warnings and all(w in ACL.read_text() for w in warnings), warnings
    finally:
        proc.terminate()
        proc.wait(10)


def test_fleet_with_no_broker_running_names_the_refused_connection_not_the_user_name(make_cli: Any) -> None:
    """It was "cannot talk to the MQTT broker ... without a user name: Connection refused"."""
    port = free_port()  # nothing listens there
    done = make_cli(f"mqtt://127.0.0.1:{port}")("fleet", timeout=60)
    assert done.returncode == 1
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith(f"gpuprobe fleet: error: nothing listens at the MQTT broker mqtt://127.0.0.1:{port}")
    assert "connection refused" in error and "--broker" in error and "user name" not in error, error
    unresolved = make_cli("mqtt://nosuchhost.invalid:1883")("fleet", timeout=60)
    assert unresolved.returncode == 1
    assert "cannot resolve the MQTT broker's host name nosuchhost.invalid" in unresolved.stderr, unresolved.stderr


def test_plain_mqtt_against_the_tls_port_says_to_use_mqtts(secured: Any, make_cli: Any) -> None:
    """It was only "Operation timed out"."""
    plain = secured.tls_url.replace("mqtts://", "mqtt://")
    done = make_cli(plain, ["--mqtt-username", "operator", "--mqtt-password", "op-secret"])("fleet", timeout=90)
    assert done.returncode == 1
    assert f"the MQTT broker {plain} did not answer" in done.stderr and "use mqtts://" in done.stderr, done.stderr
