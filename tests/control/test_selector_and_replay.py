"""Node selection (``--nodes``) and the replay memory that survives restarts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import support

from gpuprobe.control import replay, selector
from gpuprobe.v1 import common_pb2

A = common_pb2.AgentIdentity(
    host="gpu-a", cluster="train", cloud="aws", instance_type="p5.48xlarge", region="us-east-1"
)
B = common_pb2.AgentIdentity(host="gpu-b", cluster="train", cloud="gcp", region="europe-west4")


@pytest.mark.parametrize(
    ("text", "a", "b"),
    [
        ("all", (True, False), (True, False)),
        ("gpu-a", (True, True), (False, False)),
        ("gpu-a,gpu-b", (True, True), (True, True)),
        ("host=gpu-b", (False, False), (True, True)),
        ("cluster=train", (True, False), (True, False)),
        ("cluster=train,cloud=aws", (True, False), (False, False)),
        ("cloud=aws,cloud=gcp,region=us-east-1", (True, False), (False, False)),
        ("all,cloud=gcp", (False, False), (True, False)),
        ("gpu-b,cloud=aws", (False, False), (False, True)),  # named but excluded: owes a NOT_SELECTED reply
        ("instance_type=p5.48xlarge", (True, False), (False, False)),
    ],
)
def test_selector_terms_and_matching(text: str, a: tuple[bool, bool], b: tuple[bool, bool]) -> None:
    parsed = selector.parse(text)
    assert selector.match(parsed, A) == a
    assert selector.match(parsed, B) == b


@pytest.mark.parametrize("text", ["", " , ", "colour=red", "cluster="])
def test_bad_or_empty_selectors_are_errors(text: str) -> None:
    with pytest.raises(ValueError, match="--nodes"):
        selector.parse(text)


def test_an_empty_selector_message_matches_nobody() -> None:
    from gpuprobe.v1 import control_pb2

    assert selector.match(control_pb2.NodeSelector(), A) == (False, False)


def test_replay_memory_survives_a_restart_and_forgets_expired_ids(tmp_path: Path) -> None:
    now = time.time_ns()
    store = replay.ReplayStore(tmp_path)
    store.remember("live", now + 60 * 10**9)
    store.remember("short", now + 200_000_000)
    assert "live" in store and "short" in store
    support.wait_until(lambda: time.time_ns() > now + 200_000_000, 5, "the short id's expiry")
    again = replay.ReplayStore(tmp_path)
    assert "live" in again
    assert "short" not in again  # expired: the command itself is refused as EXPIRED from now on
    assert json.loads((tmp_path / replay.FILE_NAME).read_text())["seen"].keys() >= {"live"}


def test_a_damaged_replay_file_is_kept_aside_not_silently_trusted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / replay.FILE_NAME).write_text("{not json")
    store = replay.ReplayStore(tmp_path)
    assert len(store) == 0
    assert list(tmp_path.glob("seen-commands.damaged-*"))
    assert "unreadable" in caplog.text
