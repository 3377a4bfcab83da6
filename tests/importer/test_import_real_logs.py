"""Real logs of real GPUs (tests/data/nvidia-smi/, sources and licences in its README) imported into a
real InfluxDB: every value and timestamp read back equals the file's, read here independently with the
csv module and the standard library; bad rows and frozen stretches are reported as the README says."""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from import_helpers import Import, field_types, influx_args, stored_points

from gpuprobe.devservices import InfluxDBDatabase

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
GLASSES = DATA / "gpu_glasses_8xh100.csv"
GLASSES_COLUMNS = (
    "time=timestamp,gpu=gpu,mem_used_bytes=memory.used:MiB,mem_total_bytes=memory.total:MiB,"
    "power_w=power.draw,temp_c=temperature.gpu"
)


def glasses_expected() -> list[tuple[int, str, int, int, float, float]]:
    rows = []
    with GLASSES.open(newline="") as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            moment = datetime.fromisoformat(row["timestamp"])  # carries its +08:00
            time_ns = int(moment.timestamp()) * 1_000_000_000
            rows.append(
                (
                    time_ns,
                    row["gpu"],
                    int(row["memory.used"]) * 1048576,
                    int(row["memory.total"]) * 1048576,
                    float(row["power.draw"]),
                    float(row["temperature.gpu"]),
                )
            )
    return sorted(rows, key=lambda r: (r[0], int(r[1])))


def test_real_8xh100_log_round_trips_exactly(influxdb: InfluxDBDatabase, gpuprobe_import: Import) -> None:
    # the file's times carry their zone (+08:00): --timezone does not change them
    zone = ["--timezone", "America/New_York"]
    status, out, err = gpuprobe_import(
        "--host", "lab-h100", "--columns", GLASSES_COLUMNS, *zone, *influx_args(influxdb), GLASSES
    )  # fmt: skip
    assert status == 0, err
    assert "rows read: 43 in 1 file(s)" in out
    assert "CSV mapped by --columns, 43 rows, 43 points, 0 bad, 0 frozen" in out
    assert "columns not imported (not in the gpu schema): index" in out
    assert "bad rows (skipped): 0" in out
    assert "frozen stretches (identical readings for 60 s or more; first row imported, repeats not): 0" in out
    assert "GPUs: 8" in out
    assert "host lab-h100 gpu 0: 6 points, 2025-09-08T09:26:50.000Z .. 2025-09-08T09:26:58.000Z" in out
    assert "host lab-h100 gpu 7: 5 points, 2025-09-08T09:26:50.000Z .. 2025-09-08T09:26:56.000Z" in out

    points = stored_points(influxdb)
    stored = [
        (p["time"], p["gpu"], p["mem_used_bytes"], p["mem_total_bytes"], p["power_w"], p["temp_c"]) for p in points
    ]
    assert stored == glasses_expected()
    assert {(p["host"], p["source"], p.get("model"), p.get("uuid")) for p in points} == {
        ("lab-h100", "import", None, None)
    }
    assert field_types(influxdb) == {
        "mem_used_bytes": "integer",
        "mem_total_bytes": "integer",
        "power_w": "float",
        "temp_c": "float",
    }


def test_real_log_frozen_stretches_and_a_misread_index(influxdb: InfluxDBDatabase, gpuprobe_import: Import) -> None:
    status, out, err = gpuprobe_import(
        "--host", "lab-h100", "--columns", GLASSES_COLUMNS, "--freeze-after", "2s", "--dry-run", GLASSES
    )  # fmt: skip
    assert status == 0, err
    assert "43 rows, 41 points, 0 bad, 2 frozen" in out
    assert "frozen stretches (identical readings for 2 s or more; first row imported, repeats not): 2, 2 rows" in out
    assert (
        "  host lab-h100 gpu 1: 2025-09-08T09:26:51.000Z .. 2025-09-08T09:26:53.000Z (2 s, 1 repeated rows, "
        "gpu_glasses_8xh100.csv lines 11-19)" in out
    )
    assert (
        "  host lab-h100 gpu 1: 2025-09-08T09:26:54.000Z .. 2025-09-08T09:26:56.000Z (2 s, 1 repeated rows, "
        "gpu_glasses_8xh100.csv lines 27-35)" in out
    )

    # Read as nvidia-smi's own CSV, its `index` column (all 0) would be the GPU index: eight rows of
    # "GPU 0" per timestamp. The importer keeps the first and reports the others instead of letting
    # them overwrite each other silently.
    status, out, err = gpuprobe_import("--host", "lab-h100", *influx_args(influxdb), GLASSES)
    assert status == 0, err
    assert "nvidia-smi CSV, 43 rows, 6 points, 37 bad, 0 frozen" in out
    assert "duplicate timestamp for the same GPU (the first row is kept): 37 (lines gpu_glasses_8xh100.csv:3," in out
    assert "columns not imported (not in the gpu schema): gpu" in out
    assert [p["power_w"] for p in stored_points(influxdb)] == [74.01, 74.06, 74.05, 74.03, 74.0, 74.05]
