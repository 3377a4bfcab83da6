"""`gpuprobe demo` runs end to end and its summary agrees with the simulator's ground truth."""

from __future__ import annotations

import json
import subprocess
import sys


def test_demo_prints_a_summary_that_matches_ground_truth() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuprobe", "demo", "--idle-s", "1", "--steady-s", "4", "--cooldown-s", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "steady load for 4 s" in result.stderr  # progress is shown while it runs
    table, _, rest = result.stdout.partition("[")
    assert "H100-SXM5-80GB" in table and "RTX-4090" in table
    rows = json.loads("[" + rest[: rest.rindex("]") + 1])
    assert len(rows) == 6
    for row in rows:
        assert abs(row["energy_error_pct"]) < 0.5
        assert abs(row["temp_end_of_steady_c"] - row["temp_rc_predicted_c"]) <= 0.5
        assert row["temp_end_of_steady_c"] > row["temp_start_c"]  # the load heated every GPU
    capped = {row["profile"] for row in rows if row["power_capped"]}
    assert capped == {"H100-SXM5-80GB", "A100-SXM4-80GB"}  # the two GPUs run at 100 % hit their limit
