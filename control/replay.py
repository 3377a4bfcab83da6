"""Part: control. The agent's replay memory: ids of commands already seen, kept until each command expires.

Stored as one small JSON file (``seen-commands.json`` in the control agent's state directory),
rewritten atomically (temporary file, fsync, rename) *before* the agent acts on a command, so an
agent restarted at any moment still refuses a command it accepted before as REPLAYED. Entries are
dropped once their command has expired: an expired command is refused as EXPIRED anyway, and the
agents' maximum command lifetime (default 1 h) bounds the file's size.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "seen-commands.json"


class ReplayStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        state_dir.mkdir(parents=True, exist_ok=True)
        self._seen: dict[str, int] = {}
        try:
            data = json.loads(self.path.read_text())
            self._seen = {str(k): int(v) for k, v in data.get("seen", {}).items()}
        except FileNotFoundError:
            pass
        except (ValueError, AttributeError, TypeError) as e:
            # A damaged file must not make the agent accept old commands silently: keep it aside.
            aside = self.path.with_suffix(f".damaged-{int(time.time())}")
            self.path.replace(aside)
            log.error("replay memory %s was unreadable (%s); moved to %s", self.path, e, aside)
        self._prune(time.time_ns())

    def _prune(self, now_ns: int) -> None:
        self._seen = {k: v for k, v in self._seen.items() if v > now_ns}

    def __contains__(self, command_id: str) -> bool:
        return command_id in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, command_id: str, expires_at_unix_ns: int) -> None:
        """Record ``command_id`` durably (returns once it is on disk)."""
        self._prune(time.time_ns())
        self._seen[command_id] = expires_at_unix_ns
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump({"version": 1, "seen": self._seen}, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
