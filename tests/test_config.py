"""Options from file, environment and flags: precedence, errors, and the real CLI using them."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprobe.app.cli import all_commands, build_parser
from gpuprobe.config import (
    DURATION_FORMS,
    PER_COMMAND_KEYS,
    Command,
    ConfigError,
    Option,
    add_options,
    check_keys,
    format_duration,
    format_time_ns,
    load_file,
    parse_duration,
    parse_duration_or_none,
    parse_whole_seconds,
    resolve,
)

OPTIONS = [
    Option("interval_s", "sampling interval", float, default=0.1),
    Option("spool_dir", "spool", Path, default=Path("/var/lib/gpuprobe")),
    Option("insecure", "plaintext", is_flag=True, default=False),
    Option("collector", "addresses", multiple=True, default=[]),
    Option("api", "influx api", choices=["v1", "v2"], default="v1"),
]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
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
            if opt.flag_only:
                where = "command line only"
            elif opt.name in PER_COMMAND_KEYS:
                where = "command line or this command's table in the file"
            else:
                where = opt.env_var
            assert where in " ".join(text.split()), (cmd.name, opt.name, where)


def test_a_key_that_means_something_else_in_each_command_is_set_only_for_its_own_command(tmp_path: Path) -> None:
    """A top-level `gpus = 2`, meant for `sim run` (a number of GPUs), made `probe start` aim at GPU 2."""
    commands = {c.name: c for c in all_commands()}
    known = {name: {key for o in c.options for key in o.file_keys} for name, c in commands.items()}
    path = tmp_path / "gpuprobe.toml"
    for key in sorted(PER_COMMAND_KEYS):
        with pytest.raises(ConfigError, match=rf"top-level '{key}' .* put it in the table of the command it is for"):
            check_keys({key: "2"}, known, path)
    with pytest.raises(ConfigError, match=r"\[probe\.start\], \[sim\.run\], \[study\.start\]"):
        check_keys({"gpus": 2}, known, path)
    # in its own command's table it is that command's; neither another table nor GPUPROBE_GPUS reaches past it
    data = {"sim": {"run": {"gpus": 2}}}
    check_keys(data, known, path)
    env = {"GPUPROBE_GPUS": "2"}
    start = commands["probe.start"]
    assert resolve("probe.start", start.options, argparse.Namespace(), data, path, environ=env)["gpus"] is None
    run = commands["sim.run"]
    assert resolve("sim.run", run.options, argparse.Namespace(), data, path, environ=env)["gpus"] == 2
    # the command line still sets it, and so does the command's table
    given = resolve("probe.start", start.options, argparse.Namespace(gpus=[1]), data, path, environ=env)
    assert given["gpus"] == [1]
    own = resolve("probe.start", start.options, argparse.Namespace(), {"probe": {"start": {"gpus": "0,3"}}}, path)
    assert own["gpus"] == [0, 3]
    path.write_text("gpus = 2\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuprobe.app", "--config", str(path), "probe", "start", "--workload", "idle"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")},
    )
    assert done.returncode == 2 and "top-level 'gpus'" in done.stderr, done.stderr


def gpuprobe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuprobe.app", *args], capture_output=True, text=True, env=env or dict(os.environ)
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
    assert "unknown option 'utill' in [sim.load] (did you mean 'util'?)" in result.stderr
    result = gpuprobe("sim", "load", "--util", "lots")
    assert result.returncode == 2
    assert "bad value for util" in result.stderr


def test_no_option_is_taken_from_an_abbreviation() -> None:
    """`--influx-ur` used to pass as `--influx-url`: a typo that silently worked, until a new option
    with the same start made it ambiguous."""
    parser = build_parser(all_commands())
    with pytest.raises(SystemExit):
        parser.parse_args(["collector", "--influx-ur", "http://x:8086"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-lev", "debug", "sim", "profiles"])
    result = gpuprobe("install", "collector", "--influx-ur", "http://influx:8086", "--root", "/nonexistent/root")
    assert result.returncode == 2 and "--influx-ur" in result.stderr, result.stderr
    assert not Path("/nonexistent/root").exists()


def test_force_is_never_taken_from_the_environment_or_a_config_file(tmp_path: Path) -> None:
    """GPUPROBE_FORCE=1, meant for `install`, made `probe keygen` overwrite the operator's key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    keys = tmp_path / "keys"
    assert gpuprobe("probe", "keygen", "--out", str(keys), env=env).returncode == 0
    key = (keys / "operator.key").read_bytes()
    config = tmp_path / "gpuprobe.toml"
    config.write_text("force = true\n[probe.keygen]\nforce = true\n")
    again = gpuprobe("--config", str(config), "probe", "keygen", "--out", str(keys), env={**env, "GPUPROBE_FORCE": "1"})
    assert again.returncode != 0, again.stdout
    assert (keys / "operator.key").read_bytes() == key, "the key was overwritten"
    assert "GPUPROBE_FORCE" in again.stderr and "taken only from the command line" in again.stderr, again.stderr
    root = tmp_path / "root"
    assert gpuprobe("install", "agent", "--collector", "c1", "--root", str(root), env=env).returncode == 0
    unit = root / "etc/systemd/system/gpuprobe-agent.service"
    unit.write_text("# edited\n")
    refused = gpuprobe("install", "agent", "--collector", "c2", "--root", str(root), env={**env, "GPUPROBE_FORCE": "1"})
    assert refused.returncode == 1 and unit.read_text() == "# edited\n", refused.stderr
    # the flag itself still works
    forced = gpuprobe("probe", "keygen", "--out", str(keys), "--force", env=env)
    assert forced.returncode == 0 and (keys / "operator.key").read_bytes() != key


def test_every_parser_of_the_project_refuses_abbreviations() -> None:
    def walk(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = [parser]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found += walk(sub)
        return found

    parsers = walk(build_parser(all_commands()))
    assert len(parsers) > 20 and all(p.allow_abbrev is False for p in parsers), [
        p.prog for p in parsers if p.allow_abbrev
    ]
    # the tools and benches beside the CLI too: every ArgumentParser(...) call says allow_abbrev=False
    import ast

    repo = Path(__file__).resolve().parents[1]
    missing = []
    for path in repo.rglob("*.py"):
        if any(part in (".venv", "node_modules", "build") or part.startswith(".") for part in path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            is_parser = isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser"
            if is_parser and not any(k.arg == "allow_abbrev" for k in node.keywords):
                missing.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert not missing, f"ArgumentParser without allow_abbrev=False: {missing}"


def test_a_misspelled_option_gets_its_subcommands_usage_and_a_suggestion() -> None:
    result = gpuprobe("agent", "--colector", "c1:7447", "--check")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: gpuprobe agent "), result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuprobe agent: error: unrecognized arguments: --colector"), last
    assert last.endswith("(did you mean --collector?)"), last
    nested = gpuprobe("probe", "start", "--workloadd", "matmul")
    assert nested.returncode == 2 and nested.stderr.startswith("usage: gpuprobe probe start "), nested.stderr
    assert "(did you mean --workload?)" in nested.stderr
    # nothing close: no guess
    far = gpuprobe("agent", "--zzzzzz")
    assert far.returncode == 2 and "did you mean" not in far.stderr and "--zzzzzz" in far.stderr


def test_global_options_work_anywhere_on_the_line(tmp_path: Path) -> None:
    parser = build_parser(all_commands())
    for argv in (
        ["--log-level", "debug", "probe", "status"],
        ["probe", "--log-level", "debug", "status"],
        ["probe", "status", "--log-level", "debug"],
    ):
        assert parser.parse_args(argv).log_level == "debug", argv
    # not given: the top level's default stays
    assert parser.parse_args(["probe", "status"]).log_level in ("debug", "info", "warning", "error")
    config = tmp_path / "gpuprobe.toml"
    config.write_text('[agent]\ncollector = ["from-file:7447"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    checked = gpuprobe("agent", "--check", "--config", str(config), "--log-level", "warning", env=env)
    assert checked.returncode == 0, checked.stderr
    assert "collector        from-file:7447" in checked.stdout


# --- durations ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("30.5", 30.5),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("7d", 604800.0),
        ("1.5m", 90.0),
        ("2min", 120.0),
        (" 2 m ", 120.0),
        (".5", 0.5),
        ("0", 0.0),
        ("1e-05", 1e-05),  # how TOML floats reach the parser (str of a float)
    ],
)
def test_every_duration_form_parses_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text", ["", "soon", "-1s", "+5", "2x", "1w", "s", "inf", "nan", "1e400", "5 s s"])
def test_a_bad_duration_says_which_forms_are_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration"):
        parse_duration(text)


def test_whole_seconds_and_optional_durations() -> None:
    assert parse_whole_seconds("1m") == 60 and isinstance(parse_whole_seconds("30"), int)
    with pytest.raises(ValueError, match="not a whole number of seconds"):
        parse_whole_seconds("1.5")
    assert parse_duration_or_none("") is None and parse_duration_or_none("90d") == 90 * 86400.0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(604800.0, "7d"), (3600.0, "1h"), (600.0, "10m"), (90.0, "90s"), (0.1, "100ms"), (0.05, "50ms"), (0.0, "0s")],
)
def test_defaults_are_shown_in_a_form_the_parser_reads_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


DURATIONS = [
    Option("wait", "how long to wait", parse_duration, 5.0),
    Option("timeout", "request timeout", parse_duration, 30.0),
    Option("period", "update period", parse_duration, 0.1),
]


def parse_durations(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_options(parser, DURATIONS)
    return parser.parse_args(argv)


def test_a_bad_duration_names_the_option_and_the_accepted_forms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"environment GPUPROBE_WAIT: bad value for wait: not a duration") as e:
        resolve("probe.status", DURATIONS, parse_durations([]), {}, None, environ={"GPUPROBE_WAIT": "soon"})
    assert DURATION_FORMS in str(e.value)
    with pytest.raises(ConfigError, match=r"f.toml \[probe\]: bad value for wait: not a duration"):
        resolve("probe.status", DURATIONS, parse_durations([]), {"probe": {"wait": "2 weeks"}}, Path("f.toml"), {})
    with pytest.raises(SystemExit):
        parse_durations(["--wait=-3s"])
    assert "argument --wait: command line: bad value for wait: not a duration" in capsys.readouterr().err
    result = gpuprobe("probe", "status", "--refresh", "soon")
    assert result.returncode == 2
    assert "--refresh" in result.stderr and DURATION_FORMS in result.stderr, result.stderr


def test_durations_come_from_every_source_in_every_form() -> None:
    file_data = {"probe": {"wait": "2m"}, "timeout": 7}
    values = resolve("probe.status", DURATIONS, parse_durations(["--period", "250ms"]), file_data, Path("f"), {})
    assert values == {"wait": 120.0, "timeout": 7.0, "period": 0.25}
    env = {"GPUPROBE_WAIT": "1.5", "GPUPROBE_TIMEOUT": "1h"}
    assert resolve("probe.status", DURATIONS, parse_durations([]), file_data, Path("f"), env)["timeout"] == 3600.0


def test_the_old_unit_suffixed_spellings_are_refused(tmp_path: Path) -> None:
    # nothing has been released, so a renamed option has one spelling; a typo of it is refused, not ignored
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPROBE_")}
    result = gpuprobe("model", "--influx-timeout-s", "5", env=env)
    assert result.returncode == 2 and "--influx-timeout-s" in result.stderr, result.stderr
    config = tmp_path / "gpuprobe.toml"
    config.write_text("[model]\ninflux_timeout_s = 5\n")
    result = gpuprobe("--config", str(config), "model", env=env)
    assert result.returncode == 2 and "influx_timeout_s" in result.stderr, result.stderr
    assert "deprecated" not in result.stderr


def _help_of(parser: argparse.ArgumentParser, cmd: Command) -> str:
    sub = parser
    for part in cmd.name.split("."):
        action = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
        sub = action.choices[part]
    return sub.format_help()


# Option names that say "a length of time": every such option must be a duration option.
_DURATION_NAME = re.compile(
    r"(^|_)(interval|timeout|grace|keepalive|retry|lifetime|skew|age|linger|backoff|wait|refresh|duration|"
    r"baseline|warmup|cooldown|idle|steady|in|period|watchdog|retention|resample|window|after)$"
)


def test_every_duration_option_of_every_command_says_duration_in_its_help() -> None:
    commands = all_commands()
    parser = build_parser(commands)
    checked = 0
    for cmd in commands:
        text = " ".join(_help_of(parser, cmd).split())  # argparse wraps lines anywhere
        for opt in cmd.options:
            looks_like_one = bool(_DURATION_NAME.search(opt.name)) or re.search(r"_m?s$", opt.name) is not None
            if opt.name.endswith("_per_s") or opt.choices:  # a rate, or a choice of words (--ack-after wal|sink)
                continue
            assert opt.is_duration or not looks_like_one, f"{cmd.name} {opt.flag} looks like a duration"
            assert not re.search(r"_m?s$", opt.name), f"{cmd.name} {opt.flag}: a duration's name carries no unit"
            if opt.is_duration:
                checked += 1
                assert f"{opt.flag} DURATION " in text, (cmd.name, opt.flag)
                own_help = rf"{re.escape(opt.flag)} DURATION (?:(?! --).)*?\(e\.g\. 30s, 2m;"  # up to the next flag
                assert re.search(own_help, text), (cmd.name, opt.flag)
                if opt.default is not None:
                    assert f"default {format_duration(opt.default)})" in text, (cmd.name, opt.flag)
    assert checked > 40  # every part's commands took part


@pytest.mark.parametrize(("given", "policy"), [(None, ""), ("", ""), ("0", ""), ("90d", "90d"), ("36h", "36h")])
def test_the_collector_turns_its_retention_duration_into_an_influxql_duration(given: str | None, policy: str) -> None:
    from gpuprobe.collector.cli import config_from_options

    collector = next(c for c in all_commands() if c.name == "collector")
    env = {"GPUPROBE_INSECURE": "true"} | ({} if given is None else {"GPUPROBE_INFLUX_RETENTION": given})
    values = resolve("collector", collector.options, argparse.Namespace(), {}, None, environ=env)
    assert config_from_options(values).influx.retention == policy  # "" is CREATE ... DURATION INF


def test_the_agent_docs_show_each_duration_default_as_help_does() -> None:
    from gpuprobe.agent.options import AGENT_OPTIONS

    text = (Path(__file__).resolve().parent.parent / "docs" / "agent.md").read_text()
    for opt in (o for o in AGENT_OPTIONS if o.is_duration and o.default is not None):
        row = re.search(rf"^\| `{re.escape(opt.flag)}` \| `{opt.env_var}` \| ([^|]*) \|", text, re.MULTILINE)
        assert row is not None and row[1].strip() == format_duration(opt.default), (opt.flag, row and row[1])


def test_message_times_are_iso_utc_and_read_back_by_model_from() -> None:
    from gpuprobe.model.cli import parse_time

    assert format_time_ns(1_796_346_123 * 10**9) == "2026-12-04T01:02:03Z"
    assert format_time_ns(1_796_346_123 * 10**9 + 45_600_000) == "2026-12-04T01:02:03.045Z"
    for t_ns in (1_796_346_123 * 10**9, 1_796_346_123 * 10**9 + 45_000_000):
        assert parse_time(format_time_ns(t_ns)) == t_ns
