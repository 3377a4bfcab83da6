"""The end-to-end tests' processes: every one a test starts is stopped when it ends, pass or fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_fleet_e2e import System


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    made = System(tmp_path, [])
    try:
        yield made
    finally:
        made.stop_all()
