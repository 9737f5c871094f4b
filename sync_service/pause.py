"""An operator's pause of the sync services (``threes run``'s ``POST /parts/sync/pause``).

While the file named by ``$THREES_PAUSE_FILE`` exists, every sync service of the process
consumes nothing: it pauses all its assigned partitions (``Consumer.pause``), and those
assigned later at once in the rebalance callback, so a rebalance never resumes them; it
hands no batch to its sinks; it keeps calling ``consume()``, so the group keeps it as a
member and its partitions stay with it. The batches already in flight finish and their
offsets are committed; nothing else moves. Deleting the file resumes. A file, not a signal:
a restarted process starts paused, and no signal can reach a process before its handler.
"""

from __future__ import annotations

import os
import time

PAUSE_FILE_ENV = "THREES_PAUSE_FILE"
"""The variable naming the pause file (unset: the service is never paused this way)."""


class OperatorPause:
    """Whether the operator paused this process, read from the pause file at most every ``every_s`` seconds.

    Args:
        path: the pause file (``None``: never paused).
        every_s: how often the file is looked at, seconds (a ``stat`` call).
    """

    def __init__(self, path: str | None, every_s: float = 0.2):
        self.path = path
        self.every_s = every_s
        self.active = bool(path) and os.path.exists(path or "")
        self._checked = time.monotonic()

    @classmethod
    def from_env(cls) -> OperatorPause:
        """The pause of ``$THREES_PAUSE_FILE``."""
        return cls(os.environ.get(PAUSE_FILE_ENV) or None)

    def check(self) -> bool:
        """Whether the service is paused now (the file is looked at again when ``every_s`` passed)."""
        if self.path is not None:
            now = time.monotonic()
            if now - self._checked >= self.every_s:
                self._checked = now
                self.active = os.path.exists(self.path)
        return self.active
