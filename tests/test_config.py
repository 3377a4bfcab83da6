"""Options from file, environment and flags: precedence, errors, and the real CLI using them."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.cli import all_commands, build_parser
from gpuprobe.config import ConfigError, Option, add_options, check_keys, load_file, resolve

OPTIONS = [
    Option("interval_s", "sampling interval", float, default=0.1),
    Option("spool_dir", "spool", Path, default=Path("/var/lib/gpuprobe")),
    Option("insecure", "plaintext", is_flag=True, default=False),
    Option("collector", "addresses", multiple=True, default=[]),
    Option("api", "influx api", choices=["v1", "v2"], default="v1"),
]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, OPTIONS)
    return parser.parse_args(argv)


def test_defaults_when_no_source_sets_anything() -> None:
    values = resolve("agent", OPTIONS, parse([]), {}, None, environ={})
    assert values == {
        "interval_s": 0.1,
        "spool_dir": Path("/var/lib/gpuprobe"),
        "insecure": False,
        "collector": [],
        "api": "v1",
    }


def test_flag_beats_environment_beats_command_table_beats_top_level() -> None:
    file_data: dict[str, Any] = {"interval_s": 5.0, "api": "v2", "agent": {"interval_s": 2.0, "spool_dir": "/srv/s"}}
    env = {"GPUPROBE_INTERVAL_S": "0.5", "GPUPROBE_SPOOL_DIR": "/env/spool"}
    values = resolve("agent", OPTIONS, parse(["--interval-s", "0.05"]), file_data, Path("f.toml"), environ=env)
    assert values["interval_s"] == 0.05  # flag
    assert values["spool_dir"] == Path("/env/spool")  # environment over [agent]
    assert values["api"] == "v2"  # top-level key
    without_flag = resolve("agent", OPTIONS, parse([]), file_data, Path("f.toml"), environ=env)
    assert without_flag["interval_s"] == 0.5
    without_env = resolve("agent", OPTIONS, parse([]), file_data, Path("f.toml"), environ={})
    assert without_env["interval_s"] == 2.0  # [agent] over top level
    assert without_env["spool_dir"] == Path("/srv/s")


def test_subcommand_table_is_more_specific_than_its_group() -> None:
    file_data = {"sim": {"interval_s": 1.0, "run": {"interval_s": 3.0}}}
    assert resolve("sim.run", OPTIONS, parse([]), file_data, Path("f"), environ={})["interval_s"] == 3.0
    assert resolve("sim.load", OPTIONS, parse([]), file_data, Path("f"), environ={})["interval_s"] == 1.0


def test_lists_and_booleans_from_every_source() -> None:
    env = {"GPUPROBE_COLLECTOR": "a:1, b:2", "GPUPROBE_INSECURE": "yes"}
    values = resolve("agent", OPTIONS, parse([]), {}, None, environ=env)
    assert values["collector"] == ["a:1", "b:2"]
    assert values["insecure"] is True
    from_file = resolve("agent", OPTIONS, parse([]), {"collector": ["c:3"], "insecure": True}, Path("f"), environ={})
    assert from_file["collector"] == ["c:3"] and from_file["insecure"] is True
    argv = ["--collector", "d:4", "--collector", "e:5", "--no-insecure"]
    flags = resolve("agent", OPTIONS, parse(argv), {}, None, environ={})
    assert flags["collector"] == ["d:4", "e:5"] and flags["insecure"] is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPUPROBE_INTERVAL_S": "fast"}, "environment GPUPROBE_INTERVAL_S: bad value for interval_s"),
        ({"GPUPROBE_INSECURE": "maybe"}, "not a boolean"),
        ({"GPUPROBE_API": "v3"}, "api must be one of v1, v2"),
    ],
)
def test_bad_environment_values_name_their_source(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve("agent", OPTIONS, parse([]), {}, None, environ=env)


def test_bad_file_values_name_the_file_and_table() -> None:
    with pytest.raises(ConfigError, match=r"f.toml \[agent\]: bad value for interval_s"):
        resolve("agent", OPTIONS, parse([]), {"agent": {"interval_s": "soon"}}, Path("f.toml"), environ={})
    with pytest.raises(ConfigError, match="is a boolean"):
        resolve("agent", OPTIONS, parse([]), {"interval_s": True}, Path("f.toml"), environ={})


def test_unknown_keys_and_tables_are_errors() -> None:
    known = {"agent": {"interval_s"}, "sim.run": {"gpus"}}
    check_keys({"interval_s": 1, "agent": {"interval_s": 2}, "sim": {"run": {"gpus": 2}}}, known, Path("f"))
    with pytest.raises(ConfigError, match="unknown option 'intervall_s'"):
        check_keys({"intervall_s": 1}, known, Path("f"))
    with pytest.raises(ConfigError, match=r"unknown option 'gpus' in \[agent\]"):
        check_keys({"agent": {"gpus": 1}}, known, Path("f"))
    with pytest.raises(ConfigError, match=r"unknown table \[agnet\]"):
        check_keys({"agnet": {"interval_s": 1}}, known, Path("f"))


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_file(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("interval_s = = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_file(bad)


def test_every_command_documents_its_options_and_environment_variables() -> None:
    parser = build_parser(all_commands())
    for cmd in all_commands():
        sub = parser
        for part in cmd.name.split("."):
            action = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
            sub = action.choices[part]
        text = sub.format_help()
        for opt in cmd.options:
            assert opt.flag in text, (cmd.name, opt.flag)
            assert opt.env_var in text, (cmd.name, opt.env_var)


def gpuprobe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuprobe", *args], capture_output=True, text=True, env=env or dict(os.environ)
    )


def test_cli_takes_options_from_file_environment_and_flags(tmp_path: Path) -> None:
    from gpuprobe.sim import state
    from gpuprobe.sim.profiles import get_profile

    machines = {name: tmp_path / name for name in ("file", "env", "flag")}
    for machine in machines.values():
        state.create(machine, [get_profile("L4")])
    config = tmp_path / "gpuprobe.toml"
    config.write_text(f'[sim.load]\nstate_dir = "{machines["file"]}"\nutil = 40\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}

    def events(name: str) -> str:
        return (machines[name] / "gpu0.events").read_text()

    assert gpuprobe("--config", str(config), "sim", "load", env=env).returncode == 0
    assert " U 40 " in events("file")
    env_with = dict(env, GPUPROBE_STATE_DIR=str(machines["env"]), GPUPROBE_UTIL="55")
    assert gpuprobe("--config", str(config), "sim", "load", env=env_with).returncode == 0
    assert " U 55 " in events("env")
    result = gpuprobe(
        "--config", str(config), "sim", "load", "--state-dir", str(machines["flag"]), "--util", "70", env=env_with
    )
    assert result.returncode == 0, result.stderr
    assert " U 70 " in events("flag")
    assert events("file").count("\n") == 1 and events("env").count("\n") == 1


def test_cli_reports_config_errors_clearly(tmp_path: Path) -> None:
    config = tmp_path / "gpuprobe.toml"
    config.write_text("[sim.load]\nutill = 40\n")
    result = gpuprobe("--config", str(config), "sim", "profiles")
    assert result.returncode == 2
    assert "unknown option 'utill' in [sim.load]" in result.stderr
    result = gpuprobe("sim", "load", "--util", "lots")
    assert result.returncode == 2
    assert "bad value for util" in result.stderr
