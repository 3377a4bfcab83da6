"""GPU health through the real pynvml and the real `gpuprobe sim fail` / `sim load`: NVML events, ECC
counters, remapped rows and retired pages, NVLink, violation time, GPM, MIG, and the CLI's usage errors
(docs/simulator.md, "Health", "GPM", "MIG")."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pynvml
import pytest
from support import gpuprobe_command

from gpuprobe.sim import state
from gpuprobe.sim.profiles import PROFILES, WORKLOAD_ACTIVITY, WORKLOAD_IDS, with_overrides
from gpuprobe.sim.runner import open_machine

Sim = Any  # tests/sim/conftest.py's Sim helper (the `sim` fixture)

PERIOD_S = 0.05


def child(*parts: str) -> str:
    """A child snippet from parts each indented on its own (the helpers below, a test's body)."""
    return "\n".join(textwrap.dedent(part) for part in parts)


# Child helpers: the real CLI against the child's own machine (GPUPROBE_SIM_DIR is set in the child).
CLI_HELPERS = f"""
import ctypes
GPUPROBE = {gpuprobe_command()!r}

def sim_cli(*args):
    proc = subprocess.run(GPUPROBE + ["sim", *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout

def wait_event(es, timeout_ms):
    \"\"\"(device index, event type, event data, seconds waited) or None on NVML_ERROR_TIMEOUT.\"\"\"
    t0 = time.monotonic()
    try:
        e = N.nvmlEventSetWait_v2(es, timeout_ms)
    except N.NVMLError as err:
        assert err.value == N.NVML_ERROR_TIMEOUT, err
        return None
    # the device by its handle (GetIndex would answer GPU_IS_LOST after an XID 79)
    address = ctypes.cast(e.device, ctypes.c_void_p).value
    index = [ctypes.cast(h, ctypes.c_void_p).value for h in H].index(address)
    return [index, int(e.eventType), int(e.eventData), time.monotonic() - t0]

def plain(value):
    # a number from pynvml, which returns some as ctypes values
    return getattr(value, "value", value)

def err_name(call):
    try:
        return call()
    except N.NVMLError as err:
        return "err%d" % err.value
"""


def test_an_injected_xid_reaches_a_waiting_set_once_and_only_sets_registered_before_it(sim: Sim) -> None:
    machine = sim.machine("H100-SXM5-80GB", gpus=2, period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            """
        XID_DBE = N.nvmlEventTypeXidCriticalError | N.nvmlEventTypeDoubleBitEccError
        supported = [N.nvmlDeviceGetSupportedEventTypes(h) for h in H]
        es = N.nvmlEventSetCreate()
        for h in H:
            N.nvmlDeviceRegisterEvents(h, XID_DBE, es)
        nothing_yet = wait_event(es, 150)
        sim_cli("fail", "--gpu", "1", "--xid", "43")
        first = wait_event(es, 3000)
        again = wait_event(es, 300)
        late = N.nvmlEventSetCreate()  # registered after the event (an agent restarted since)
        N.nvmlDeviceRegisterEvents(H[1], XID_DBE, late)
        late_sees = wait_event(late, 300)
        sim_cli("fail", "--gpu", "1", "--recover")
        after_recovery = [wait_event(es, 300), wait_event(late, 100)]
        unsupported = err_name(lambda: N.nvmlDeviceRegisterEvents(H[0], N.nvmlEventTypePState, es))
        N.nvmlEventSetFree(es)
        N.nvmlEventSetFree(late)
        emit(dict(supported=supported, nothing_yet=nothing_yet, first=first, again=again, late_sees=late_sees,
                  after_recovery=after_recovery, unsupported=unsupported))
        """,
        ),
    )
    assert out["supported"] == [0x9B, 0x9B]  # XID, clock, power source, SBE, DBE
    assert out["nothing_yet"] is None
    index, event_type, data, waited_s = out["first"]
    assert (index, event_type, data) == (1, 0x8, 43)
    assert waited_s < 1.0, "seen within a few periods of the injection"
    assert out["again"] is None, "each event is delivered once per set"
    assert out["late_sees"] is None, "a set registered after an event does not get it"
    assert out["after_recovery"] == [None, None], "a reset is not an event and does not replay old ones"
    assert out["unsupported"] == "err3"


def test_an_idle_wait_sleeps_and_a_load_from_another_writer_still_arrives_within_a_period(sim: Sim) -> None:
    """The wait blocks as the driver's does, so an idle events thread costs nothing: it sleeps until a history
    is written (inotify) or the model's own next clock change, not tick by tick. A load written while it
    waits, or just before the set was registered (not yet read by anyone), still reaches it at the tick
    boundary where it takes effect."""
    machine = sim.machine("H100-SXM5-80GB", gpus=2, period_s=0.1)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            """
        import threading
        from gpuprobe.sim import state as sim_state
        settings = sim_state.load(sim_state.state_dir_from_env())

        def wakeups():
            for line in open("/proc/thread-self/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    return int(line.split()[1])

        es = N.nvmlEventSetCreate()
        for h in H:
            N.nvmlDeviceRegisterEvents(h, N.nvmlDeviceGetSupportedEventTypes(h), es)
        wait_ticks(H[0], 1)
        first = wait_event(es, 0)  # nothing has happened; the set looks once and returns
        before = wakeups()
        idle = wait_event(es, 2000)  # 20 periods of idle GPUs: no event
        idle_wakeups = wakeups() - before

        # a load written by another thread while the set waits: the clock change of the tick it takes effect in
        written = []
        timer = threading.Timer(0.35, lambda: written.append(set_load(1, 80)))
        timer.start()
        during = wait_event(es, 3000)
        received_ns = time.time_ns()
        timer.join()
        during_delay_s = (received_ns - settings.next_tick_ns(written[0])) / 1e9

        # a load written just after a tick boundary, before a new set is registered in the same tick
        wait_ticks(H[0], 1)
        t_load = set_load(0, 80)
        fresh = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(H[0], N.nvmlEventTypeClock, fresh)
        registered_in_tick = settings.next_tick_ns(time.time_ns()) == settings.next_tick_ns(t_load)
        before_registration = wait_event(fresh, 1000)
        N.nvmlEventSetFree(es)
        N.nvmlEventSetFree(fresh)
        emit(dict(first=first, idle=idle, idle_wakeups=idle_wakeups, during=during, during_delay_s=during_delay_s,
                  registered_in_tick=registered_in_tick, before_registration=before_registration))
        """,
        ),
    )
    assert out["first"] is None and out["idle"] is None
    # polling tick by tick would have woken 20 times
    assert out["idle_wakeups"] <= 3, out["idle_wakeups"]
    assert out["during"][:3] == [1, 0x10, 0], "GPU 1's clock left idle"
    assert 0 <= out["during_delay_s"] < 0.1, "delivered within the period after the boundary"
    if out["registered_in_tick"]:  # registered before the boundary at which the load takes effect
        assert out["before_registration"] is not None and out["before_registration"][:3] == [0, 0x10, 0]
        assert out["before_registration"][3] < 0.3


def test_xid_79_loses_the_gpu_right_after_its_event(sim: Sim, cli: Callable[..., CompletedProcess[str]]) -> None:
    machine = sim.machine("A100-SXM4-80GB", gpus=1, period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            """
        es = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(H[0], N.nvmlEventTypeXidCriticalError, es)
        before = err_name(lambda: N.nvmlDeviceGetTemperature(H[0], 0))
        sim_cli("fail", "--xid", "79")
        event = wait_event(es, 3000)
        lost = err_name(lambda: N.nvmlDeviceGetTemperature(H[0], 0))
        register_lost = err_name(lambda: N.nvmlDeviceRegisterEvents(H[0], N.nvmlEventTypeXidCriticalError, es))
        sim_cli("fail", "--recover")
        time.sleep(0.2)
        back = err_name(lambda: N.nvmlDeviceGetTemperature(H[0], 0))
        emit(dict(before=before, event=event, lost=lost, register_lost=register_lost, back=back))
        """,
        ),
    )
    assert isinstance(out["before"], int)
    # the event is delivered although the GPU is lost from the same tick on
    assert out["event"][:3] == [0, 0x8, 79]
    assert out["lost"] == "err15" and out["register_lost"] == "err15"  # NVML_ERROR_GPU_IS_LOST
    assert isinstance(out["back"], int)


ECC_READ = """
def ecc():
    h = H[0]
    out = {"counts": [N.nvmlDeviceGetTotalEccErrors(h, t, c) for t in (0, 1) for c in (0, 1)]}
    out["dram_unc_vol"] = N.nvmlDeviceGetMemoryErrorCounter(h, 1, 0, N.NVML_MEMORY_LOCATION_DRAM)
    out["l2_unc_vol"] = N.nvmlDeviceGetMemoryErrorCounter(h, 1, 0, N.NVML_MEMORY_LOCATION_L2_CACHE)
    out["rows"] = err_name(lambda: list(N.nvmlDeviceGetRemappedRows(h)))
    out["pages"] = err_name(lambda: N.nvmlDeviceGetRetiredPages(h, 1))
    out["pages_pending"] = err_name(lambda: N.nvmlDeviceGetRetiredPagesPendingStatus(h))
    return out

def events(es):
    got = []
    while True:
        e = wait_event(es, 250)
        if e is None:
            return got
        got.append(e[1:3])
"""


def test_ecc_counters_and_remap_flags_move_and_a_reset_clears_the_volatile_ones(sim: Sim) -> None:
    machine = sim.machine("H100-SXM5-80GB", gpus=1, period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            ECC_READ,
            """
        es = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(H[0], N.nvmlDeviceGetSupportedEventTypes(H[0]) & ~N.nvmlEventTypeClock, es)
        fresh = ecc()
        sim_cli("fail", "--ecc-sbe", "--ecc-dbe", "--remap-pending")
        seen = events(es)
        injected = ecc()
        sim_cli("fail", "--remap-failure")
        seen_failure = events(es)
        sim_cli("fail", "--recover")
        time.sleep(0.2)
        reset = ecc()
        emit(dict(fresh=fresh, seen=seen, injected=injected, seen_failure=seen_failure, reset=reset))
        """,
        ),
    )
    # counts: [corrected volatile, corrected aggregate, uncorrected volatile, uncorrected aggregate]
    assert out["fresh"]["counts"] == [0, 0, 0, 0]
    assert out["fresh"]["rows"] == [0, 0, 0, 0]
    assert out["fresh"]["pages"] == "err3" and out["fresh"]["pages_pending"] == "err3"  # Hopper remaps rows
    assert out["seen"] == [[0x1, 0], [0x2, 0], [0x8, 48], [0x8, 63]]
    assert out["injected"]["counts"] == [1, 1, 1, 1]
    assert out["injected"]["dram_unc_vol"] == 1 and out["injected"]["l2_unc_vol"] == 0
    assert out["injected"]["rows"] == [0, 1, 1, 0]  # corrRows, uncRows, isPending, failureOccurred
    assert out["seen_failure"] == [[0x8, 64]]
    # a reset: volatile counts and the pending flag cleared; aggregate, remapped rows and the failure stay
    assert out["reset"]["counts"] == [0, 1, 0, 1]
    assert out["reset"]["rows"] == [0, 1, 0, 1]


def test_older_parts_retire_pages_and_parts_without_ecc_answer_not_supported(
    sim: Sim, cli: Callable[..., CompletedProcess[str]]
) -> None:
    retiring = sim.machine("A100-SXM4-80GB", gpus=1, period_s=PERIOD_S, row_remapping=0)
    out = sim.run(
        retiring,
        child(
            CLI_HELPERS,
            ECC_READ,
            """
        sim_cli("fail", "--ecc-dbe")
        time.sleep(0.2)
        injected = ecc()
        sim_cli("fail", "--recover")
        time.sleep(0.2)
        emit(dict(injected=injected, reset=ecc()))
        """,
        ),
    )
    assert out["injected"]["counts"] == [0, 0, 1, 1]
    assert out["injected"]["rows"] == "err3"
    assert len(out["injected"]["pages"]) == 1 and out["injected"]["pages_pending"] == 1
    assert out["reset"]["pages"] == out["injected"]["pages"] and out["reset"]["pages_pending"] == 0

    geforce = sim.machine("RTX-4090", gpus=1, period_s=PERIOD_S)
    out = sim.run(
        geforce,
        child(
            CLI_HELPERS,
            """
        fan = N.nvmlDeviceGetFanSpeed(H[0])
        emit(dict(
            ecc=err_name(lambda: N.nvmlDeviceGetTotalEccErrors(H[0], 1, 1)),
            rows=err_name(lambda: N.nvmlDeviceGetRemappedRows(H[0])),
            supported=N.nvmlDeviceGetSupportedEventTypes(H[0]),
            rpm=N.nvmlDeviceGetFanSpeedRPM(H[0]), fan=fan,
            gpm=err_name(lambda: N.nvmlGpmQueryDeviceSupport(H[0]).isSupportedDevice),
        ))
        """,
        ),
    )
    assert out["ecc"] == "err3" and out["rows"] == "err3" and out["gpm"] == "err3"
    assert out["supported"] == 0x98  # no ECC events
    assert abs(out["rpm"] - out["fan"] * 30) <= 15  # 3000 RPM at 100 %
    result = cli("sim", "fail", "--ecc-dbe", "--state-dir", str(geforce.state_dir))
    assert result.returncode == 2 and "has no ECC" in result.stderr
    assert (geforce.state_dir / "gpu0.events").read_text() == ""


GPM_READ = """
IDS = [N.NVML_GPM_METRIC_SM_UTIL, N.NVML_GPM_METRIC_SM_OCCUPANCY, N.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
       N.NVML_GPM_METRIC_DRAM_BW_UTIL, N.NVML_GPM_METRIC_FP16_UTIL, N.NVML_GPM_METRIC_FP32_UTIL,
       N.NVML_GPM_METRIC_FP64_UTIL]

def gpm_over(handles, seconds):
    \"\"\"{index: {metric id: value}} averaged over `seconds`, from two samples per GPU.\"\"\"
    first = {i: N.nvmlGpmSampleGet(H[i], N.nvmlGpmSampleAlloc()) for i in handles}
    time.sleep(seconds)
    out = {}
    for i in handles:
        second = N.nvmlGpmSampleGet(H[i], N.nvmlGpmSampleAlloc())
        mg = N.c_nvmlGpmMetricsGet_t()
        mg.version = N.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(IDS)
        mg.sample1, mg.sample2 = first[i], second
        for k, m in enumerate(IDS):
            mg.metrics[k].metricId = m
        N.nvmlGpmMetricsGet(mg)
        assert all(mg.metrics[k].nvmlReturn == 0 for k in range(len(IDS)))
        out[i] = {str(mg.metrics[k].metricId): mg.metrics[k].value for k in range(len(IDS))}
        N.nvmlGpmSampleFree(first[i])
        N.nvmlGpmSampleFree(second)
    return out
"""


def test_gpm_on_hopper_only_with_activity_that_follows_the_workload(sim: Sim) -> None:
    profiles = [PROFILES[n] for n in ("H100-SXM5-80GB", "H200-SXM-141GB", "A100-SXM4-80GB", "L4")]
    machine = sim.machine(profiles, period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            GPM_READ,
            """
        support = [err_name(lambda: N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice) for h in H]
        sample_on_a100 = err_name(lambda: N.nvmlGpmSampleGet(H[2], N.nvmlGpmSampleAlloc()))
        idle = gpm_over([0, 1], 0.2)
        me = os.getpid()
        sim_cli("load", "--gpu", "0", "--util", "100", "--workload", "matmul-burn", "--pid", str(me),
                "--mem-used-bytes", str(8 << 30))
        sim_cli("load", "--gpu", "1", "--util", "90", "--workload", "resnet50")
        time.sleep(0.2)
        loaded = gpm_over([0, 1], 0.5)
        util = [N.nvmlDeviceGetUtilizationRates(H[i]).gpu for i in (0, 1)]
        procs = [(p.pid, p.usedGpuMemory) for p in N.nvmlDeviceGetComputeRunningProcesses(H[0])]
        putil = [(s.pid, s.smUtil) for s in N.nvmlDeviceGetProcessUtilization(H[0], 0)]
        emit(dict(support=support, sample_on_a100=sample_on_a100, idle=idle, loaded=loaded, util=util,
                  procs=procs, putil=putil, me=me))
        """,
        ),
    )
    assert out["support"] == [1, 1, "err3", "err3"]
    assert out["sample_on_a100"] == "err3"
    sm, tensor, dram = "2", "5", "10"
    for values in out["idle"].values():
        assert all(v == 0.0 for v in values.values())
    matmul, resnet = out["loaded"]["0"], out["loaded"]["1"]
    assert out["util"] == [100, 90]
    assert matmul[tensor] > 85 and resnet[tensor] < 40
    assert matmul[tensor] > resnet[tensor] + 40
    assert resnet[dram] > matmul[dram]  # convolutions move more activations than GEMMs
    assert matmul[sm] <= 100 and resnet[sm] <= 90  # SM activity never above the utilization
    assert matmul[sm] == pytest.approx(98.0, abs=0.5)  # 100 % x the table's 0.98: a mean over whole ticks
    # the load's pid, memory and utilization in the process queries
    assert out["procs"] == [[out["me"], 8 << 30]]
    assert out["putil"] == [[out["me"], 100]]


def test_gpm_per_mig_instance_follows_the_process_placement(sim: Sim) -> None:
    """nvmlGpmMigSampleGet (what DCGM samples each GPU instance with) answers per GPU instance: the load's
    process runs in the first instance (GI 7, as the process lists say), which is as active as the load; the
    other instances are idle. nvmlGpmSampleGet on a MIG device handle gives the same ("supports the device
    handle and MIG device handle", nvml.h); samples of two instances do not make a metric."""
    mig = with_overrides(PROFILES["H100-SXM5-80GB"], {"mig_instances": "3"})
    machine = sim.machine([mig, PROFILES["H100-SXM5-80GB"]], period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            GPM_READ,
            """
        def metrics(a, b):
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version = N.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(IDS)
            mg.sample1, mg.sample2 = a, b
            for k, m in enumerate(IDS):
                mg.metrics[k].metricId = m
            N.nvmlGpmMetricsGet(mg)
            return {str(mg.metrics[k].metricId): mg.metrics[k].value for k in range(len(IDS))}

        sim_cli("load", "--gpu", "0", "--util", "100", "--workload", "gpt")
        time.sleep(0.2)
        gis = (7, 8, 9)
        migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(H[0], i) for i in range(3)]
        first = {gi: N.nvmlGpmMigSampleGet(H[0], gi, N.nvmlGpmSampleAlloc()) for gi in gis}
        on_handle = N.nvmlGpmSampleGet(migs[1], N.nvmlGpmSampleAlloc())
        time.sleep(0.5)
        second = {gi: N.nvmlGpmMigSampleGet(H[0], gi, N.nvmlGpmSampleAlloc()) for gi in gis}
        by_gi = {gi: metrics(first[gi], second[gi]) for gi in gis}
        handle_first = N.nvmlGpmSampleGet(migs[0], N.nvmlGpmSampleAlloc())
        time.sleep(0.2)
        by_handle = metrics(handle_first, N.nvmlGpmSampleGet(migs[0], N.nvmlGpmSampleAlloc()))
        mixed = err_name(lambda: metrics(first[7], second[8]))
        unknown = err_name(lambda: N.nvmlGpmMigSampleGet(H[0], 10, N.nvmlGpmSampleAlloc()))
        mig_off = err_name(lambda: N.nvmlGpmMigSampleGet(H[1], 7, N.nvmlGpmSampleAlloc()))
        whole = gpm_over([0], 0.2)[0]
        emit(dict(by_gi=by_gi, by_handle=by_handle, mixed=mixed, unknown=unknown, mig_off=mig_off, whole=whole))
        """,
        ),
    )
    sm, tensor = "2", "5"
    gpt_sm, _, gpt_tensor, *_ = WORKLOAD_ACTIVITY["gpt"]
    assert out["by_gi"]["7"][sm] == pytest.approx(100 * gpt_sm, abs=0.5)
    assert out["by_gi"]["7"][tensor] == pytest.approx(100 * gpt_tensor, abs=0.5)
    for gi in ("8", "9"):
        assert all(v == 0.0 for v in out["by_gi"][gi].values()), f"GI {gi} runs nothing"
    assert out["by_handle"][sm] == pytest.approx(out["by_gi"]["7"][sm], abs=0.5), "the MIG handle: the same"
    assert out["mixed"] == f"err{pynvml.NVML_ERROR_INVALID_ARGUMENT}"
    assert out["unknown"] == f"err{pynvml.NVML_ERROR_NOT_FOUND}"
    assert out["mig_off"] == f"err{pynvml.NVML_ERROR_INVALID_ARGUMENT}"
    assert out["whole"][sm] == pytest.approx(out["by_gi"]["7"][sm], abs=0.5), "the parent answers as a whole GPU"


def test_nvlink_state_errors_and_throughput(sim: Sim, cli: Callable[..., CompletedProcess[str]]) -> None:
    profiles = [PROFILES["H100-SXM5-80GB"], PROFILES["L4"]]
    machine = sim.machine(profiles, period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            """
        h = H[0]
        state = [N.nvmlDeviceGetNvLinkState(h, l) for l in range(18)]
        beyond = err_name(lambda: N.nvmlDeviceGetNvLinkState(h, 18))
        l4 = err_name(lambda: N.nvmlDeviceGetNvLinkState(H[1], 0))
        sim_cli("fail", "--nvlink-errors", "5", "--link", "3")
        time.sleep(0.2)
        crc = [N.nvmlDeviceGetNvLinkErrorCounter(h, l, N.NVML_NVLINK_ERROR_DL_CRC_FLIT) for l in (0, 3)]
        replay = [N.nvmlDeviceGetNvLinkErrorCounter(h, l, N.NVML_NVLINK_ERROR_DL_REPLAY) for l in (0, 3)]
        recovery = N.nvmlDeviceGetNvLinkErrorCounter(h, 3, N.NVML_NVLINK_ERROR_DL_RECOVERY)
        # the error totals are per link (nvml.h: scopeId is the link; the total over its lanes)
        total_ids = (N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
                     N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL)
        def link_totals(link):
            fields = N.nvmlDeviceGetFieldValues(h, [(i, link) for i in total_ids])
            return [(f.nvmlReturn, f.value.ullVal) for f in fields]
        totals = {link: link_totals(link) for link in (0, 3, 17, 18)}
        def tx(link):
            f = N.nvmlDeviceGetFieldValues(h, [(N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)])[0]
            assert f.nvmlReturn == 0, f.nvmlReturn
            return f.value.ullVal
        idle = [tx(0), tx(17)]
        set_load(0, 100)
        time.sleep(0.1)
        t0, a = same_tick(h, lambda: tx(5))
        time.sleep(0.5)
        t1, b = same_tick(h, lambda: tx(5))
        l4_field = N.nvmlDeviceGetFieldValues(H[1], [(N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)])[0].nvmlReturn
        emit(dict(state=state, beyond=beyond, l4=l4, crc=crc, replay=replay, recovery=recovery, totals=totals,
                  idle=idle, rate_kib_s=(b - a) / ((t1 - t0) / 1e6), l4_field=l4_field))
        """,
        ),
    )
    assert out["state"] == [1] * 18 and out["beyond"] == "err2" and out["l4"] == "err3"
    assert out["crc"] == [0, 5] and out["replay"] == [0, 5] and out["recovery"] == 0
    # CRC flit, replay, CRC data, recovery of link 0, 3, 17: that link's counters; link 18 is beyond
    assert out["totals"]["0"] == [[0, 0]] * 4 and out["totals"]["17"] == [[0, 0]] * 4
    assert out["totals"]["3"] == [[0, 5], [0, 5], [0, 0], [0, 0]]
    assert [rc for rc, _ in out["totals"]["18"]] == [pynvml.NVML_ERROR_INVALID_ARGUMENT] * 4
    assert out["idle"] == [0, 0]
    # generic load at 100 %: DRAM_BW 40 % -> 25 GB/s x 0.5 x 0.4 = 5 GB/s per link and direction
    assert out["rate_kib_s"] == pytest.approx(5e9 / 1024, rel=0.02)
    assert out["l4_field"] == 3
    beyond = cli("sim", "fail", "--nvlink-errors", "1", "--link", "18", "--state-dir", str(machine.state_dir))
    assert beyond.returncode == 2 and "--link 18 is beyond" in beyond.stderr and "0-17" in beyond.stderr


def test_violation_time_grows_while_the_power_cap_holds_the_clock(sim: Sim) -> None:
    machine = sim.machine("H100-SXM5-80GB", gpus=1, period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            """
        h = H[0]
        clock_events = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeClock, clock_events)
        def viol(policy):
            v = N.nvmlDeviceGetViolationStatus(h, policy)
            return v.referenceTime, v.violationTime
        idle_a = viol(N.NVML_PERF_POLICY_POWER)
        time.sleep(0.3)
        idle_b = viol(N.NVML_PERF_POLICY_POWER)
        N.nvmlDeviceSetPowerManagementLimit(h, 300000)
        set_load(0, 60)  # demand 484 W: capped at 300 W
        wait_ticks(h, 2)
        a = viol(N.NVML_PERF_POLICY_POWER)
        time.sleep(0.5)
        b = viol(N.NVML_PERF_POLICY_POWER)
        reasons = N.nvmlDeviceGetCurrentClocksEventReasons(h)
        clock = wait_event(clock_events, 500)  # idle clock -> the capped clock: one ClockChange
        clock_again = wait_event(clock_events, 200)  # steady since
        emit(dict(idle=[idle_a, idle_b], a=a, b=b, thermal=viol(N.NVML_PERF_POLICY_THERMAL)[1],
                  sync=viol(N.NVML_PERF_POLICY_SYNC_BOOST)[1], reasons=reasons, clock=clock,
                  clock_again=clock_again))
        """,
        ),
    )
    assert [violation_ns for _, violation_ns in out["idle"]] == [0, 0]
    assert out["reasons"] & 0x4  # SW_POWER_CAP
    (ref_a_us, viol_a_ns), (ref_b_us, viol_b_ns) = out["a"], out["b"]
    # every tick between the two readings was capped: violation time grows with the reference clock
    assert viol_b_ns - viol_a_ns == (ref_b_us - ref_a_us) * 1000
    assert viol_b_ns - viol_a_ns >= 400_000_000
    assert out["thermal"] == 0 and out["sync"] == 0
    assert out["clock"][:3] == [0, 0x10, 0] and out["clock_again"] is None


def test_mig_instances_answer_as_mig_devices(sim: Sim, cli: Callable[..., CompletedProcess[str]]) -> None:
    machine = sim.machine("H100-SXM5-80GB", gpus=1, period_s=PERIOD_S, mig_instances=3)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            """
        h = H[0]
        migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
        emit(dict(
            mode=[plain(m) for m in N.nvmlDeviceGetMigMode(h)],
            max_count=plain(N.nvmlDeviceGetMaxMigDeviceCount(h)),
            beyond=err_name(lambda: N.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)),
            is_mig=[plain(N.nvmlDeviceIsMigDeviceHandle(m)) for m in [h] + migs],
            gi=[plain(N.nvmlDeviceGetGpuInstanceId(m)) for m in migs],
            names=[N.nvmlDeviceGetName(m) for m in migs],
            uuids=[N.nvmlDeviceGetUUID(m) for m in migs],
            parent_uuid=N.nvmlDeviceGetUUID(h),
            mem=[N.nvmlDeviceGetMemoryInfo(m).total for m in migs],
            parent_mem=N.nvmlDeviceGetMemoryInfo(h).total,
            gi_of_parent=err_name(lambda: N.nvmlDeviceGetGpuInstanceId(h)),
        ))
        """,
        ),
    )
    assert out["mode"] == [1, 1] and out["max_count"] == 7 and out["beyond"] == "err6"
    assert out["is_mig"] == [0, 1, 1, 1]
    assert out["gi"] == [7, 8, 9]
    assert out["names"] == ["NVIDIA H100 80GB HBM3 MIG 1g.10gb"] * 3
    assert len(set(out["uuids"])) == 3 and all(u.startswith("MIG-") for u in out["uuids"])
    assert all(m <= out["parent_mem"] / 8 and m > out["parent_mem"] / 9 for m in out["mem"])
    assert out["gi_of_parent"] == "err2"
    bad = cli("sim", "run", "--profile", "L4", "--gpus", "1", "--set", "0.mig_instances=2", "--", "true")
    assert bad.returncode == 2 and "does not support MIG" in bad.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fail", "--gpu", "5", "--xid", "13"], "GPU 5 does not exist"),
        (["fail", "--xid", "0"], "--xid takes a positive XID code"),
        (["fail", "--recover", "--ecc-sbe"], "--recover cannot be combined"),
        (["fail", "--link", "2"], "--link applies to --nvlink-errors only"),
        (["fail", "--gpu", "1", "--nvlink-errors", "3"], "has no NVLink"),
        (["fail", "--nvlink-errors", "0"], "--nvlink-errors takes a positive count"),
        (["load", "--workload", "doom"], "unknown workload 'doom'"),
    ],
)
def test_bad_injections_are_usage_errors_that_write_nothing(
    sim: Sim, cli: Callable[..., CompletedProcess[str]], args: list[str], message: str
) -> None:
    machine = sim.machine([PROFILES["H100-SXM5-80GB"], PROFILES["L4"]], period_s=PERIOD_S)
    result = cli("sim", *args, "--state-dir", str(machine.state_dir))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert all((machine.state_dir / f"gpu{i}.events").read_text() == "" for i in (0, 1))


def test_the_documented_workload_table_is_the_simulators() -> None:
    """docs/simulator.md's GPM table lists sim/profiles.py's WORKLOAD_ACTIVITY, ids and ratios."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    lines = text[text.index("<!-- workload table") :].splitlines()[1:]
    rows = [line for line in lines[2:] if line.startswith("|")][: len(WORKLOAD_ACTIVITY)]
    documented = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name, _, wid = cells[0].partition(" (")
        documented[name] = (int(wid.rstrip(")")), tuple(float(c) for c in cells[1:]))
    assert documented == {name: (WORKLOAD_IDS[name], ratios) for name, ratios in WORKLOAD_ACTIVITY.items()}


ANSWER_OF = """
def answer(read):
    try:
        read()
    except N.NVMLError as e:
        return int(e.value)
    return 0
"""


def test_a_mig_gpu_answers_as_nvml_h_documents_privileged_or_not(sim: Sim, tmp_path: Path) -> None:
    """docs/simulator.md, "MIG": on the MIG-enabled GPU's own handle, the aggregate memory and process lists
    need privileges (NO_PERMISSION otherwise) and the MIG-unsupported reads answer NOT_SUPPORTED to all;
    the MIG instances' memory and the GPU's power stay readable."""
    snippet = child(
        ANSWER_OF,
        """
        h = H[0]
        mig = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        emit(dict(
            mem=answer(lambda: N.nvmlDeviceGetMemoryInfo(h)),
            mem_v2=answer(lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)),
            compute=answer(lambda: N.nvmlDeviceGetComputeRunningProcesses(h)),
            graphics=answer(lambda: N.nvmlDeviceGetGraphicsRunningProcesses(h)),
            mps=answer(lambda: N.nvmlDeviceGetMPSComputeRunningProcesses(h)),
            util=answer(lambda: N.nvmlDeviceGetUtilizationRates(h)),
            enc=answer(lambda: N.nvmlDeviceGetEncoderUtilization(h)),
            dec=answer(lambda: N.nvmlDeviceGetDecoderUtilization(h)),
            samples=answer(lambda: N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)),
            power_samples=answer(lambda: N.nvmlDeviceGetSamples(h, N.NVML_TOTAL_POWER_SAMPLES, 0)),
            remap=answer(lambda: N.nvmlDeviceGetRemappedRows(h)),
            process_util=answer(lambda: N.nvmlDeviceGetProcessUtilization(h, 0)),
            mig_mem=answer(lambda: N.nvmlDeviceGetMemoryInfo(mig)),
            mig_processes=answer(lambda: N.nvmlDeviceGetComputeRunningProcesses(mig)),
            power=answer(lambda: N.nvmlDeviceGetPowerUsage(h)),
        ))
        """,
    )
    h100 = with_overrides(PROFILES["H100-SXM5-80GB"], {"mig_instances": "2"})
    unprivileged = open_machine(tmp_path / "unprivileged", [h100], PERIOD_S, admin_uids=(os.geteuid() + 1,))
    denied, unsupported = pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_NOT_SUPPORTED
    mig_unsupported = dict.fromkeys(("util", "enc", "dec", "samples", "remap", "process_util"), unsupported)
    readable = {"power_samples": 0, "mig_mem": 0, "mig_processes": 0, "power": 0}
    assert sim.run(unprivileged, snippet) == {
        **dict.fromkeys(("mem", "mem_v2", "compute", "graphics", "mps"), denied),
        **mig_unsupported,
        **readable,
    }
    privileged = sim.machine("H100-SXM5-80GB", gpus=1, period_s=PERIOD_S, mig_instances=2)
    assert sim.run(privileged, snippet) == {
        **dict.fromkeys(("mem", "mem_v2", "compute", "graphics", "mps"), 0),
        **mig_unsupported,
        **readable,
    }


def test_gone_answers_and_the_event_wait_of_a_set_with_a_lost_gpu(sim: Sim) -> None:
    """`sim fail --answer` makes every query of the GPU answer that code; a wait on a set with the failed
    GPU registered answers it too (nvml.h's nvmlEventSetWait_v2: GPU_IS_LOST), while a set without it waits
    as before; --recover brings both back."""
    machine = sim.machine("A100-SXM4-80GB", gpus=2, period_s=PERIOD_S)
    out = sim.run(
        machine,
        child(
            CLI_HELPERS,
            ANSWER_OF,
            """
        def new_set(*handles):
            es = N.nvmlEventSetCreate()
            for h in handles:
                N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
            return es
        both, first = new_set(H[0], H[1]), new_set(H[0])
        seen = {}
        for answer_name in ("reset_required", "driver_not_loaded", "lib_rm_version_mismatch", "unknown", "gpu_is_lost"):
            sim_cli("fail", "--gpu", "1", "--answer", answer_name)
            time.sleep(0.25)  # the next tick
            seen[answer_name] = dict(
                power=answer(lambda: N.nvmlDeviceGetPowerUsage(H[1])),
                other=answer(lambda: N.nvmlDeviceGetPowerUsage(H[0])),
                wait_both=answer(lambda: N.nvmlEventSetWait_v2(both, 50)),
                wait_first=answer(lambda: N.nvmlEventSetWait_v2(first, 50)),
            )
            sim_cli("fail", "--gpu", "1", "--recover")
            time.sleep(0.25)
        emit(dict(seen=seen, after=answer(lambda: N.nvmlEventSetWait_v2(both, 50))))
        """,
        ),
    )
    timeout = pynvml.NVML_ERROR_TIMEOUT
    for name, code in state.FAIL_ANSWERS.items():
        assert out["seen"][name] == {"power": code, "other": 0, "wait_both": code, "wait_first": timeout}, name
    assert out["after"] == timeout, "a set whose GPUs all answer waits again"
