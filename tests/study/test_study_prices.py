"""The prices file of `gpuprobe study report --prices FILE` (gpuprobe.study.prices): what it accepts, and
a clear error naming the file and the key for anything else (exit status 2, before InfluxDB is asked)."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_synthetic import StudyCommand

from gpuprobe.errors import ConfigError
from gpuprobe.study.prices import load_prices


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_instance_types_and_prices_per_hour(tmp_path: Path) -> None:
    path = write(tmp_path, '# on demand\n"p5.48xlarge" = 98.32\n"g6.12xlarge" = 4.6016\nlab-box = 0\nsmall = 3\n')
    assert load_prices(path) == {"p5.48xlarge": 98.32, "g6.12xlarge": 4.6016, "lab-box": 0.0, "small": 3.0}
    assert all(type(v) is float for v in load_prices(path).values())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("p5.48xlarge = 98.32\n", r"'p5' is a table with keys '48xlarge' \(a dotted key: quote it, \"p5\.48xlarge\""),
        ('[prices]\n"p5.48xlarge" = 98.32\n', r"'prices' is a table"),
        ('"p5.48xlarge" = "98.32"\n', r"the price of 'p5.48xlarge' is a string \('98.32'\), not a number"),
        ('"p5.48xlarge" = true\n', r"is a boolean \(true\), not a number"),
        ('"p5.48xlarge" = [1, 2]\n', r"is an array, not a number"),
        ('"p5.48xlarge" = -1\n', r"must be a finite number ≥ 0 \(USD per hour\), not -1"),
        ('"p5.48xlarge" = inf\n', r"must be a finite number ≥ 0"),
        ('"" = 1\n', r"an empty instance type"),
        ('"p5.48xlarge" = \n', r"is not valid TOML"),
    ],
)
def test_anything_else_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_prices(path)
    assert str(path) in str(caught.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"prices file .*nope.toml does not exist"):
        load_prices(tmp_path / "nope.toml")


def test_the_command_refuses_a_bad_prices_file_before_reading(tmp_path: Path, gpuprobe_study: StudyCommand) -> None:
    path = write(tmp_path, '"p5.48xlarge" = "expensive"\n')
    # no InfluxDB at this address: the file is checked first
    status, out, err = gpuprobe_study(None, "some-study", "--prices", path, "--influx-url", "http://127.0.0.1:9")
    assert status == 2, err
    assert out == ""
    assert f"prices file {path}: the price of 'p5.48xlarge' is a string ('expensive')" in err
    status, _, err = gpuprobe_study(None, "some-study", "--prices", tmp_path / "missing.toml")
    assert status == 2 and "does not exist" in err
