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
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from connectors.exceptions import FatalError

log = logging.getLogger(__name__)


def threes_command() -> list[str]:
    """How to run ``threes`` with this interpreter (the console script next to it, else ``-m``)."""
    script = Path(sys.executable).with_name("threes")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from connectors.cli import run; run()"]


@dataclass
class Child:
    """One started command.

    Attributes:
        name: ``sources``, ``stream`` or ``sync``.
        args: the ``threes`` arguments.
        log_path: its stdout and stderr.
        process: the running process.
        started: ``time.monotonic()`` at start.
    """

    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    started: float
    _log: IO[bytes] | None = None

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.process.poll() is None

    def tail(self, lines: int = 8, width: int = 300) -> str:
        """The end of its log for an error message: the last distinct error lines, else the last lines.

        Lines are cut at ``width`` characters (Spark prints query plans on one line).
        """
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [t for t in text if re.search(r"(Error|Exception)\b", t) and not t.lstrip().startswith("at ")]
        picked = list(dict.fromkeys(errors))[-lines:] if errors else text[-lines:]
        return "\n".join(t if len(t) <= width else t[:width] + " ..." for t in picked)


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
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        handle = log_path.open("ab")
        command = [*threes_command(), "-v", *args]
        process = subprocess.Popen(  # noqa: S603 - our own console script with our own arguments
            command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
            start_new_session=True,
        )
        child = Child(name, list(args), log_path, process, time.monotonic(), handle)
        self.children[name] = child
        log.info("started %s pid=%d log=%s: threes %s", name, process.pid, log_path, " ".join(args))
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
                _signal_group(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        codes: dict[str, int | None] = {}
        for name, child in self.children.items():
            try:
                codes[name] = child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not stop within %.0f s: killing its process group",
                            name, child.process.pid, timeout_s)
                _signal_group(child.process.pid, signal.SIGKILL)
                child.process.wait(10)
                codes[name] = None
            # the group may hold a child (the Spark JVM) that outlives its parent briefly
            _signal_group(child.process.pid, signal.SIGTERM)
            if child._log is not None:
                child._log.close()
        self.children.clear()
        return codes


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
