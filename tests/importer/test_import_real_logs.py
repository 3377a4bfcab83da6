"""Real logs of real GPUs (tests/data/nvidia-smi/, sources and licences in its README) imported into a
real InfluxDB: every value and timestamp read back equals the file's, read here independently with the
csv module and the standard library; bad rows and frozen stretches are reported as the README says.

The longer real logs of the shared realdata folder beside the clone (an H100 NVL `nvidia-smi dmon`
log without its header, MI300X and MI325X `amd-smi metric --csv` logs; sources in tests/data/README.md)
are read in place; those tests skip where the folder is absent."""

from __future__ import annotations

import csv
from collections import Counter
from datetime import datetime
from pathlib import Path

from import_helpers import Import, extract_single, field_types, influx_args, realdata, stored_points, utc_ns

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
    assert "frozen stretches (identical rows for 60 s or more under load or with a standing energy counter" in out
    assert "repeats not): 0, 0 rows not imported" in out
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


def test_real_log_steady_stretches_and_a_misread_index(influxdb: InfluxDBDatabase, gpuprobe_import: Import) -> None:
    # idle GPUs whose readings stay the same for 2 s: readings, imported (not a frozen logger)
    status, out, err = gpuprobe_import(
        "--host", "lab-h100", "--columns", GLASSES_COLUMNS, "--freeze-after", "2s", "--dry-run", GLASSES
    )  # fmt: skip
    assert status == 0, err
    assert "43 rows, 43 points, 0 bad, 0 frozen" in out
    assert "steady stretches (identical rows for 2 s or more at idle: readings, imported): 2, 2 rows" in out
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


# --- the shared real logs (read in place, never copied here; sources in tests/data/README.md) ---------

NVL_LOG = "h100nvl_x4_hibagus_sc26_2gpu_idle_load_idle_nvdmon.csv.tar.gz"
MI300X_LOG = "mi300x_x8_750W_hibagus_sc25_llm_3200-1600-256_smi_raw.csv"
MI325X_LOG = "mi325x_x8_1000W_hibagus_sc25_llm_3200-1600-256_smi_raw.csv"


def test_real_h100nvl_dmon_log_without_header_every_row_imported(
    influxdb: InfluxDBDatabase, gpuprobe_import: Import, tmp_path: Path
) -> None:
    log = extract_single(realdata(NVL_LOG), tmp_path)
    status, out, err = gpuprobe_import("--host", "nvl", "--gpu-model", "NVIDIA H100 NVL", *influx_args(influxdb), log)
    assert status == 0, err
    # integer W and °C keep idle readings equal for minutes, but a counter column moves: none is frozen
    assert "nvidia-smi dmon without header, 38440 rows, 38440 points, 0 bad, 0 frozen" in out
    assert "GPU rows not imported: 0 of 38440" in out
    assert ": 0, 0 rows not imported" in out
    assert "out-of-range value in sm: 1 (lines " in out  # GPU 1 at 05:20:17, sm% 1047011272
    points = stored_points(influxdb)
    assert Counter(p["gpu"] for p in points) == {"0": 9610, "1": 9610, "2": 9610, "3": 9610}
    # the end of GPUs 2 and 3's cool-down is there: their last readings, an hour after the load ended
    for gpu in ("2", "3"):
        tail = [p for p in points if p["gpu"] == gpu and p["time"] >= utc_ns("2025-07-24T07:50:00")]
        assert len(tail) > 250 and tail[-1]["time"] == utc_ns("2025-07-24T07:56:42")
        assert all(p["power_w"] < 80 for p in tail)
    # the idle GPUs: every reading of the 3.2 h, at idle power
    for gpu in ("0", "1"):
        idle = [p for p in points if p["gpu"] == gpu]
        assert idle[0]["time"] == utc_ns("2025-07-24T04:47:16") and idle[-1]["time"] == utc_ns("2025-07-24T07:56:42")
        assert max(p["power_w"] for p in idle) < 80


def test_real_amd_smi_logs_import_every_gpu(influxdb: InfluxDBDatabase, gpuprobe_import_amd: Import) -> None:
    for name, host, rows, last in ((MI300X_LOG, "mi300x", 930, "2025-03-31T02:16:51"),
                                   (MI325X_LOG, "mi325x", 849, "2025-04-06T04:15:25")):  # fmt: skip
        log = realdata(name)
        status, out, err = gpuprobe_import_amd("--host", host, *influx_args(influxdb), log)
        assert status == 0, err
        assert f"amd-smi metric CSV (8 GPU blocks per row), {rows} rows, {rows * 8} points, 0 bad, 0 frozen" in out
        assert "GPUs: 8" in out
        points = stored_points(influxdb, f"WHERE host = '{host}'")
        assert len(points) == rows * 8 and points[-1]["time"] == utc_ns(last)
        assert {p["vendor"] for p in points} == {"amd"}
        # the power and junction temperature of every GPU at every timestamp (N/A nowhere in these)
        assert all(p["power_w"] is not None and p["temp_c"] is not None for p in points)
        assert 100 < min(p["power_w"] for p in points) < max(p["power_w"] for p in points) < 1100
