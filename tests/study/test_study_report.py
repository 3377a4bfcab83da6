"""`gpuprobe study report` on a synthetic study in a real InfluxDB (study_synthetic.py): known throughput
and power per GPU and point, two nodes (bare metal and vgpu), two GPU models, one refused point, one
simulated GPU. Checks the figures, the Pareto frontier and optimal points, the virtualization overhead,
the refusals, the files, the `model` points, the errors, and that simulated figures say so."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from study_synthetic import (
    GPUS,
    H100,
    H100_BARE,
    L4,
    L4_REFUSAL,
    POINTS,
    PRICES,
    VGPU_FACTOR,
    StudyCommand,
    StudyRun,
    close,
    enforced_limit_w,
    est_dba,
    expected,
    peak_temp_c,
    samples_per_j,
    steady_temp_c,
)

from gpuprobe.devservices import InfluxDBDatabase
from gpuprobe.devservices.browser import table_layout
from gpuprobe.influx.client import InfluxClient
from gpuprobe.influx.lineprotocol import encode_line
from gpuprobe.influx.settings import InfluxSettings
from gpuprobe.study import NoDataError, StudyReport, build_report

REL = 0.005  # the brief: samples/J within 0.5 %


def test_every_gpu_at_every_point(study_report: StudyReport) -> None:
    r = study_report
    assert len(r.measurements) == sum(len(g.points) for g in GPUS) == 15
    for m in r.measurements:
        rate, watts = expected(m.host, m.gpu, m.point)
        g = next(g for g in GPUS if (g.host, g.index) == (m.host, m.gpu))
        where = f"{m.host} gpu {m.gpu} point {m.point}"
        assert close(m.samples_per_s, rate, 1e-9), where
        assert close(m.stats.mean_power_w, watts, REL), where
        assert m.stats.energy_source == "counter", where
        assert close(m.samples_per_j, samples_per_j(m.host, m.gpu, m.point), REL), where
        assert (m.batch_size, m.power_limit) == POINTS[m.point], where
        assert m.gpu_model == g.model and m.workload == "resnet50", where
        assert m.stats.peak_temp_c == peak_temp_c(g, m.point), where
        assert close(m.stats.enforced_limit_w, enforced_limit_w(g, m.point), 1e-9), where
        assert close(m.est_dba, est_dba(g, m.point), 1e-9), where
        assert m.stats.duration_s == pytest.approx(20.0), where
        assert m.trainer_reports == 20 and m.window_closed and m.has_data, where
        assert m.simulated == (g.device == "sim"), where
        if g.slowdown_c is None:
            assert m.headroom_c is None, where
        else:
            # from the steady temperature (the one hotter reading is the peak, not where it settled)
            assert m.stats.steady_temp_c == steady_temp_c(g, m.point) and m.stats.steady_fitted, where
            assert m.headroom_c == pytest.approx(g.slowdown_c - steady_temp_c(g, m.point)), where


def test_groups(study_report: StudyReport) -> None:
    r = study_report
    assert len(r.groups) == 12  # 4 bare-metal H100, 4 vgpu H100, 4 L4 (one of them only refused)
    for point, (batch, limit) in enumerate(POINTS):
        rate, watts = H100_BARE[point]
        bare = r.group(gpu_model=H100, virt="bare_metal", batch_size=batch, power_limit=limit)
        assert (bare.gpus, bare.nodes, bare.points, bare.refusals) == (2, 1, [point], 0)
        assert close(bare.samples_per_s, rate, 1e-9)
        assert close(bare.samples_per_j, rate / watts, REL)
        assert close(bare.j_per_sample, watts / rate, REL)
        assert bare.key.instance_type == "p5.48xlarge" and bare.key.region == "us-east-1"
        cost = PRICES["p5.48xlarge"] / 3600 / (rate * 2) * 1e6  # two GPUs of node-a in the study
        assert close(bare.cost_per_million_samples_usd, cost, 1e-9)
        assert bare.headroom_c is not None and bare.virt_overhead_pct is None and not bare.simulated
        vgpu = r.group(gpu_model=H100, virt="vgpu", batch_size=batch, power_limit=limit)
        assert close(vgpu.samples_per_s, rate * VGPU_FACTOR, 1e-9)
        assert vgpu.headroom_c is None  # node-b does not know its H100's slowdown threshold
        assert close(vgpu.cost_per_million_samples_usd, PRICES["g6.vgpu"] / 3600 / (rate * VGPU_FACTOR * 2) * 1e6)
    refused = r.group(gpu_model=L4, batch_size=128, power_limit="60%")
    assert (refused.gpus, refused.refusals, refused.samples_per_s, refused.samples_per_j) == (0, 1, None, None)


def test_pareto_frontier_and_optimal_points(study_report: StudyReport) -> None:
    h100 = study_report.frontier(H100, "resnet50")
    assert (h100.energy_optimal.batch_size, h100.energy_optimal.power_limit, h100.energy_optimal.virt) == (
        128,
        "60%",
        "bare_metal",
    )
    assert (h100.time_optimal.batch_size, h100.time_optimal.power_limit, h100.time_optimal.virt) == (
        128,
        "",
        "bare_metal",
    )
    assert {(p.key.batch_size, p.key.power_limit, p.key.virt) for p in h100.frontier} == {
        (128, "", "bare_metal"),
        (128, "60%", "bare_metal"),
    }
    assert len(h100.points) == 8 and not h100.simulated
    l4 = study_report.frontier(L4)
    assert (l4.energy_optimal.batch_size, l4.energy_optimal.power_limit) == (64, "60%")
    assert (l4.time_optimal.batch_size, l4.time_optimal.power_limit) == (128, "")
    assert len(l4.points) == 3 and l4.simulated


def test_virtualization_overhead_of_the_vgpu_node(study_report: StudyReport) -> None:
    overheads = study_report.virt_overhead
    h100 = [o for o in overheads if o.key.gpu_model == H100]
    assert len(h100) == 4
    for o in h100:
        assert o.overhead_pct == pytest.approx((1 - VGPU_FACTOR) * 100, abs=1e-9)
        assert [k.virt for k in o.bare_metal] == ["bare_metal"] and not o.simulated
    l4 = [o for o in overheads if o.key.gpu_model == L4]
    assert l4 and all(o.overhead_pct is None and "no bare_metal group" in o.note for o in l4)


def test_refusals_and_the_other_points_unaffected(study_report: StudyReport) -> None:
    (refusal,) = study_report.refusals
    assert (refusal.host, refusal.gpu, refusal.gpu_model, refusal.point) == ("node-b", "1", L4, 3)
    assert (refusal.batch_size, refusal.power_limit, refusal.message) == (128, "60%", L4_REFUSAL)
    others = [m for m in study_report.measurements if (m.host, m.gpu) == ("node-b", "1")]
    assert [m.point for m in others] == [0, 1, 2] and all(m.has_data for m in others)
    assert study_report.missing == []


def test_rankings(study_report: StudyReport) -> None:
    by_model = next(r for r in study_report.rankings if r.by == "gpu_model")
    assert [(e.name, e.simulated) for e in by_model.entries] == [(L4, True), (H100, False)]
    assert close(by_model.entries[1].samples_per_j, 1200.0 / 400.0, REL)
    by_type = next(r for r in study_report.rankings if r.by == "instance_type")
    assert [e.name for e in by_type.entries] == ["g6.vgpu", "p5.48xlarge"]


def test_hosts_option_reads_only_those_hosts(study_run: StudyRun) -> None:
    with InfluxClient(InfluxSettings(url=study_run.server.url, database=study_run.db)) as client:
        report = build_report(client, study_run.study, hosts=["node-a"])
    assert {g.key.virt for g in report.groups} == {"bare_metal"} and report.virt_overhead == []
    assert not report.simulated and report.refusals == []


def test_the_command_writes_table_html_json_and_model_points(
    tmp_path: Path, fresh_study: Callable[..., StudyRun], gpuprobe_study: StudyCommand
) -> None:
    run = fresh_study()
    prices = tmp_path / "prices.toml"
    prices.write_text("".join(f'"{k}" = {v}\n' for k, v in PRICES.items()), encoding="utf-8")
    html, numbers = tmp_path / "out" / "study.html", tmp_path / "out" / "study.json"
    status, out, err = gpuprobe_study(run, run.study, "--prices", prices, "--html", html, "--json", numbers)
    assert status == 0, err
    # progress on stderr
    assert "reading the events of study" in err and "reading GPU samples" in err
    # the table: a row per group, the simulated L4 rows say so, the optimal points and the refusal
    # (each configuration heads its rows: GPU model · workload · instance type · virt · region)
    lines = out.splitlines()
    headings = [line for line in lines if line.startswith(("NVIDIA H100", "NVIDIA L4"))]
    assert headings == [
        f"{H100} · resnet50 · g6.vgpu · vgpu · eu-west-1",
        f"{H100} · resnet50 · p5.48xlarge · bare_metal · us-east-1",
        f"{L4} · resnet50 · g6.vgpu · vgpu · eu-west-1",
    ]
    rows = [line for line in lines if re.match(r"  (64|128) ", line)]
    assert len(rows) == 12 and all(lines.index(rows[0]) > lines.index(headings[0]) for _ in rows)
    data = [line.split()[-1] for line in rows]
    assert data == ["measured"] * 8 + ["simulated"] * 3 + ["—"]  # the last L4 group is the refused point
    assert "SOME FIGURES ARE SIMULATED" in out
    # it fits a 120-column terminal (it was ~230): the table drops what it says above it or leaves to the
    # HTML, and the text wraps, each continuation 4 spaces deeper than its line
    assert max(len(line) for line in out.splitlines()) <= 120, out
    text = re.sub(r"\n {4,}", " ", out)
    assert re.search(r"NVIDIA L4 / resnet50: energy-optimal batch 64, limit 60% .*\(simulated\)", text)
    assert re.search(r"NVIDIA H100 80GB HBM3 / resnet50: energy-optimal batch 128, limit 60% on p5\.48xlarge", text)
    assert f"node-b gpu 1 point 3 (resnet50, batch 128, limit 60%): {L4_REFUSAL}" in text
    assert "+10.0" in out  # the vgpu overhead
    assert f"report: {html}" in out and f"numbers: {numbers}" in out
    # at 1400 px no table is wider than the page (the groups table was ~1700 px, in a scrolled box), and
    # no GPU model wraps (the groups table's took four lines): each configuration is a line over its rows
    layout = table_layout(html, 1400)
    assert 0 < layout.right_px <= layout.viewport_px, layout
    assert not [text for text in layout.wrapped_cells if H100 in text or L4 in text], layout.wrapped_cells
    groups = html.read_text("utf-8").split("<h2>Groups</h2>")[1].split("<h2>")[0]
    configurations = re.findall(r'<tr class="config"><td class="l" colspan="\d+">([^<]*)</td>', groups)
    assert configurations == headings, configurations  # as on the terminal
    assert "`model` points written (kind=study): 12" in out

    page = html.read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 4  # Pareto H100, Pareto L4, scaling, overhead
    assert "Simulated figures." in page and '<td class="sim">simulated</td>' in page
    assert "NVIDIA L4: time-energy Pareto frontier (simulated)" not in page  # titles are in the images
    assert "energy-optimal (max samples/J)" in page and L4_REFUSAL.replace("'", "&#x27;") in page
    assert "1400.0" in page and "3.003" in page  # H100 samples/s at batch 128, samples/J of the best point

    document = json.loads(numbers.read_text(encoding="utf-8"))
    assert {
        "study",
        "database",
        "simulated",
        "groups",
        "pareto",
        "scaling",
        "virt_overhead",
        "rankings",
        "refusals",
        "measurements",
        "settings",
        "version",
    } <= set(document)
    assert document["study"] == run.study and document["database"] == run.db and document["simulated"] is True
    groups = {
        (g["key"]["gpu_model"], g["key"]["virt"], g["key"]["batch_size"], g["key"]["power_limit"]): g
        for g in document["groups"]
    }
    l4 = groups[(L4, "vgpu", 64, "60%")]
    assert l4["simulated"] is True and l4["throughput_source"] == "simulated"
    assert close(l4["samples_per_j"], 250.0 / 43.0, REL)
    h100 = groups[(H100, "bare_metal", 128, "60%")]
    assert h100["simulated"] is False and h100["throughput_source"] == "measured" and h100["energy_optimal"] is True
    assert h100["key"]["power_limit_label"] == "60%"
    assert all(
        m["throughput_source"] == ("simulated" if m["gpu_model"] == L4 else "measured")
        for m in document["measurements"]
    )
    assert document["refusals"][0]["message"] == L4_REFUSAL
    assert document["settings"]["prices"] == str(prices) and "influx_password" not in document["settings"]

    answer = run.server.query(
        run.db, f'SELECT * FROM "model" WHERE "kind" = \'study\' AND "probe" = \'{run.study}\' GROUP BY *'
    )
    points = {
        (s.tags["gpu_model"], s.tags["virt"], s.tags["batch_size"], s.tags.get("power_limit", "")): s.rows()[0]
        for s in answer
    }
    assert len(points) == 12
    best = points[(H100, "bare_metal", "128", "60%")]
    assert close(best["samples_per_j"], 3.0, REL) and best["energy_optimal"] is True and best["simulated"] is False
    assert best["gpus"] == 2 and best["point"] == 3 and best["instance_type"] == "p5.48xlarge"
    assert points[(L4, "vgpu", "64", "60%")]["simulated"] is True
    assert close(points[(H100, "vgpu", "64", "")]["virt_overhead_pct"], 10.0, 1e-9)
    assert points[(L4, "vgpu", "128", "60%")]["refusals"] == 1

    # again: the same points are overwritten, not added
    status, _, err = gpuprobe_study(run, run.study)
    assert status == 0, err
    answer = run.server.query(run.db, 'SELECT count("gpus") FROM "model" WHERE "kind" = \'study\'')
    assert answer[0].values[0][1] == 12


def test_no_write_and_no_files(fresh_study: Callable[..., StudyRun], gpuprobe_study: StudyCommand) -> None:
    run = fresh_study()
    status, out, err = gpuprobe_study(run, run.study, "--no-write")
    assert status == 0, err
    assert "`model` points written" not in out and "report:" not in out
    assert run.server.query(run.db, 'SELECT * FROM "model"') == []


def test_an_unknown_study_names_the_database(study_run: StudyRun, gpuprobe_study: StudyCommand) -> None:
    status, out, err = gpuprobe_study(study_run, "s-nope")
    assert status == 1 and out == ""
    assert f"no study 's-nope' in database '{study_run.db}'" in err
    # a study narrowed by --hosts to none of its nodes says so, instead of "no study"
    status, out, err = gpuprobe_study(study_run, study_run.study, "--hosts", "nosuch-a,nosuch-b")
    assert status == 1 and "on hosts nosuch-a, nosuch-b (--hosts)" in err, err


def test_a_study_without_data_says_which_points(
    fresh_study: Callable[..., StudyRun], gpuprobe_study: StudyCommand
) -> None:
    run = fresh_study(trainer=False, gpu_samples=False)
    status, out, err = gpuprobe_study(run, run.study)
    assert status == 1 and out == ""
    assert f"study '{run.study}' in database '{run.db}': none of its points has both throughput and power" in err
    assert "node-a gpu 0 point 0: no steady trainer reports of this point; no `gpu` samples in the steady window" in err
    assert f"node-b gpu 1 point 3: refused: {L4_REFUSAL}" in err
    with InfluxClient(InfluxSettings(url=run.server.url, database=run.db)) as client, pytest.raises(NoDataError):
        build_report(client, run.study)


def test_a_study_with_some_points_missing_reports_the_rest(
    fresh_study: Callable[..., StudyRun], gpuprobe_study: StudyCommand
) -> None:
    run = fresh_study()
    run.server.execute('DELETE FROM "trainer" WHERE "host" = \'node-a\' AND "gpu" = \'1\'', run.db)
    with InfluxClient(InfluxSettings(url=run.server.url, database=run.db)) as client:
        report = build_report(client, run.study)
    assert {(m.host, m.gpu) for m in report.missing} == {("node-a", "1")} and len(report.missing) == 4
    bare = report.group(gpu_model=H100, virt="bare_metal", batch_size=64, power_limit="")
    assert (bare.gpus, bare.gpus_with_data) == (2, 1) and close(bare.samples_per_j, 2.0, REL)
    status, out, _ = gpuprobe_study(run, run.study, "--no-write")
    assert status == 0 and "points without figures:" in out
    assert "node-a gpu 1 point 0: no steady trainer reports of this point" in out


def test_the_agents_aggregates_in_a_window_do_not_change_its_figures(
    fresh_study: Callable[..., StudyRun],
) -> None:
    """Aggregate points (``res=1s``) of a GPU beside its raw samples in the last seconds of its last point,
    as an agent that closed its high-resolution window at another GPU's end shipped them: each holds its
    second's last energy reading stamped at the second's start. Read as readings they raised the window's
    mean power (400 W read as 472 W here); the report reads the raw samples only."""
    run = fresh_study()
    last = len(POINTS) - 1
    with InfluxClient(InfluxSettings(url=run.server.url, database=run.db)) as client:
        before = next(
            m for m in build_report(client, run.study).measurements if (m.host, m.gpu, m.point) == ("node-a", "0", last)
        )
        end_ns = before.end_ns
        raw = [
            row
            for series in client.query(
                f'SELECT "power_w", "energy_j" FROM "gpu" WHERE "host" = \'node-a\' AND "gpu" = \'0\' '
                f"AND time >= {end_ns - 4 * 10**9} AND time < {end_ns}"
            )
            for row in series.rows()
        ]
    tags = {"cluster": "lab", "host": "node-a", "gpu": "0", "model": H100, "uuid": "GPU-node-a-0", "res": "1s"}
    lines = []
    for second_ns in sorted({r["time"] // 10**9 * 10**9 for r in raw}):
        interval = [r for r in raw if second_ns <= r["time"] < second_ns + 10**9]
        fields = {"power_w": sum(r["power_w"] for r in interval) / len(interval), "energy_j": interval[-1]["energy_j"]}
        lines.append(encode_line("gpu", tags, fields, second_ns))
    run.server.write_lines(run.db, lines)
    with InfluxClient(InfluxSettings(url=run.server.url, database=run.db)) as client:
        after = next(
            m for m in build_report(client, run.study).measurements if (m.host, m.gpu, m.point) == ("node-a", "0", last)
        )
    assert after.stats.mean_power_w == pytest.approx(before.stats.mean_power_w, rel=1e-9)
    assert close(after.samples_per_j, samples_per_j("node-a", "0", last), REL)


def test_a_plain_probe_is_not_a_study(influxdb: InfluxDBDatabase, gpuprobe_study: StudyCommand) -> None:
    influxdb.write_lines(
        'probe,host=h1,probe=p-plain,virt=bare_metal kind="phase_change",phase="steady",status="running",'
        'workload="resnet50" 1764420000500000000'
    )
    run = StudyRun(influxdb.server, influxdb.name, "p-plain", 0, 0)
    status, _, err = gpuprobe_study(run, "p-plain")
    assert status == 1
    assert (
        f"probe 'p-plain' in database '{influxdb.name}' is not a study: none of its `probe` events names a point" in err
    )


def test_the_terminal_table_says_constant_columns_once_and_leaves_the_least_needed_to_the_html() -> None:
    from gpuprobe.study.report import terminal_columns

    headers = ["batch", "limit", "samples/J", "J/sample", "proxy dBA", "refused", "data"]
    rows = [
        ["64", "as is", "2.5", "0.4", "55.0", "0", "measured"],
        ["128", "60%", "3.1", "0.32", "55.0", "0", "simulated"],
    ]
    shown, body, left, said = terminal_columns(headers, rows, left=2, width=200)
    assert shown == ["batch", "limit", "samples/J", "J/sample", "data"] and left == 2
    assert said == ["every row: proxy dBA: 55.0; refused: 0"]
    assert body == [["64", "as is", "2.5", "0.4", "measured"], ["128", "60%", "3.1", "0.32", "simulated"]]
    narrow, _, _, said = terminal_columns(headers, rows, left=2, width=30)
    assert "J/sample" not in narrow and said[-1] == "in the HTML report and the JSON only: J/sample"
    single, _, _, said = terminal_columns(headers, rows[:1], left=2, width=200)
    assert single == headers and said == []  # one row: nothing is "the same in every row"


def test_the_plots_legends_cover_no_data(study_report: StudyReport) -> None:
    """The legends sat inside the panels ("best" place), over points and lines; they are beside or under
    the panels now: no legend overlaps any axes of its figure."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from gpuprobe.study.report import pareto_plot, scaling_plot

    figures = [pareto_plot(study_report, H100), pareto_plot(study_report, L4), scaling_plot(study_report)]
    assert all(fig is not None for fig in figures)
    for fig in figures:
        fig.canvas.draw()
        axes = [ax for ax in fig.axes if ax.get_visible()]
        legends = [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend() is not None)]
        assert legends, fig
        for legend in legends:
            box = legend.get_window_extent()
            for ax in axes:
                assert not box.overlaps(ax.get_window_extent()), (fig.get_suptitle(), ax.get_title())
    plt.close("all")
