"""A node that stores only the basics (no instantaneous power, no energy counter, no acoustics, no
trainer, no probe): the model still fits and reports, and says what it fell back to."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuprobe.config import format_time_ns
from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.influx.client import InfluxClient
from gpuprobe.model import InfluxSettings, ModelSettings, NoDataError, run
from gpuprobe.model.data import load, range_window

R, TAU, T_AMB = 0.1, 5.0, 25.0


def _write_old_node(influxdb: InfluxDBDatabase, power_limit_w: float | None = None) -> tuple[int, int]:
    """The old node's GPU 0 (temperature and averaged power only; optionally its power limit): (start, end) ns."""
    n, dt = 600, 0.1
    instant = np.where((np.arange(n) >= 100) & (np.arange(n) < 350), 300.0, 50.0)
    temp = np.empty(n)
    temp[0] = T_AMB + R * 50.0
    for k in range(n - 1):
        steady = T_AMB + R * instant[k]
        temp[k + 1] = steady + (temp[k] - steady) * math.exp(-dt / TAU)
    averaged = np.array([instant[max(0, k - 9) : k + 1].mean() for k in range(n)])  # NVML's 1 s average
    start_ns = (time.time_ns() - 120 * 10**9) // 10**9 * 10**9
    limit = "" if power_limit_w is None else f",power_limit_w={power_limit_w!r}"
    lines = [
        f"gpu,gpu=0,host=old-node,model=Tesla\\ V100,uuid=GPU-old temp_c={float(np.floor(temp[k] + 0.5))!r},"
        f"power_w={float(averaged[k])!r}{limit} {start_ns + int(k * dt * 1e9)}"
        for k in range(n)
    ]
    influxdb.write_lines(lines)
    return start_ns, start_ns + int((n - 1) * dt * 1e9)


def test_time_range_with_only_temperature_and_averaged_power(influxdb: InfluxDBDatabase, tmp_path: Path) -> None:
    n, dt = 600, 0.1
    instant = np.where((np.arange(n) >= 100) & (np.arange(n) < 350), 300.0, 50.0)
    start_ns, end_ns = _write_old_node(influxdb)
    settings = ModelSettings(
        influx=InfluxSettings(url=influxdb.server.url, database=influxdb.name),
        start_ns=start_ns,
        end_ns=end_ns,
        out_dir=tmp_path,
    )
    paths = run(settings)
    (g,) = paths.results.gpus
    assert g.thermal.power_source == "power_w"
    assert g.thermal.rc is not None
    assert g.thermal.rc.r_th_c_per_w == pytest.approx(R, rel=0.05)
    assert g.thermal.rc.tau_s == pytest.approx(TAU, rel=0.05)
    # no gpu_info point: the default threshold, and the notes say the GPU reported none
    assert g.slowdown_c == 87.0 and g.slowdown_source == "default"
    assert any("no slowdown threshold reported" in note and "old-node/0" in note for note in paths.results.notes)
    assert g.power_limit_w is None and g.headroom_c is None  # no power_limit_w stored: nothing to predict
    e = g.efficiency
    assert e.energy_source == "integral"
    assert e.probe_energy_j == pytest.approx(float(np.sum(instant[:-1]) * dt), rel=0.01)
    assert e.samples_per_s is None and e.j_per_sample is None
    assert g.acoustic is None and paths.results.nodes[0].calibration is None
    assert any("time range without a probe" in note for note in paths.results.notes)
    document = json.loads(paths.json.read_text())
    assert document["gpus"][0]["efficiency"]["samples_per_j"] is None
    assert paths.html.exists() and "old-node" in paths.html.read_text()
    with pytest.raises(NoDataError, match="no probe 'missing'"):
        run(ModelSettings(influx=settings.influx, probe="missing", out_dir=tmp_path))


def test_the_headroom_uses_the_gpus_own_threshold_and_the_option_wins(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    start_ns, end_ns = _write_old_node(influxdb, power_limit_w=250.0)
    # what an agent stores: the GPU's facts at its start (83.5 °C: no model's usual value), a later point
    # of another GPU that once sat at index 0 (another uuid), and one after the window (not yet reported)
    influxdb.write_lines(
        [
            "gpu_info,gpu=0,host=old-node,model=Tesla\\ V100,uuid=GPU-old temp_slowdown_c=83.5,"
            f'temp_shutdown_c=90.0,vbios_version="88.00.4f.00.09" {start_ns - 3600 * 10**9}',
            f"gpu_info,gpu=0,host=other-node,uuid=GPU-old temp_slowdown_c=70.0 {start_ns}",
            f"gpu_info,gpu=0,host=old-node,model=Tesla\\ V100,uuid=GPU-old temp_slowdown_c=60.0 {end_ns + 10**9}",
        ]
    )
    influx = InfluxSettings(url=influxdb.server.url, database=influxdb.name)
    base = ModelSettings(influx=influx, start_ns=start_ns, end_ns=end_ns, out_dir=tmp_path / "gpu")
    (g,) = run(base).results.gpus
    assert g.slowdown_c == 83.5 and g.slowdown_source == "gpu"
    assert g.t_pred_at_limit_c is not None
    assert g.headroom_c == pytest.approx(83.5 - g.t_pred_at_limit_c)
    paths = run(dataclasses.replace(base, out_dir=tmp_path / "json"))
    document = json.loads(paths.json.read_text())
    assert document["gpus"][0]["slowdown_c"] == 83.5 and document["gpus"][0]["slowdown_source"] == "gpu"
    assert not any("no slowdown threshold" in note for note in paths.results.notes)
    # a later report of the same GPU (its uuid) within the window wins over the earlier one
    influxdb.write_lines([f"gpu_info,gpu=0,host=old-node,uuid=GPU-old temp_slowdown_c=84.0 {start_ns + 10**9}"])
    (g,) = run(base).results.gpus
    assert g.slowdown_c == 84.0 and g.slowdown_source == "gpu"
    # --slowdown-c wins over what the GPU reported
    (g,) = run(dataclasses.replace(base, slowdown_c=95.0, out_dir=tmp_path / "option")).results.gpus
    assert g.slowdown_c == 95.0 and g.slowdown_source == "option"
    assert g.headroom_c == pytest.approx(95.0 - g.t_pred_at_limit_c)


def test_no_data_messages_give_iso_times_and_name_the_hosts_filter(influxdb: InfluxDBDatabase, tmp_path: Path) -> None:
    """The messages gave the range as raw ns ("between 1764… and 1764… ns") and did not say that
    --hosts had narrowed the search, so a typo in a host name read as "no data at all"."""
    start_ns, end_ns = _write_old_node(influxdb)
    settings = ModelSettings(influx=InfluxSettings(url=influxdb.server.url, database=influxdb.name), out_dir=tmp_path)
    ranged = dataclasses.replace(settings, start_ns=start_ns, end_ns=end_ns, hosts=("old-nod",))
    with pytest.raises(NoDataError) as caught:
        run(ranged)
    message = str(caught.value)
    iso = re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?Z", message)
    assert iso == [format_time_ns(start_ns), format_time_ns(end_ns)], message
    assert "on hosts old-nod (--hosts)" in message, message
    assert not re.search(r"\d{12,}", message), message  # no timestamp written as a number
    with pytest.raises(NoDataError, match=r"--to \(\S+Z\) must be after --from \(\S+Z\)"):
        run(dataclasses.replace(ranged, start_ns=end_ns, end_ns=start_ns))
    with pytest.raises(NoDataError, match=r"no probe 'missing' on hosts a, b \(--hosts\)"):
        run(dataclasses.replace(settings, probe="missing", hosts=("a", "b")))
    # without --hosts the messages do not speak of it
    with pytest.raises(NoDataError) as caught:
        run(dataclasses.replace(settings, start_ns=end_ns + 10**12, end_ns=end_ns + 2 * 10**12))
    assert "--hosts" not in str(caught.value) and "on hosts" not in str(caught.value)


def test_the_model_and_the_study_give_one_headroom_for_the_same_data(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    """One headroom (gpuprobe.model.thermal.headroom_c: slowdown - steady temperature). The same A100 once
    had 14.6 °C in the model report (its fit's steady temperature at the limit) and 35 °C in the study
    report (the peak of a window shorter than its τ). Here a study-length window of one τ, cut from the
    same samples at the power limit, gives the model's figure, which the window's peak would not."""
    from gpuprobe.study.analysis import Measurement, window_stats

    start_ns, _ = _write_old_node(influxdb, power_limit_w=300.0)  # 300 W from 10 s to 35 s, τ = 5 s
    influx = InfluxSettings(url=influxdb.server.url, database=influxdb.name)
    base = ModelSettings(influx=influx, start_ns=start_ns, end_ns=start_ns + 60 * 10**9, out_dir=tmp_path)
    (g,) = run(dataclasses.replace(base, slowdown_c=87.0)).results.gpus
    assert g.headroom_c == pytest.approx(87.0 - (T_AMB + R * 300.0), abs=0.7)
    # the study's reading of a steady window from 10.5 s to 15.5 s (the GPU still 5 °C below where it goes)
    with InfluxClient(influx) as client:
        (series,) = load(client, range_window(client, start_ns, start_ns + 60 * 10**9)).gpus
    window = (start_ns + 10_500_000_000, start_ns + 15_500_000_000)
    power, _ = series.power()
    stats = window_stats(
        series.t_ns,
        *window,
        power_w=power,
        energy_j=series.field("energy_j"),
        temp_c=series.field("temp_c"),
        power_limit_w=series.field("power_limit_w"),
        sm_clock_mhz=np.full(len(series.t_ns), math.nan),
    )
    measured = Measurement(
        host="old-node", gpu="0", gpu_model=g.model, point=0, workload="resnet50", batch_size=64, power_limit="",
        instance_type="", virt="", region="", start_ns=window[0], end_ns=window[1], window_closed=True,
        samples_per_s=100.0, trainer_reports=5, devices=["cuda"], requested_limit_w=300.0, slowdown_c=87.0,
        est_dba=None, stats=stats,
    )  # fmt: skip
    assert stats.steady_fitted and measured.headroom_c == pytest.approx(g.headroom_c, abs=1.0)
    assert stats.peak_temp_c is not None and 87.0 - stats.peak_temp_c > g.headroom_c + 3.0  # what the peak said


def test_a_run_names_each_stage_of_its_fits_and_the_cli_shows_them_only_after_a_few_seconds(
    influxdb: InfluxDBDatabase, tmp_path: Path
) -> None:
    """A fit of a fleet takes minutes with no output: the stages (which node, which GPU, which fit) go to
    stderr once a run has taken longer than a few seconds, one line each."""
    import io

    from gpuprobe.model.api import QuietProgress

    start_ns, end_ns = _write_old_node(influxdb, power_limit_w=300.0)
    influx = InfluxSettings(url=influxdb.server.url, database=influxdb.name)
    heard: list[str] = []
    run(ModelSettings(influx=influx, start_ns=start_ns, end_ns=end_ns, out_dir=tmp_path), heard.append)
    assert heard[0].startswith(f"reading the samples of {format_time_ns(start_ns)} to ")
    assert "fitting node 1 of 1, old-node: GPU 0: step and ARX fits" in heard
    assert "fitting node 1 of 1, old-node: output-error models of the GPU" in heard
    assert heard[-1].startswith("drawing the plots") and len(heard) == 4

    fast = io.StringIO()
    quiet = QuietProgress("gpuprobe model", after_s=60.0, stream=fast)
    for message in heard:
        quiet(message)
    quiet.close()
    assert fast.getvalue() == ""  # a run that ends within the quiet time prints nothing
    slow = io.StringIO()
    shown = QuietProgress("gpuprobe model", after_s=0.05, stream=slow)
    shown("fitting node 1 of 2, a: GPU 0: step and ARX fits")
    assert slow.getvalue() == ""
    deadline = time.monotonic() + 5.0
    while not slow.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    shown("fitting node 1 of 2, a: output-error models of its 2 GPUs together")
    shown.close()
    shown("writing")  # after close: nothing more
    lines = slow.getvalue().splitlines()
    assert [re.sub(r"\[\d+ s\] ", "", line) for line in lines] == [
        "gpuprobe model: fitting node 1 of 2, a: GPU 0: step and ARX fits",
        "gpuprobe model: fitting node 1 of 2, a: output-error models of its 2 GPUs together",
    ], lines


def test_the_report_says_simulated_first_and_keys_its_phase_shading(influxdb: InfluxDBDatabase, tmp_path: Path) -> None:
    """The SIMULATED note was the last thing of the report (under Notes, after every figure), and the
    phases' shading had no key."""
    import html

    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from gpuprobe.model.analysis import SIMULATED_NOTE
    from gpuprobe.model.report import phase_legend

    start_ns, end_ns = _write_old_node(influxdb, power_limit_w=300.0)
    influxdb.write_lines(
        [
            f'trainer,device=sim,gpu=0,host=old-node,workload=resnet50 samples_per_s={100.0 + k},phase="steady" '
            f"{start_ns + (12 + k) * 10**9}"
            for k in range(20)
        ]
    )
    influx = InfluxSettings(url=influxdb.server.url, database=influxdb.name)
    paths = run(ModelSettings(influx=influx, start_ns=start_ns, end_ns=end_ns, out_dir=tmp_path))
    text, note = paths.html.read_text(), html.escape(SIMULATED_NOTE)
    assert text.count(note) == 1  # once, at the top
    assert text.index(note) < text.index("<h2>")  # above the first section
    assert text.index('id="simulated"') < text.index("<img")

    fig = plt.figure(layout="constrained")
    fig.add_subplot().plot([0, 1], [0, 1])
    labels = phase_legend(fig, [{"phase": "steady"}, {"phase": "idle"}, {"phase": "cooldown"}, {"phase": "x"}])
    assert labels == ["idle phase", "steady phase", "cooldown phase"]  # the order the phases run
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == labels
    empty = plt.figure()
    assert phase_legend(empty, []) == [] and not empty.legends
    plt.close("all")


def test_no_legend_of_the_model_report_covers_a_plot(
    influxdb: InfluxDBDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The legends sat inside the panels (lower right: over the cool-down curve; the power plot's over its
    lines); they are beside the panels or under the figure now."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from gpuprobe.model import fit
    from gpuprobe.model import report as rep

    start_ns, end_ns = _write_old_node(influxdb, power_limit_w=300.0)
    influx = InfluxSettings(url=influxdb.server.url, database=influxdb.name)
    ds, results = fit(ModelSettings(influx=influx, start_ns=start_ns, end_ns=end_ns, out_dir=tmp_path))
    figures: list[Any] = []
    monkeypatch.setattr(rep, "_png", lambda fig: figures.append(fig) or "")
    rep.thermal_figure(ds, results, "old-node")
    rep.holdout_figure(ds, results, "old-node")
    rep.power_figure(ds, results, "old-node")
    rep.efficiency_figure(results)
    assert len(figures) == 4
    for fig in figures:
        fig.canvas.draw()
        axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
        legends = [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend() is not None)]
        assert legends, fig.get_suptitle()
        for legend in legends:
            for ax in axes:
                assert not legend.get_window_extent().overlaps(ax.get_window_extent()), (fig.get_suptitle(), ax)
    plt.close("all")


def test_a_model_run_with_data_prints_no_library_line(influxdb: InfluxDBDatabase, tmp_path: Path) -> None:
    """At the default log level a whole run (queries, fits, plots, the `model` points written) puts only
    gpuprobe's own lines on stderr: no httpx request lines, no library warnings (numpy, scipy, matplotlib)."""
    import os
    import subprocess
    import sys

    start_ns, end_ns = _write_old_node(influxdb, power_limit_w=300.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    done = subprocess.run(
        [
            sys.executable, "-m", "gpuprobe.app", "model", "--from", format_time_ns(start_ns), "--to",
            format_time_ns(end_ns), "--influx-url", influxdb.server.url, "--influx-db", influxdb.name,
            "--out", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "report: " in done.stdout and "`model` points written: " in done.stdout
    foreign = [line for line in done.stderr.splitlines() if not line.startswith("gpuprobe model: [")]
    assert foreign == [], done.stderr
