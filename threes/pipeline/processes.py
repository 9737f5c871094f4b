"""Child processes of the real ``threes`` commands, each in a process group of its own.

``threes source run``, ``threes stream run`` and ``threes sync run`` run as
children with ``start_new_session=True``: a Ctrl-C in the terminal reaches only
the supervisor (which then stops them in order), and stopping a child's group
also stops what it started (the stream job's Spark JVM). Stopping sends
SIGTERM, which every command handles by flushing and committing, waits, then
sends SIGKILL to the group of a child that did not stop in time. Only
processes started here are signalled, by their own process-group id.

A child dies with its supervisor, even one killed by SIGKILL (which no handler sees):
on Linux each child asks the kernel for SIGTERM when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, set between ``fork`` and ``exec``), so it stops cleanly
instead of running on as an orphan beside the next ``threes run``. The kernel sends it
when the *thread* that started the child ends, so children are started from the thread
that supervises them for the whole run (the main thread). Elsewhere the children are
started as before (no parent-death signal).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


def threes_command() -> list[str]:
    """How to run ``threes`` with this interpreter (the console script next to it, else ``-c``)."""
    script = Path(sys.executable).with_name("threes")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from threes.cli import run; run()"]


@dataclass
class Child:
    """One started ``threes`` command.

    Attributes:
        name: what it is (``sources``, ``stream``, ``sync``).
        args: the ``threes`` arguments (after ``-v``).
        log_path: its stdout and stderr, appended to.
        process: the running process (its pid is also its process-group id).
        started: ``time.monotonic()`` at start.
    """

    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    started: float
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        """The process id (and process-group id)."""
        return self.process.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.process.poll() is None

    def returncode(self) -> int | None:
        """Its exit code, ``None`` while it runs (negative: killed by that signal)."""
        return self.process.poll()

    def tail(self, lines: int = 8, width: int = 300) -> str:
        """The end of its log for an error message: the last distinct error lines, else the last lines.

        Args:
            lines: at most this many lines.
            width: lines are cut at this many characters (Spark prints query plans on one line).

        Returns:
            The lines joined by newlines; empty when the log cannot be read.
        """
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [
            t for t in text
            if re.search(r"(Error|Exception)\b|\berror\b", t) and not t.lstrip().startswith("at ")
        ]
        picked = list(dict.fromkeys(errors))[-lines:] if errors else text[-lines:]
        return "\n".join(t if len(t) <= width else t[:width] + " ..." for t in picked)

    def close_log(self) -> None:
        """Close this side's handle of the log file."""
        if self._log is not None:
            self._log.close()
            self._log = None


PR_SET_PDEATHSIG = 1
"""``prctl`` option of ``<linux/prctl.h>``: the signal a process gets when its parent dies."""


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when its parent dies; ``None`` off Linux.

    ``prctl`` is looked up here, in the parent, so the child only makes the call. The child
    also checks that its parent did not die before the call (then nobody would send the
    signal): it sends ``sig`` to itself.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        log.warning("prctl is not available: children of threes run will not die with it")
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), sig)

    return preexec


def spawn(name: str, args: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> Child:
    """Start ``threes -v <args>`` in a new session, its output appended to ``log_path``.

    Args:
        name: what the child is, for messages.
        args: the ``threes`` arguments.
        log_path: its log (the folder is created).
        env: the child's whole environment (default: this process's).

    Returns:
        The started child.

    Raises:
        OSError: the command cannot be started.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    handle = log_path.open("ab")
    command = [*threes_command(), "-v", *args]
    try:
        process = subprocess.Popen(  # our own console script with our own arguments
            command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None, start_new_session=True,
            preexec_fn=parent_death_signal(),  # one prctl call, resolved before the fork
        )
    except OSError:
        handle.close()
        raise
    log.info("started %s pid=%d log=%s: threes %s", name, process.pid, log_path, " ".join(args))
    return Child(name, list(args), log_path, process, time.monotonic(), handle)


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a process group of ours; a group already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(child: Child, timeout_s: float, force: object | None = None) -> int | None:
    """Stop a child: SIGTERM to its group, wait up to ``timeout_s``, then SIGKILL the group.

    Args:
        child: a child started by :func:`spawn`.
        timeout_s: seconds its clean stop may take (flush, commit, checkpoint).
        force: an object with ``is_set()`` (a ``threading.Event``): when it is set while
            waiting (a second Ctrl-C), the group is killed at once.

    Returns:
        Its exit code, ``None`` when it had to be killed.
    """
    if child.alive():
        signal_group(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    code: int | None = None
    while True:
        code = child.process.poll()
        if code is not None:
            break
        if time.monotonic() > deadline or (force is not None and force.is_set()):  # type: ignore[attr-defined]
            log.warning("%s (pid %d) did not stop within %.0f s: killing its process group",
                        child.name, child.pid, timeout_s)
            signal_group(child.pid, signal.SIGKILL)
            try:
                child.process.wait(10)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) survived SIGKILL for 10 s", child.name, child.pid)
            code = None
            break
        time.sleep(0.1)
    # the group may hold a child (the Spark JVM) that outlives its parent briefly
    signal_group(child.pid, signal.SIGTERM)
    child.close_log()
    return code
