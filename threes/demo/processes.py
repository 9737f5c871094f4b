"""The pipeline's long-running parts as child processes of the real ``threes`` commands.

``threes source run``, ``threes stream run`` and ``threes sync run`` each run
in a process group of their own (so the Spark JVM the stream job starts is
stopped with it), logging to a file. Stopping sends SIGTERM, which every
command handles by flushing and committing, waits, then kills the group of
whichever did not stop in time. Only processes started here are signalled,
by their own process-group id.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from kernel.exceptions import FatalError
from threes.pipeline.processes import Child, signal_group, spawn, terminate, threes_command

__all__ = ["Child", "PipelineProcesses", "threes_command"]

log = logging.getLogger(__name__)


class PipelineProcesses:
    """Start, watch and stop the pipeline's commands.

    Args:
        config: the pipeline YAML the commands read.
        log_dir: where each command's log goes (``<name>.log``).
        env: extra environment variables for the children.
    """

    def __init__(self, config: Path, log_dir: Path, env: dict[str, str] | None = None):
        self.config = Path(config)
        self.log_dir = Path(log_dir)
        self.env = {**os.environ, **(env or {})}
        self.children: dict[str, Child] = {}

    def start(self, name: str, args: Sequence[str]) -> Child:
        """Start ``threes -v <args>`` as ``name``.

        Raises:
            FatalError: a command of that name already runs.
        """
        if name in self.children and self.children[name].alive():
            raise FatalError(f"{name} already runs (pid {self.children[name].process.pid})")
        child = spawn(name, args, self.log_dir / f"{name}.log", self.env)
        self.children[name] = child
        return child

    def start_sources(self, offsets_topic: str = "_threes_offsets") -> Child:
        """Start every source of the config (``threes source run``) with its positions in ``offsets_topic``."""
        return self.start("sources", ["source", "run", str(self.config), "--offsets-topic", offsets_topic])

    def start_stream(self) -> Child:
        """Start the stream job (``threes stream run``)."""
        return self.start("stream", ["stream", "run", str(self.config)])

    def start_sync(self) -> Child:
        """Start every sync service of the config in one process (``threes sync run``).

        One process for the three demo services, not one each: on the 2-core
        machine the demo's figures are measured on, one process per service
        (also tried at niceness 10) mostly used more CPU in the pipeline phase
        (335-417 CPU s, three of four runs above 385, against 357) and made
        more, smaller archive objects; first flight to all sinks 171-211 s
        over four runs against 181 s (docs/nycflights13.md).
        """
        return self.start("sync", ["sync", "run", str(self.config)])

    def check(self) -> None:
        """Raise when a child has exited (they all run until stopped).

        Raises:
            FatalError: naming the command, its exit code and the end of its log.
        """
        for child in self.children.values():
            code = child.process.poll()
            if code is not None:
                raise FatalError(
                    f"`threes {' '.join(child.args)}` exited with code {code}; the end of {child.log_path}:\n"
                    f"{child.tail()}"
                )

    def stop(self, timeout_s: float = 90.0) -> dict[str, int | None]:
        """SIGTERM every child, wait up to ``timeout_s`` for all, then SIGKILL the groups still there.

        The default leaves the stream job its clean stop: the running micro-batch (up to 30 s),
        the queries' last events (up to 30 s) and the snapshot checkpoint.

        Returns:
            name -> exit code (``None`` when it had to be killed).
        """
        for child in self.children.values():
            if child.alive():
                signal_group(child.pid, 15)  # all at once: each flushes and commits in parallel
        deadline = time.monotonic() + timeout_s
        codes = {name: terminate(child, max(0.1, deadline - time.monotonic()))
                 for name, child in self.children.items()}
        self.children.clear()
        return codes
