"""``gpuprobe certs``: the files it writes, their modes, the refusal to overwrite, and that they work: a
real collector and agent over mutual TLS with the tokens, and a real Mosquitto's TLS listener."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from collector_helpers import CollectorProcess
from cryptography import x509
from cryptography.x509.oid import NameOID
from support import clean_env, free_port, gpuprobe_command, wait_until

from gpuprobe.collector.auth import parse_tokens
from gpuprobe.devservices import InfluxDBDatabase, MosquittoServer

NODES = ("node-a", "node-b")


def certs(out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    args = ["certs", "--out", str(out), "--server-name", "localhost", "--server-name", "127.0.0.1"]
    for node in NODES:
        args += ["--node", node]
    return subprocess.run(
        [*gpuprobe_command(), *args, *extra], env=clean_env(**(env or {})), capture_output=True, text=True, timeout=60
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certs_writes_a_ca_a_server_certificate_and_a_certificate_and_token_per_node(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    made = certs(out)
    assert made.returncode == 0, made.stderr
    ca = cert(out / "ca.crt")
    server = cert(out / "server.crt")
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    server.verify_directly_issued_by(ca)
    tokens = parse_tokens((out / "tokens").read_text(), "tokens")
    assert sorted(tokens) == sorted(NODES)
    for node in NODES:
        client = cert(out / "nodes" / f"{node}.crt")
        client.verify_directly_issued_by(ca)
        assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == node
        assert (out / "nodes" / f"{node}.token").read_text().strip() == tokens[node]
    assert len(set(tokens.values())) == len(NODES)
    secrets = [out / "ca.key", out / "server.key", out / "tokens"]
    secrets += [out / "nodes" / f"{n}.{kind}" for n in NODES for kind in ("key", "token")]
    assert {p.name: mode(p) for p in secrets} == {p.name: 0o600 for p in secrets}
    for public in [out / "ca.crt", out / "server.crt", *(out / "nodes" / f"{n}.crt" for n in NODES)]:
        assert mode(public) == 0o644
    for path in secrets:  # the output says what each file is for
        assert str(path) in made.stdout

    before = (out / "ca.key").read_bytes()
    again = certs(out, env={"GPUPROBE_FORCE": "1"})  # --force is taken from the command line only
    assert again.returncode == 2
    assert f"{out / 'ca.crt'} exists" in again.stderr and "use --force" in again.stderr
    assert (out / "ca.key").read_bytes() == before
    forced = certs(out, "--force")
    assert forced.returncode == 0, forced.stderr
    assert (out / "ca.key").read_bytes() != before


def test_a_node_name_that_cannot_be_an_agent_id_is_refused(tmp_path: Path) -> None:
    made = subprocess.run(
        [*gpuprobe_command(), "certs", "--out", str(tmp_path / "x"), "--server-name", "c", "--node", "a b"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 2
    assert "--node 'a b': a node name is" in made.stderr
    assert not (tmp_path / "x").exists()


def test_the_files_carry_mutual_tls_and_tokens_between_collector_and_agent_and_serve_mosquitto(
    tmp_path: Path, influxdb: InfluxDBDatabase, collector_process: Callable[..., CollectorProcess]
) -> None:
    out = tmp_path / "pki"
    assert certs(out).returncode == 0
    collector = collector_process(
        "--influx-url", influxdb.server.url, "--influx-db", influxdb.name, "--wal", str(tmp_path / "wal"),
        "--tls-cert", str(out / "server.crt"), "--tls-key", str(out / "server.key"),
        "--tls-client-ca", str(out / "ca.crt"), "--tls-bind-agent-id", "--tokens-file", str(out / "tokens"),
        "--sink-linger", "0.2",
    ).start()  # fmt: skip
    node = "node-b"
    agent = subprocess.Popen(
        [
            *gpuprobe_command(), "sim", "run", "--gpus", "1", "--state-dir", str(tmp_path / "sim"), "--",
            *gpuprobe_command(), "agent", "--host", node, "--collector", f"localhost:{collector.port}",
            "--tls-ca", str(out / "ca.crt"), "--tls-cert", str(out / "nodes" / f"{node}.crt"),
            "--tls-key", str(out / "nodes" / f"{node}.key"), "--token-file", str(out / "nodes" / f"{node}.token"),
            "--spool", str(tmp_path / "spool"),
        ],
        env=clean_env(),
        stdout=(tmp_path / "agent.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def stored() -> int:
            series = influxdb.query(f"SELECT count(power_w) FROM gpu WHERE host = '{node}'")
            return sum(int(row["count"]) for s in series for row in s.rows())

        wait_until(
            lambda: agent.poll() is None and stored() > 0,
            60,
            "the agent's GPU samples in InfluxDB through the collector",
            describe=lambda: (tmp_path / "agent.log").read_text()[-3000:] + collector.log()[-3000:],
        )
    finally:
        agent.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(30)
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert "refused" not in (tmp_path / "agent.log").read_text()

    tls_port = free_port()
    listener = "\n".join(
        [
            f"listener {tls_port} 127.0.0.1",
            f"cafile {out / 'ca.crt'}",
            f"certfile {out / 'server.crt'}",
            f"keyfile {out / 'server.key'}",
        ]
    )
    with MosquittoServer(tmp_path / "broker", extra_config=listener):
        fleet = subprocess.run(
            [*gpuprobe_command(), "fleet", "--broker", f"mqtts://localhost:{tls_port}", "--mqtt-ca",
             str(out / "ca.crt"), "--json"],
            env=clean_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert fleet.returncode == 0, fleet.stderr
        assert fleet.stdout.strip() == "[]"


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _tls_handshake(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
            context.wrap_socket(raw, server_hostname="localhost"),
        ):
            return True
    except OSError:
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="starts Mosquitto as root, which then runs as the mosquitto user")
@pytest.mark.skipif(not _has_user("mosquitto"), reason="no mosquitto user (Debian's mosquitto package makes it)")
def test_mosquitto_as_its_own_user_reads_the_server_key_once_handed_over_as_the_help_says(tmp_path: Path) -> None:
    """Mosquitto started as root switches to the mosquitto user before it loads its certificates: the
    0600 key of the user who ran `gpuprobe certs` is unreadable to it, the copy made with
    `install -o mosquitto -m 0600` (gpuprobe certs --help) is read."""
    out = tmp_path / "pki"
    assert certs(out).returncode == 0
    help_text = subprocess.run(
        [*gpuprobe_command(), "certs", "--help"], env=clean_env(), capture_output=True, text=True, timeout=60
    ).stdout
    assert "install -o mosquitto -m 0600" in " ".join(help_text.split())
    # what the mosquitto user can reach (pytest's own folders are root's alone)
    etc = Path(tempfile.mkdtemp(prefix="gpuprobe-certs-test-"))
    try:
        etc.chmod(0o755)
        for name in ("ca.crt", "server.crt"):
            shutil.copy(out / name, etc / name)
        shutil.copy(out / "server.key", etc / "server.key")  # as written: root's, 0600
        assert mode(etc / "server.key") == 0o600 and (etc / "server.key").stat().st_uid == 0
        port = free_port()
        conf = etc / "mosquitto.conf"
        conf.write_text(
            f"user mosquitto\npersistence false\nallow_anonymous true\nlistener {port} 127.0.0.1\n"
            f"cafile {etc / 'ca.crt'}\ncertfile {etc / 'server.crt'}\nkeyfile {etc / 'server.key'}\n"
        )
        refused = subprocess.run(["mosquitto", "-c", str(conf)], capture_output=True, text=True, timeout=30)
        assert refused.returncode != 0
        assert "Unable to load server key file" in refused.stdout + refused.stderr

        (etc / "server.key").unlink()
        handed = subprocess.run(
            ["install", "-o", "mosquitto", "-m", "0600", str(out / "server.key"), str(etc / "server.key")], check=False
        )
        assert handed.returncode == 0
        broker = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_until(
                lambda: broker.poll() is None and _tls_handshake(port, out / "ca.crt"),
                20,
                "a TLS handshake with Mosquitto running as the mosquitto user",
                describe=lambda: "exited" if broker.poll() is not None else "running",
            )
        finally:
            broker.terminate()
            broker.wait(10)
    finally:
        shutil.rmtree(etc)


def test_run_again_with_only_node_names_adds_nodes_signed_by_the_same_ca(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    assert certs(out).returncode == 0
    before = parse_tokens((out / "tokens").read_text(), "tokens")
    ca_before = (out / "ca.crt").read_bytes()

    def again(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*gpuprobe_command(), "certs", "--out", str(out), *args],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    added = again("--node", "node-c")
    assert added.returncode == 0, added.stderr
    after = parse_tokens((out / "tokens").read_text(), "tokens")
    assert {k: v for k, v in after.items() if k != "node-c"} == before
    assert after["node-c"] == (out / "nodes" / "node-c.token").read_text().strip()
    assert (out / "ca.crt").read_bytes() == ca_before
    cert(out / "nodes" / "node-c.crt").verify_directly_issued_by(cert(out / "ca.crt"))
    assert mode(out / "tokens") == 0o600 and mode(out / "nodes" / "node-c.key") == 0o600

    twice = again("--node", "node-c")
    assert twice.returncode == 2 and "the node has its files already" in twice.stderr
    nothing = again()
    assert nothing.returncode == 2 and "give --node NAME to add nodes" in nothing.stderr
    assert parse_tokens((out / "tokens").read_text(), "tokens") == after
