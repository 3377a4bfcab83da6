"""GPU sampling: lost GPUs, unsupported fields, the sampling rate and the agent's own counters."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import AgentFactory, Receiver, machine, unique_batches, wait_for_batches
from support import clean_env, gpuprobe_command, stays, wait_until

from gpuprobe.sim import state
from gpuprobe.sim.profiles import PROFILES, WORKLOAD_ACTIVITY, with_overrides
from gpuprobe.sim.runner import SimMachine, open_machine
from gpuprobe.v1 import telemetry_pb2


def test_a_lost_gpu_is_reported_and_the_others_keep_being_sampled(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["H100-SXM5-80GB"] * 3)
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")
    wait_for_batches(receiver, lambda got: len(got) >= 1, "the first batch", agent=agent)
    lost_at = state.set_failed(sim.state_dir, 1, True)
    agent.wait_for_log(r"GPU 1 \(NVIDIA H100 80GB HBM3, GPU-[0-9a-f-]+\) is lost \(.*GPU_IS_LOST\)")
    # lost for a while: the agent tries the GPU again once a second (lost_retry_s), and neither those
    # tries nor the ticks log it again
    once = "the loss logged once, the agent running"
    stays(lambda: agent.running() and agent.log().count("is lost") == 1, 2.5, once, describe=agent.log)
    back_at = state.set_failed(sim.state_dir, 1, False)
    agent.wait_for_log("GPU 1 .* answers again")
    resumed = "a sample of GPU 1 after it came back"
    wait_for_batches(
        receiver,
        lambda got: any(s.gpu_index == 1 and s.time_unix_ns > back_at for b in got.values() for s in b.gpu_samples),
        resumed,
        agent=agent,
    )
    assert agent.terminate() == 0
    log = agent.log()
    assert log.count("is lost") == 1, "logged once, not once per tick"

    batches = unique_batches(receiver.batches())
    times: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for b in batches.values():
        for s in b.gpu_samples:
            times[s.gpu_index].append(s.time_unix_ns)
    period_ns = 100_000_000
    for healthy in (0, 2):
        t = sorted(times[healthy])
        outage = [x for x in t if lost_at < x < back_at]
        assert len(outage) >= (back_at - lost_at) / period_ns - 3, f"GPU {healthy} kept its 10 Hz while GPU 1 was lost"
        assert max(b - a for a, b in itertools.pairwise(t)) < 2.5 * period_ns
    during = [x for x in times[1] if lost_at + 2 * period_ns < x < back_at]
    assert during == [], "no samples (and no zeros) from the lost GPU"
    assert any(x > back_at for x in times[1]), "sampling resumed when it came back"
    assert sum(b.stats.read_errors for b in batches.values()) >= 1, "the failure is counted in AgentStats"


def test_sampling_at_50_hz_and_the_prometheus_counters(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["RTX-4090", "A100-SXM4-80GB"])
    agent = agent_factory(sim, [receiver.address], "--interval", "0.02", "--metrics-listen", "127.0.0.1:0")
    agent.wait_for_log("streaming to collector")

    def sampled_and_acked() -> dict[str, float]:
        metrics = agent.metrics()
        taken, acked = metrics["gpuprobe_agent_samples_taken_total"], metrics["gpuprobe_agent_samples_acked_total"]
        return metrics if taken > 200 and acked > 0 else {}

    metrics = wait_until(sampled_and_acked, 20, "200 samples taken and some acked", interval_s=0.2)
    assert metrics["gpuprobe_agent_samples_taken_total"] > 200
    assert metrics["gpuprobe_agent_samples_acked_total"] > 0
    assert metrics["gpuprobe_agent_samples_sent_total"] >= metrics["gpuprobe_agent_samples_acked_total"]
    assert metrics["gpuprobe_agent_connected"] == 1
    for name in (
        "samples_spooled_total",
        "samples_dropped_total",
        "spool_bytes",
        "reconnects_total",
        "read_errors_total",
    ):
        assert f"gpuprobe_agent_{name}" in metrics
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    for gpu in (0, 1):
        t = sorted(s.time_unix_ns for b in batches.values() for s in b.gpu_samples if s.gpu_index == gpu)
        rate = (len(t) - 1) / ((t[-1] - t[0]) / 1e9)
        assert 45 <= rate <= 51, f"GPU {gpu} sampled at {rate:.1f} Hz"
    # at 50 Hz batches fill to more than 100 samples within the flush interval
    assert max(len(b.gpu_samples) for b in batches.values()) >= 100
    # unsupported fields are absent: no memory temperature on the 4090, no fans on the A100
    for b in batches.values():
        for s in b.gpu_samples:
            assert s.HasField("mem_temp_c") == (s.gpu_index == 1)
            assert s.HasField("fan_pct") == (s.gpu_index == 0)
    assert "GPU 0 (NVIDIA GeForce RTX 4090" in agent.log() and "mem_temp_c is not supported" in agent.log()


def run_agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*gpuprobe_command(), "agent", *args], env=clean_env(), capture_output=True, text=True, timeout=60
    )


def test_bad_configuration_fails_fast_with_a_message_naming_the_option(tmp_path: Path) -> None:
    for args, message in [
        ([], "no collector"),
        (["--collector", "c:1", "--interval", "0.01"], "--interval must be between 0.02 s (50 Hz)"),
        (["--collector", "c:99999"], "--collector: not HOST:PORT"),
        (["--collector", "fe80::1"], "--collector: write an IPv6 address in brackets"),
        (["--collector", "c:1", "--broker", "mqtt://b"], "--trusted-keys is required"),
        (
            ["--collector", "c:1", "--broker", "ftp://b", "--trusted-keys", "k"],
            "the scheme must be mqtt:// or mqtts://",
        ),
        (["--collector", "c:1", "--broker", "mqtt://b", "--trusted-keys", "/nonexistent.pub"], "/nonexistent.pub"),
        (["--collector", "c:1", "--host", "a/b"], "--host 'a/b' must be non-empty and contain none of"),
        (["--collector", "c:1", "--tls-cert", "/nonexistent"], "mutual TLS needs both --tls-cert and --tls-key"),
        (["--collector", "c:1", "--batch-max-samples", "10"], "at least 100"),
    ]:
        done = run_agent("--spool", str(tmp_path / "spool"), *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)


def test_check_prints_the_effective_settings_from_flags_environment_and_file(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\ncollector = ["from-file:1"]\ncluster = "file-cluster"\ninterval = 0.05\n')
    done = subprocess.run(
        [*gpuprobe_command(), "--config", str(config), "agent", "--check", "--interval", "0.2"],
        env={**clean_env(), "GPUPROBE_CLUSTER": "env-cluster"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "from-file:1" in done.stdout
    assert "cluster=env-cluster" in done.stdout, "the environment wins over the file"
    assert "every 0.2 s (5 Hz)" in done.stdout, "the flag wins over the file"
    assert "control plane    off" in done.stdout and "trainer socket   off" in done.stdout


def test_a_collector_without_a_port_is_the_collectors_default_port_7447(tmp_path: Path) -> None:
    done = run_agent("--spool", str(tmp_path / "spool"), "--check", "--collector", "a,b:9000,[::1]")
    assert done.returncode == 0, done.stderr
    assert "collector        a:7447, b:9000, [::1]:7447" in done.stdout


def test_with_a_broker_the_trainer_socket_and_control_dir_default_to_the_spool(tmp_path: Path) -> None:
    from gpuprobe.control import keys

    made = keys.generate(tmp_path / "keys", "operator")
    spool = tmp_path / "spool"
    done = run_agent(
        "--spool", str(spool), "--check", "--collector", "c", "--broker", "mqtt://broker.example:1884",
        "--trusted-keys", str(made.public), "--host", "n1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"trainer socket   {spool / 'trainer.sock'}" in done.stdout
    assert f"control plane    broker mqtt://broker.example:1884; trusted keys {made.key_id};" in done.stdout
    assert f"control dir {spool / 'control'}" in done.stdout
    # an explicit socket and control directory win; the MQTT reconnect pauses have their own names
    done = run_agent(
        "--spool", str(spool), "--check", "--collector", "c", "--broker", "mqtt://b", "--trusted-keys",
        str(made.public), "--trainer-socket", str(tmp_path / "t.sock"), "--control-dir", str(tmp_path / "ctl"),
        "--mqtt-reconnect-max", "5", "--mqtt-auth-retry", "10", "--reconnect-max", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"trainer socket   {tmp_path / 't.sock'}" in done.stdout and f"control dir {tmp_path / 'ctl'}" in done.stdout


def test_spool_directory_in_use_is_refused(tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory) -> None:
    sim = machine(tmp_path / "sim", ["L4"])
    first = agent_factory(sim, [receiver.address])
    first.wait_for_log("streaming to collector")
    second = agent_factory(sim, [receiver.address])
    assert second.proc is not None and second.proc.wait(30) == 1
    assert "is in use by another agent" in second.log()
    assert first.terminate() == 0


def test_without_a_native_sampler_the_agent_exits_2_naming_the_command_that_builds_it(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    """GPUs but no native sampler to read them (GPUPROBE_SAMPLER_LIB_DIR names a folder without it): the
    agent says so, names the build command and exits 2, rather than sample the GPUs some slower way."""
    sim = machine(tmp_path / "sim", ["L4"])
    empty = tmp_path / "no-sampler"
    empty.mkdir()
    agent = agent_factory(sim, [receiver.address], env={"GPUPROBE_SAMPLER_LIB_DIR": str(empty)})
    assert agent.proc is not None and agent.proc.wait(30) == 2
    assert "native GPU sampler" in agent.log() and "python -m gpuprobe.nvml.native" in agent.log()


def test_without_nvml_the_agent_samples_the_host_with_its_hwmon_sensors(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    # an hwmon tree in sysfs's format: one labelled and one unlabelled sensor, and one that fails to read
    chip = tmp_path / "hwmon" / "hwmon0"
    chip.mkdir(parents=True)
    (chip / "name").write_text("coretemp\n")
    (chip / "temp1_input").write_text("45000\n")
    (chip / "temp1_label").write_text("Package id 0\n")
    (chip / "temp2_input").write_text("38500\n")
    (chip / "temp3_input").write_text("garbage\n")
    agent = agent_factory(None, [receiver.address], "--hwmon-dir", str(tmp_path / "hwmon"))  # no simulated GPUs
    agent.wait_for_log("NVML is not available")
    agent.wait_for_log("streaming to collector")
    two = "2 host samples"
    wait_for_batches(receiver, lambda got: sum(len(b.node_samples) for b in got.values()) >= 2, two, agent=agent)
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    nodes = [s for b in batches.values() for s in b.node_samples]
    assert len(nodes) >= 2 and not any(b.gpu_samples for b in batches.values())
    for n in nodes:
        assert 0 <= n.cpu_pct <= 100 and 0 < n.mem_used_bytes < n.mem_total_bytes and n.load1 >= 0
        assert dict(n.hwmon_temp_c) == {"coretemp_package_id_0": 45.0, "coretemp_temp2": 38.5}
    assert receiver.hellos()[0].gpus == []


def test_field_values_unpacked_in_one_go_read_as_pynvml_reads_them() -> None:
    """The NVLink fields (throughput per link, error totals) are unpacked from the raw array in one call,
    not field by field, and the native sampler hands each field's 8 raw bytes; every NVML value type must
    come out as pynvml's own union member gives it (a driver may answer a field in another type than the
    simulator)."""
    import ctypes

    import pynvml

    from gpuprobe.nvml.sensor import _FIELD_VALUE, _plain, _raw_value, _unpacked_int

    assert _FIELD_VALUE.size == ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
    cases = [  # valueType, union member, value
        (0, "dVal", 12345.75),
        (1, "uiVal", 4_000_000_000),
        (2, "ulVal", 2**40 + 5),
        (3, "ullVal", 2**63 + 7),
        (4, "sllVal", -5),
        (5, "siVal", -7),
        (6, "usVal", 65_000),
    ]
    array = (_plain(pynvml.c_nvmlFieldValue_t) * len(cases))()
    for i, (value_type, member, value) in enumerate(cases):
        ctypes.memset(ctypes.byref(array[i].value), 0xAB, 8)  # bytes a narrower member leaves untouched
        array[i].valueType = value_type
        setattr(array[i].value, member, value)
    unpacked = [_unpacked_int(f) for f in _FIELD_VALUE.iter_unpack(bytes(array))]
    members = [getattr(array[i].value, member) for i, (_, member, _) in enumerate(cases)]
    assert [_raw_value(vt, int(array[i].value.ullVal)) for i, (vt, _, _) in enumerate(cases)] == members
    assert unpacked == [int(m) for m in members]
    assert unpacked == [12345, 4_000_000_000, 2**40 + 5, 2**63 + 7, -5, -7, 65_000]


@pytest.mark.slow  # a minute of samples, started early beside the other worker
def test_an_unprivileged_agent_on_a_mig_h100_streams_10_hz_without_counting_errors(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    """nvml.h on a MIG-enabled GPU: its memory and process lists answer NO_PERMISSION to a caller without
    privileges (the agent ships unprivileged), utilization, encoder/decoder, samples, remapped rows and process
    utilization NOT_SUPPORTED. The simulator answers so to a uid outside its admin_uids (here: this test's
    own). The agent leaves each such read out once (logged once), reads the memory per MIG instance, and
    samples at 10 Hz on its fast path with a read-error counter that stays at 0 for 60 s: a read counted
    per tick or per health interval would show within seconds, a refused read retried once a minute (a
    MIG-mode check, say) only over the whole minute."""
    h100 = with_overrides(PROFILES["H100-SXM5-80GB"], {"mig_instances": "2"})
    sim = open_machine(tmp_path / "sim", [h100], 0.1, admin_uids=(os.geteuid() + 1,))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(180)"])
    try:
        _stream_unprivileged_mig(tmp_path, receiver, agent_factory, sim, holder.pid)
    finally:
        holder.kill()
        holder.wait(10)


def _stream_unprivileged_mig(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory, sim: SimMachine, holder_pid: int
) -> None:
    state.set_load(sim.state_dir, 0, 50, holder_pid, 1 << 30)
    agent = agent_factory(sim, [receiver.address])
    agent.wait_for_log("streaming to collector")
    first = wait_for_batches(receiver, lambda got: got if got else {}, "the first batch", agent=agent)
    start_ns = min(s.time_unix_ns for b in first.values() for s in b.gpu_samples)

    def ticks(batches: dict[int, telemetry_pb2.SampleBatch]) -> list[int]:
        return sorted(s.time_unix_ns for b in batches.values() for s in b.gpu_samples if s.time_unix_ns >= start_ns)

    wait_for_batches(receiver, lambda got: len(ticks(got)) >= 605, "60 s of samples after the first batch", 120, agent)
    assert agent.terminate() == 0
    batches = unique_batches(receiver.batches())
    times = ticks(batches)
    span_s = (times[-1] - times[0]) / 1e9
    assert len(times) >= 0.9 * span_s * 10, f"{len(times)} samples in {span_s:.1f} s: 10 Hz"
    assert sum(b.stats.read_errors for b in batches.values()) == 0, "no read error counted, per tick or at all"
    samples = [s for b in batches.values() for s in b.gpu_samples]
    assert all(s.HasField("power_w") and s.HasField("temp_c") and s.HasField("sm_clock_mhz") for s in samples)
    assert not any(s.HasField("mem_used_bytes") or s.HasField("util_pct") for s in samples), "no fake values"
    migs = [m for b in batches.values() for m in b.mig_samples]
    assert len({m.gpu_instance_id for m in migs}) == 2 and all(m.mem_total_bytes > 0 for m in migs)
    # GPM per GPU instance (nvmlGpmMigSampleGet, as DCGM reads a MIG GPU), also without privileges: the load's
    # process runs in the first instance (GI 7), at 50 % of the generic workload's SM ratio; the other is idle
    sm_ratio = WORKLOAD_ACTIVITY["generic"][0]
    by_gi = {gi: [m for m in migs if m.gpu_instance_id == gi and m.HasField("sm_active_pct")] for gi in (7, 8)}
    assert by_gi[7] and by_gi[8], "GPM from each instance's second health read on"
    assert all(m.sm_active_pct == pytest.approx(50 * sm_ratio, abs=0.5) for m in by_gi[7])
    assert all(m.sm_active_pct == 0.0 and m.HasField("tensor_active_pct") for m in by_gi[8])
    log = agent.log()
    assert log.count("mem_used_bytes may not be read by this user") == 1, "logged once"
    assert log.count("util_pct is not supported") == 1
    assert log.count("remapped_rows is not supported") == 1
    # the GPU's process list needs privileges; its MIG instances' lists do not
    assert log.count("processes may not be read by this user") == 1
    points = [p for b in batches.values() for p in b.process_samples if p.pid == holder_pid]
    assert points and points[0].used_memory_bytes == 1 << 30, "the process, from its MIG instance's list"
    assert not re.search(r"reading \w+ failed", log), "no read failure logged"


def test_an_agent_started_before_the_driver_samples_the_gpus_once_nvml_answers(
    tmp_path: Path, receiver: Receiver, agent_factory: AgentFactory
) -> None:
    sim = machine(tmp_path / "sim", ["L4"])
    conf, hidden = sim.state_dir / "sim.conf", sim.state_dir / "sim.conf.later"
    conf.rename(hidden)  # no sim.conf: nvmlInit answers DRIVER_NOT_LOADED, as at boot before the driver
    agent = agent_factory(sim, [receiver.address], "--nvml-retry", "0.5s")
    agent.wait_for_log(r"NVML is not available.*sampling the host and acoustics only")
    agent.wait_for_log("streaming to collector")
    pid = agent.pid
    hidden.rename(conf)  # the driver is loaded
    agent.wait_for_log(r"NVML answers now \(1 GPUs\): the agent starts again")
    agent.wait_for_log(r"agent \S+ \(gpuprobe [^)]*\): 1 GPUs")
    wait_for_batches(receiver, lambda got: any(b.gpu_samples for b in got.values()), "a GPU sample", agent=agent)
    assert agent.running() and agent.pid == pid, "the same process (systemd's main PID) samples the GPU"
    assert agent.terminate() == 0
