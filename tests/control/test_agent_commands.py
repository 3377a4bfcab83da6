"""Signed commands against real control agents over a real Mosquitto: what is refused (and why, visibly),
what runs, replay across restarts, selection, busy, cancel."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
import support

from gpuprobe.control import keys, signing, topics
from gpuprobe.v1 import common_pb2, control_pb2

R = control_pb2


def _reason(reply: control_pb2.CommandReply) -> str:
    return "accepted" if reply.accepted else signing.REASON_NAMES[reply.reason]


def _wait_result(operator: Any, probe_id: str, host: str, timeout_s: float = 60) -> control_pb2.ProbeResult:
    def result() -> control_pb2.ProbeResult | None:
        for msg in operator.retained(topics.results(probe_id, host)):
            return control_pb2.ProbeResult.FromString(msg.payload)
        return None

    return support.wait_until(result, timeout_s, f"the result of {probe_id} from {host}", interval_s=0.3)


def test_bad_commands_are_refused_with_a_visible_reason_and_nothing_runs(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any, cli: Any, mqtt_broker: Any
) -> None:
    agent = fleet.agent(mqtt_broker.url)
    host = agent.host
    trusted_key = keys.load_private(operator_key.private)
    now = time.time_ns()
    refused: dict[str, tuple[str, str]] = {}  # probe id -> (expected reason, message fragment)

    def send(signed: control_pb2.SignedCommand, command: control_pb2.Command, reason: str, text: str) -> None:
        (reply,) = operator.send(signed, command, {host})
        assert (reply.host, _reason(reply)) == (host, reason)
        assert text in reply.message and reply.command_id == command.command_id
        assert reply.probe_id == command.probe_start.probe_id
        refused[command.probe_start.probe_id] = (reason, text)

    unsigned = make_start(hosts=[host])
    send(control_pb2.SignedCommand(payload=unsigned.SerializeToString()), unsigned, "bad_signature", "not signed")
    stranger = make_start(hosts=[host])
    send(signing.sign(stranger, keys.Ed25519PrivateKey.generate()), stranger, "unknown_key", "trust list")
    forged = make_start(hosts=[host])
    bad = signing.sign(forged, trusted_key)
    bad.signature = signing.sign(make_start(hosts=[host]), trusted_key).signature  # a real signature of other bytes
    send(bad, forged, "bad_signature", "does not verify")
    expired = make_start(hosts=[host], now_ns=now - 120 * 10**9, lifetime_s=60)
    send(signing.sign(expired, trusted_key), expired, "expired", "expired 60")
    future = make_start(hosts=[host], now_ns=now + 600 * 10**9)
    send(signing.sign(future, trusted_key), future, "issued_in_future", "in the future")

    # an unknown workload through the operator's own command: the refusal is in its output
    done = cli(
        "probe", "start", "--workload", "crypto-miner", "--duration", "5", "--nodes", host,
        "--key", str(operator_key.private), "--probe-id", "p-unknown-workload", "--start-in", "1s",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith(host))
    assert row.split()[1:3] == ["refused", "unknown_workload"]
    assert "not built in" in row
    refused["p-unknown-workload"] = ("unknown_workload", "not built in")

    # the agent logged each refusal with its reason, and ran nothing for any of them
    log = agent.log()
    for reason, _ in refused.values():
        assert f": {reason} (" in log
    assert "started trainer" not in log
    assert not (agent.control_dir / "probes").exists()
    assert (agent.machine.state_dir / "gpu0.events").read_text() == ""
    for probe_id in refused:
        assert operator.retained(topics.progress(probe_id), topics.results(probe_id)) == []


def test_a_replayed_command_is_refused_even_after_the_agent_restarts(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any, mqtt_broker: Any
) -> None:
    agent = fleet.agent(mqtt_broker.url)
    command = make_start(hosts=[agent.host], duration_s=0.5)
    signed = signing.sign(command, keys.load_private(operator_key.private))
    (reply,) = operator.send(signed, command, {agent.host})
    assert reply.accepted, reply.message
    result = _wait_result(operator, command.probe_start.probe_id, agent.host)
    assert result.status == common_pb2.PROBE_STATUS_SUCCEEDED

    (again,) = operator.send(signed, command, {agent.host})
    assert _reason(again) == "replayed"
    assert agent.stop() == 0
    agent.start()
    (after_restart,) = operator.send(signed, command, {agent.host})
    assert _reason(after_restart) == "replayed"
    assert agent.log().count("started trainer") == 1


def test_selection_busy_and_cancel(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any, cli: Any, mqtt_broker: Any
) -> None:
    a = fleet.agent(mqtt_broker.url, extra_args=["--cluster", "c-alpha"])
    b = fleet.agent(mqtt_broker.url, extra_args=["--cluster", "c-beta"])
    private = keys.load_private(operator_key.private)

    # only the selected agent answers; a host named but excluded by another term refuses visibly
    long_run = make_start(hosts=[a.host], duration_s=120, phases_s=0)
    replies = operator.send(signing.sign(long_run, private), long_run, {a.host}, wait_s=3)
    assert [(r.host, _reason(r)) for r in replies] == [(a.host, "accepted")]
    excluded = make_start(hosts=[b.host])
    excluded.probe_start.selector.clusters.append("c-alpha")
    replies = operator.send(signing.sign(excluded, private), excluded, {b.host}, wait_s=3)
    assert [(r.host, _reason(r)) for r in replies] == [(b.host, "not_selected")]

    # a second probe on the busy node is refused
    second = make_start(hosts=[a.host])
    (busy,) = operator.send(signing.sign(second, private), second, {a.host})
    assert _reason(busy) == "busy" and long_run.probe_start.probe_id in busy.message

    probe_id = long_run.probe_start.probe_id
    a.wait_log("phase steady")
    status = cli("probe", "status", probe_id, "--once")
    assert status.returncode == 0
    assert a.host in status.stdout and "steady" in status.stdout and "running" in status.stdout
    every = cli("probe", "status", "--once")  # without an id: every probe the broker holds
    assert every.returncode == 0 and f"probe {probe_id}" in every.stdout

    done = cli("probe", "cancel", probe_id, "--key", str(operator_key.private))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{a.host}  accepted" in done.stdout
    result = _wait_result(operator, probe_id, a.host, timeout_s=30)
    assert result.status == common_pb2.PROBE_STATUS_CANCELLED
    assert (a.machine.state_dir / "gpu0.events").read_text().splitlines()[-1].split()[1:] == ["U", "0", "0", "0"]
    results = cli("probe", "results", probe_id, "--json")
    assert results.returncode == 3  # a cancelled probe is not a success
    assert json.loads(results.stdout)["results"][0]["status"] == "cancelled"

    again = cli("probe", "cancel", probe_id, "--key", str(operator_key.private), "--wait", "2")
    assert again.returncode == 1
    assert "unknown_probe" in again.stdout or "no agent runs probe" in again.stdout


def test_fleet_shows_online_offline_and_lost_agents(fleet: Any, cli: Any, mqtt_broker: Any) -> None:
    cluster = f"c-{time.time_ns()}"
    online = fleet.agent(mqtt_broker.url, extra_args=["--cluster", cluster], gpus=2)
    stopped = fleet.agent(mqtt_broker.url, extra_args=["--cluster", cluster])
    killed = fleet.agent(mqtt_broker.url, extra_args=["--cluster", cluster], gpus=0)
    assert stopped.stop(signal.SIGTERM) == 0
    killed.stop(signal.SIGKILL)
    expected = {online.host: "online", stopped.host: "offline", killed.host: "lost"}

    def listed() -> dict[str, Any]:
        done = cli("fleet", "--json")
        assert done.returncode == 0, done.stderr
        return {a["host"]: a for a in json.loads(done.stdout) if a["cluster"] == cluster}

    def states_of(agents: dict[str, Any]) -> dict[str, str]:
        return {host: a["state"] for host, a in agents.items()}

    def as_expected() -> dict[str, Any] | None:
        agents = listed()
        return agents if states_of(agents) == expected else None

    # the stopped agent said it went offline; the killed one is lost once its presence is overdue
    agents = support.wait_until(
        as_expected,
        20,
        f"the fleet to list {expected}",
        interval_s=0.5,
        describe=lambda: states_of(listed()),
    )
    assert [g["name"] for g in agents[online.host]["gpus"]] == ["NVIDIA L4", "NVIDIA L4"]
    assert agents[killed.host]["gpus"] == []
    assert "idle" in agents[online.host]["workloads"] and "resnet50" in agents[online.host]["workloads"]
    assert agents[online.host]["last_seen_age_s"] < 5
    table = cli("fleet").stdout
    row = next(line for line in table.splitlines() if line.startswith(online.host))
    assert "online" in row and "2x NVIDIA L4" in row


def test_a_node_without_gpus_runs_the_probe_on_the_cpu_without_energy_figures(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any, mqtt_broker: Any
) -> None:
    agent = fleet.agent(mqtt_broker.url, gpus=0)
    command = make_start(hosts=[agent.host], workload="matmul-burn", duration_s=1.5, phases_s=0.2)
    (reply,) = operator.send(signing.sign(command, keys.load_private(operator_key.private)), command, {agent.host})
    assert reply.accepted and "on the CPU" in reply.message
    result = _wait_result(operator, command.probe_start.probe_id, agent.host)
    assert result.status == common_pb2.PROBE_STATUS_SUCCEEDED, result.message
    assert result.total.samples_per_s > 0 and result.total.samples > 0 and result.batch_size == 64
    assert not result.total.HasField("energy_j") and not result.total.HasField("mean_power_w")
    assert list(result.gpus) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "0"], "--duration S is required and must be positive"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--probe-id", "a/b"], "probe id 'a/b'"),
        (["--nodes", "colour=red"], "unknown key 'colour'"),
        (["--start-in", "10m"], "must be longer than --start-in"),
    ],
)
def test_the_cli_checks_its_arguments_before_sending_anything(
    args: list[str], message: str, operator_key: Any, cli: Any
) -> None:
    done = cli("probe", "start", "--workload", "idle", "--duration", "5", "--key", str(operator_key.private), *args)
    assert done.returncode == 2 and message in done.stderr
    missing_key = cli("probe", "start", "--workload", "idle", "--duration", "5")
    assert missing_key.returncode == 2 and "--key FILE is required" in missing_key.stderr


def test_a_selector_that_matches_no_online_agent_is_refused_before_anything_is_sent(
    fleet: Any, operator_key: Any, cli: Any, mqtt_broker: Any
) -> None:
    agent = fleet.agent(mqtt_broker.url, extra_args=["--cluster", "c-alpha"])
    started = time.monotonic()
    done = cli("probe", "start", "--workload", "idle", "--duration", "5", "--nodes", "cluster=c-beta",
               "--key", str(operator_key.private), "--wait", "30")  # fmt: skip
    assert done.returncode == 1 and time.monotonic() - started < 20, done.stderr  # not after --wait
    assert "no online agent matches --nodes cluster=c-beta, so nothing was sent" in done.stderr
    assert f"online: {agent.host}" in done.stderr and done.stdout == ""
    excluded = cli("probe", "start", "--workload", "idle", "--duration", "5", "--nodes", f"{agent.host},cluster=c-beta",
                   "--key", str(operator_key.private))  # fmt: skip
    assert excluded.returncode == 1 and f"({agent.host}: named, but another term excludes it)" in excluded.stderr
    assert "accepted command" not in agent.log() and "not_selected" not in agent.log()


def test_gpu_indices_the_node_does_not_have_are_refused(
    fleet: Any, operator_key: Any, cli: Any, mqtt_broker: Any
) -> None:
    agent = fleet.agent(mqtt_broker.url, gpus=2)
    done = cli("probe", "start", "--workload", "idle", "--duration", "5", "--gpus", "1,5", "--nodes", agent.host,
               "--key", str(operator_key.private), "--wait", "3")  # fmt: skip
    assert done.returncode == 1
    row = next(line for line in done.stdout.splitlines() if line.startswith(agent.host))
    assert "refused  invalid_argument" in row and "GPU(s) [5] do not exist here (2 GPU(s))" in row
