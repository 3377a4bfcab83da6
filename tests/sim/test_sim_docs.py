"""docs/simulator.md's ground-truth tables say exactly what sim/profiles.py holds."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gpuprobe.sim import thermal
from gpuprobe.sim.profiles import PROFILES, GpuProfile

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
SOURCES = {"datasheet", "ground truth", "model"}


def table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells stripped) of the first markdown table after ``marker``, header first."""
    start = text.index(marker)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if all(set(c) <= set("-: ") for c in cells):
            continue  # the separator row
        rows.append([c.replace("\\|", "|") for c in cells])
    return rows


def parse_cell(cell: str, like: object) -> object:
    if cell == "derived":  # an optional parameter left to its default rule (virt_overhead_pct)
        return None
    if isinstance(like, bool):
        assert cell in ("yes", "no"), cell
        return cell == "yes"
    if isinstance(like, int):
        return int(cell, 0)
    if isinstance(like, float):
        return float(cell)
    return cell


def test_ground_truth_table_matches_profiles():
    rows = table_after(DOC.read_text(), "<!-- ground-truth table")
    header, body = rows[0], rows[1:]
    assert header[:3] == ["parameter", "unit", "source"]
    assert header[3:] == list(PROFILES), "one column per profile, in PROFILES order"
    fields = [f.name for f in dataclasses.fields(GpuProfile) if f.name != "name"]
    keys = [row[0].strip("`") for row in body]
    assert keys == fields, "one row per GpuProfile field, in declaration order"
    for row in body:
        key, source, cells = row[0].strip("`"), row[2], row[3:]
        assert source in SOURCES, (key, source)
        for profile_name, cell in zip(header[3:], cells, strict=True):
            want = getattr(PROFILES[profile_name], key)
            got = parse_cell(cell, want)
            assert got == want and type(got) is type(want), (key, profile_name, cell, want)


def test_thermal_ground_truth_is_marked_as_such():
    rows = {row[0].strip("`"): row for row in table_after(DOC.read_text(), "<!-- ground-truth table")[1:]}
    thermal_keys = (
        "idle_w", "ambient_c", "r_th_c_per_w", "tau_s", "r_fast_c_per_w", "tau_fast_s", "inlet_c_per_w",
        "inlet_tau_s", "slot_offset_c", "fan_conductance_floor", "mem_r_th_c_per_w", "mem_tau_s",
    )  # fmt: skip
    for key in thermal_keys:
        assert rows[key][2] == "ground truth", key
    for key in ("limit_default_w", "slowdown_c", "sm_clock_max_mhz", "memory_total_bytes", "nvml_name"):
        assert rows[key][2] == "datasheet", key


def test_derived_figures_match_profiles():
    rows = table_after(DOC.read_text(), "Derived figures a fit should recover")
    assert rows[0][0] == "profile"
    assert [row[0] for row in rows[1:]] == list(PROFILES)
    assert rows[0][1:] == ["P idle → full (W)", "T idle → T_ss full (°C)", "fan at full (%)", "R_th (°C/W)", "τ (s)"]
    for name, power, temps, fan, r_th, tau in rows[1:]:
        p = PROFILES[name]
        p_idle, p_full = (float(x) for x in power.split("→"))
        t_idle, t_full = (float(x) for x in temps.split("→"))
        assert p_idle == p.power_w(0) and p_full == p.power_w(100)
        assert t_idle == pytest.approx(thermal.steady_temp_c(p, p.power_w(0)), abs=0.005)
        assert t_full == pytest.approx(thermal.steady_temp_c(p, p.power_w(100)), abs=0.005)
        # the doc's claim: stock parameters never reach thermal slowdown at full load, not even with eight
        # GPUs at full load warming the inlet air
        assert thermal.steady_temp_c(p, p_full, 8 * p_full) < p.slowdown_c
        truth = thermal.truth_at(p, p_full, p_full)
        assert fan == ("—" if truth.fan_pct is None else f"{truth.fan_pct:.1f}")
        assert float(r_th) == pytest.approx(truth.r_th_c_per_w, abs=0.00005)
        assert float(tau) == pytest.approx(truth.tau_s, abs=0.005)
