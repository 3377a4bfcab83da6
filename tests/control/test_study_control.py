"""A study on real control agents over a real broker: power limits per point, refusals, and the
restore guarantee (after the study, after a cancel, and at the next start after ``kill -9``).

The agents run on simulated L4s (power limit range 40-72 W, default 72 W). What the agent set is read
from the simulated machine's own input history (``gpu0.events``: one ``L <mW>`` line per accepted
``nvmlDeviceSetPowerManagementLimit``), so the checks see exactly what reached NVML and when.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import support

from gpuprobe.control import keys, signing, topics
from gpuprobe.v1 import common_pb2, control_pb2

# setting a power limit needs root (the agent's privilege check and the simulator's NVML alike)
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setting GPU power limits needs root")

L4_DEFAULT_MW = 72000
L4_MAX_W = 72.0


def limit_events(agent: Any) -> list[tuple[int, int]]:
    """(unix ns, mW) of every power limit NVML accepted on the agent's simulated GPU 0."""
    lines = (agent.machine.state_dir / "gpu0.events").read_text().splitlines()
    return [(int(t), int(v)) for t, kind, v, *_ in (line.split() for line in lines) if kind == "L"]


def study_command(
    make_start: Callable[..., control_pb2.Command],
    host: str,
    limits: list[str],
    *,
    duration_s: float = 1.5,
    warmup_s: float = 1.5,
) -> control_pb2.Command:
    """A study of the idle workload (no torch: the test is about the control plane) with one point per limit."""
    command = make_start(hosts=[host], duration_s=duration_s, phases_s=0.5, probe_id=f"s-{uuid.uuid4().hex[:8]}")
    start = command.probe_start
    start.warmup_s = warmup_s
    for label in limits:
        point = start.points.add(workload="idle", batch_size=1)
        if label.endswith("%"):
            point.power_limit.percent_of_max = float(label[:-1])
        elif label.endswith("W"):
            point.power_limit.watts = float(label[:-1])
    return command


def send(operator: Any, operator_key: Any, command: control_pb2.Command, host: str) -> control_pb2.CommandReply:
    signed = signing.sign(command, keys.load_private(operator_key.private))
    (reply,) = operator.send(signed, command, {host}, wait_s=10)
    return reply


def wait_result(operator: Any, probe_id: str, host: str, timeout_s: float = 60) -> control_pb2.ProbeResult:
    def result() -> control_pb2.ProbeResult | None:
        for got in operator.retained(topics.results(probe_id, host)):
            return control_pb2.ProbeResult.FromString(got.payload)
        return None

    return support.wait_until(result, timeout_s, f"the result of {probe_id} from {host}", interval_s=0.5)


def test_each_point_runs_at_its_limit_and_the_limit_is_restored(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any
) -> None:
    agent = fleet.agent(operator.broker_url, extra_args=["--allow-power-limits"])
    command = study_command(make_start, agent.host, ["60%", "50%", "default", "45W", "100%"])
    reply = send(operator, operator_key, command, agent.host)
    assert reply.accepted, reply
    # the out-of-range point is refused when the study is accepted, not when it is reached
    assert "1 point(s) refused here" in reply.message and "36 W" in reply.message, reply.message

    result = wait_result(operator, command.probe_start.probe_id, agent.host)
    assert result.status == common_pb2.PROBE_STATUS_SUCCEEDED, result.message
    points = {p.index: p for p in result.points}
    assert [points[i].power_limit for i in range(5)] == ["60%", "50%", "", "45W", "100%"]
    assert points[1].refused and "36 W" in points[1].refused and "40" in points[1].refused, points[1].refused
    for i in (0, 2, 3, 4):
        assert not points[i].refused, points[i]
        assert points[i].total.HasField("mean_power_w")

    events = limit_events(agent)
    # 60 % of the L4's 72 W maximum; the refused point changes nothing; the `default` point runs at the
    # GPU's own limit again (set back after the 60 % point); 45 W; 100 %; and finally the restore
    assert [mw for _, mw in events] == [43200, L4_DEFAULT_MW, 45000, 72000, L4_DEFAULT_MW], events
    assert not (agent.control_dir / "power-limits.json").exists()
    assert "restored" in agent.log()


def test_limits_are_refused_unless_the_agent_allows_them(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any
) -> None:
    agent = fleet.agent(operator.broker_url)  # no --allow-power-limits: the default
    command = study_command(make_start, agent.host, ["60%", "default"])
    reply = send(operator, operator_key, command, agent.host)
    assert reply.accepted, reply

    result = wait_result(operator, command.probe_start.probe_id, agent.host)
    refused, ran = result.points
    assert "allow-power-limits" in refused.refused, refused.refused
    assert not ran.refused and ran.total.HasField("mean_power_w")
    assert limit_events(agent) == []  # nothing reached NVML


def test_a_cancelled_study_restores_the_limit(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any, cli: Any
) -> None:
    agent = fleet.agent(operator.broker_url, extra_args=["--allow-power-limits"])
    command = study_command(make_start, agent.host, ["60%", "80%"], duration_s=60)
    assert send(operator, operator_key, command, agent.host).accepted
    support.wait_until(lambda: limit_events(agent), 30, "the first point's limit")

    probe_id = command.probe_start.probe_id
    cancelled = cli("probe", "cancel", probe_id, "--key", str(operator_key.private))
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    result = wait_result(operator, probe_id, agent.host)
    assert result.status == common_pb2.PROBE_STATUS_CANCELLED
    assert [mw for _, mw in limit_events(agent)] == [43200, L4_DEFAULT_MW]


def test_a_killed_agent_restores_the_limit_when_it_starts_again(
    fleet: Any, operator: Any, operator_key: Any, make_start: Any
) -> None:
    agent = fleet.agent(operator.broker_url, extra_args=["--allow-power-limits"])
    command = study_command(make_start, agent.host, ["60%"], duration_s=120)
    assert send(operator, operator_key, command, agent.host).accepted
    support.wait_until(lambda: limit_events(agent), 30, "the point's limit")
    saved = agent.control_dir / "power-limits.json"
    assert saved.exists()
    assert "72" in json.dumps(json.loads(saved.read_text()))  # the original limit, kept before the change

    assert agent.stop(signal.SIGKILL) == -signal.SIGKILL
    assert [mw for _, mw in limit_events(agent)] == [43200]  # nobody restored it: the agent died
    agent.start()
    support.wait_until(
        lambda: [mw for _, mw in limit_events(agent)] == [43200, L4_DEFAULT_MW], 30, "the restore at start"
    )
    assert not saved.exists()


def test_malformed_limits_refuse_the_whole_study(fleet: Any, operator: Any, operator_key: Any, make_start: Any) -> None:
    agent = fleet.agent(operator.broker_url, extra_args=["--allow-power-limits"])
    command = study_command(make_start, agent.host, ["default"])
    command.probe_start.points[0].power_limit.percent_of_max = 150.0
    reply = send(operator, operator_key, command, agent.host)
    assert not reply.accepted and reply.reason == control_pb2.REFUSAL_REASON_INVALID_ARGUMENT
    assert "point 0" in reply.message and "100" in reply.message, reply.message
    assert limit_events(agent) == []
