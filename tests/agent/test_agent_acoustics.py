"""Acoustics: a real capture device (ALSA's `file` plugin through PortAudio) and the proxy estimates."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from agent_helpers import AgentFactory, Receiver, machine, unique_batches, wait_for_batches

from gpuprobe.agent.sensors.acoustic import a_weighting_db
from gpuprobe.agent.sensors.proxy import ProxyParams, chassis_speed_pct, sum_db
from gpuprobe.control import keys
from gpuprobe.sim import state
from gpuprobe.v1 import telemetry_pb2

FS_HZ = 48000
AMPLITUDE = 0.5  # of full scale
# the offset that maps this tone's mean square to 94 dB: C = 94 - 10·log10(A²/2)
CALIBRATION_DB = 94.0 - 10 * math.log10(AMPLITUDE**2 / 2)

ALSA_CONF = """
pcm.filemic {{
    type file
    slave.pcm "null"
    file "/dev/null"
    infile "{infile}"
    format "raw"
}}
pcm.filemic_plug {{
    type plug
    slave {{ pcm "filemic" format S16_LE rate {fs} channels 1 }}
}}
pcm.!default {{
    type asym
    playback.pcm "null"
    capture.pcm "filemic_plug"
}}
"""


def capture_device(tmp_path: Path, tone_hz: float, seconds: float = 30.0) -> dict[str, str]:
    """An ALSA capture device that plays a tone; returns the environment that selects it."""
    t = np.arange(int(FS_HZ * seconds)) / FS_HZ
    pcm = np.round(AMPLITUDE * 32767 * np.sin(2 * np.pi * tone_hz * t)).astype("<i2")
    raw = tmp_path / f"tone-{tone_hz:g}.raw"
    raw.write_bytes(pcm.tobytes())
    conf = tmp_path / "asound.conf"
    conf.write_text(ALSA_CONF.format(infile=raw, fs=FS_HZ))
    return {"ALSA_CONFIG_PATH": f"/usr/share/alsa/alsa.conf:{conf}"}


def mic_levels(receiver: Receiver) -> list[telemetry_pb2.AcousticSample]:
    return [
        s
        for b in unique_batches(receiver.batches()).values()
        for s in b.acoustic_samples
        if s.source == telemetry_pb2.ACOUSTIC_SOURCE_MIC
    ]


@pytest.mark.parametrize(("tone_hz", "expected_db"), [(1000.0, 94.0), (100.0, 94.0 - 19.1)])
def test_microphone_reads_the_a_weighted_level_of_a_calibrated_tone(
    tone_hz: float, expected_db: float, tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    env = capture_device(tmp_path, tone_hz)
    sim = machine(tmp_path / "sim", ["L4"])
    agent = agent_factory(
        sim,
        [receiver.address],
        "--mic-device", "default", "--mic-calibration-db", f"{CALIBRATION_DB:.6f}",
        env=env,
    )  # fmt: skip
    agent.wait_for_log("microphone: 'default' at 48000 Hz")
    # the first window (the filters' start-up) and three steady ones
    wait_for_batches(receiver, lambda _: len(mic_levels(receiver)) >= 4, "4 one-second mic windows", agent=agent)
    assert agent.terminate() == 0
    levels = mic_levels(receiver)
    assert len(levels) >= 3, agent.log()
    steady = levels[1:]  # the first window holds the filters' start-up
    for s in steady:
        assert s.laeq_db == pytest.approx(expected_db, abs=0.5)
        assert s.laf_db == pytest.approx(expected_db, abs=0.5)
        assert not s.HasField("gpu_index") and not s.HasField("est_dba")
    # one window per second of wall time, not faster (the file device is paced)
    times = [s.time_unix_ns for s in levels]
    assert all(0.8e9 < b - a < 1.3e9 for a, b in itertools.pairwise(times))


def test_a_weighting_of_100_hz_is_19_1_db_below_1_khz() -> None:
    assert a_weighting_db(1000) == pytest.approx(0.0, abs=0.01)
    assert a_weighting_db(100) == pytest.approx(-19.1, abs=0.1)


def test_missing_microphone_logs_once_and_the_proxy_keeps_going(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["RTX-4090"])
    agent = agent_factory(sim, [receiver.address], "--mic-device", "no-such-microphone")
    agent.wait_for_log("streaming to collector")

    def proxy_seconds(batches: dict[int, telemetry_pb2.SampleBatch]) -> int:
        return len({s.time_unix_ns for b in batches.values() for s in b.acoustic_samples})

    wait_for_batches(receiver, lambda got: proxy_seconds(got) >= 2, "2 seconds of proxy estimates", agent=agent)
    assert agent.terminate() == 0
    log = agent.log()
    assert log.count("microphone disabled") == 1
    assert "cannot open input device 'no-such-microphone'" in log and "proxy only" in log
    proxies = [s for b in receiver.batches() for s in b.acoustic_samples]
    assert proxies and all(s.source == telemetry_pb2.ACOUSTIC_SOURCE_PROXY for s in proxies)


def test_proxy_follows_the_fan_law_on_fan_cooled_gpus_and_the_heat_on_passive_ones(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    # a fast thermal time constant so the 4090's fan ramps within seconds
    sim = machine(tmp_path / "sim", ["RTX-4090", "H100-SXM5-80GB"], tau_s=2.0)
    agent = agent_factory(
        sim, [receiver.address], "--proxy-fan-rated-dba", "50", "--proxy-floor-dba", "0", "--proxy-tdp-fraction", "0.8"
    )
    agent.wait_for_log("streaming to collector")

    def proxy_of(batches: dict[int, telemetry_pb2.SampleBatch]) -> list[telemetry_pb2.AcousticSample]:
        return [
            s for b in batches.values() for s in b.acoustic_samples if s.source == telemetry_pb2.ACOUSTIC_SOURCE_PROXY
        ]

    def per_gpu(batches: dict[int, telemetry_pb2.SampleBatch], index: int) -> list[telemetry_pb2.AcousticSample]:
        return [s for s in proxy_of(batches) if s.HasField("gpu_index") and s.gpu_index == index]

    # an idle estimate of both GPUs before the load
    idle = "an idle estimate of both GPUs"
    wait_for_batches(receiver, lambda got: per_gpu(got, 0) and per_gpu(got, 1), idle, agent=agent)
    state.set_load(sim.state_dir, 0, 100)
    state.set_load(sim.state_dir, 1, 100)

    def ramped(batches: dict[int, telemetry_pb2.SampleBatch]) -> bool:
        """The fan speeds behind GPU 0's estimates grew by 1.5 and GPU 1's and the node's TDP flags are on."""
        fan_of = {s.time_unix_ns: s.fan_pct for b in batches.values() for s in b.gpu_samples if s.gpu_index == 0}
        fans = [fan_of[e.time_unix_ns] for e in per_gpu(batches, 0) if e.time_unix_ns in fan_of]
        nodes = [s for s in proxy_of(batches) if not s.HasField("gpu_index")]
        flags = per_gpu(batches, 1)
        return (
            bool(fans and nodes and flags)
            and max(fans) / min(fans) >= 1.5
            and flags[-1].tdp_flag
            and nodes[-1].tdp_flag
        )

    wait_for_batches(receiver, ramped, "the fan ramped and the TDP flags on", timeout_s=30, agent=agent)
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    gpu = {(s.gpu_index, s.time_unix_ns): s for b in batches.values() for s in b.gpu_samples}
    proxy = proxy_of(batches)
    params = ProxyParams(fan_rated_dba=50, floor_dba=0, tdp_fraction=0.8)

    fan_points: list[tuple[float, float]] = []
    for est in proxy:
        if not est.HasField("gpu_index"):
            continue
        sample = gpu[(est.gpu_index, est.time_unix_ns)]  # the estimate comes from the GPU's sample of that tick
        if est.gpu_index == 0:
            source = 50 + 50 * math.log10(sample.fan_pct / 100)
            assert est.est_dba == pytest.approx(sum_db([source, 0.0]), abs=1e-9)
            fan_points.append((sample.fan_pct, est.est_dba))
            assert est.tdp_flag == (sample.power_w > 0.8 * 450)
        else:
            source = params.chassis_rated_dba + 50 * math.log10(chassis_speed_pct(sample.power_w, params) / 100)
            assert est.est_dba == pytest.approx(sum_db([source, 0.0]), abs=1e-9)
            assert est.tdp_flag == (sample.power_w > 0.8 * 700)
    low = min(fan_points)
    high = max(fan_points)
    assert high[0] / low[0] >= 1.5, f"the fan ramped ({low[0]} -> {high[0]} %)"
    # the estimate rises by 50·log10 of the fan-speed ratio (the floor at 0 dB adds < 0.03 dB)
    assert high[1] - low[1] == pytest.approx(50 * math.log10(high[0] / low[0]), abs=0.05)
    flags = [s.tdp_flag for s in proxy if s.HasField("gpu_index") and s.gpu_index == 1]
    assert flags[0] is False and flags[-1] is True, "the TDP flag turns on under load"
    nodes = [s for s in proxy if not s.HasField("gpu_index")]
    assert nodes and all(n.HasField("est_dba") for n in nodes)
    assert nodes[-1].tdp_flag is True


def test_an_early_exit_stops_the_microphone_it_had_started(tmp_path: Path, agent_factory: AgentFactory) -> None:
    env = capture_device(tmp_path, 1000.0)
    public_key = keys.generate(tmp_path / "keys").public
    (tmp_path / "not-a-directory").write_text("")
    agent = agent_factory(
        None,
        ["127.0.0.1:1"],
        "--mic-device", "default", "--mic-calibration-db", f"{CALIBRATION_DB:.6f}",
        "--broker", "mqtt://127.0.0.1:1", "--trusted-keys", str(public_key),
        "--control-dir", str(tmp_path / "not-a-directory" / "control"),  # the control plane cannot start
        env=env,
    )  # fmt: skip
    assert agent.proc is not None and agent.proc.wait(60) == 1
    log = agent.log()
    started = log.index("microphone: 'default' at 48000 Hz")
    failed = log.index("control directory")
    stopped = log.index("microphone 'default': capture stopped")
    assert started < failed < stopped, log
