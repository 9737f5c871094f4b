"""One ``threes run`` per pipeline file: an exclusive ``flock`` on a lock file beside it.

The lock file is ``<folder of the YAML>/.threes/run/<name>-<hash>.lock``, the hash taken
from the file's resolved path, so every way of naming the same YAML (relative path,
symlink, another working folder) meets the same lock. It holds the holder's PID for the
message. The kernel drops a ``flock`` when the last descriptor of its open file closes,
so a holder that dies (even by SIGKILL) frees it at once: no stale lock to clean up.
The descriptor is not inheritable (PEP 446) and the children are started with
``close_fds``, so a child that outlives its supervisor never keeps the lock.

``--force`` takes over from a holder: SIGTERM to it (it stops its parts in order, each
flushing and committing, as on Ctrl-C), up to ``takeover_timeout_s`` for it to exit,
then SIGKILL (its parts then get SIGTERM from the kernel: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import signal
import time
from pathlib import Path

from kernel.exceptions import FatalError

log = logging.getLogger(__name__)


def lock_path(config: Path) -> Path:
    """Where the lock of pipeline file ``config`` lives (see the module docstring)."""
    resolved = config.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return resolved.parent / ".threes" / "run" / f"{resolved.stem}-{digest}.lock"


def _is_threes(pid: int) -> bool:
    """Whether ``pid`` runs ``threes`` (``/proc``; ``True`` where it cannot be told)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return b"threes" in cmdline


class RunLock:
    """The exclusive lock of one pipeline file, held while ``threes run`` runs it.

    Args:
        config: the pipeline YAML.
        takeover_timeout_s: with ``force``, how long the holder gets to stop after SIGTERM, seconds.
    """

    def __init__(self, config: Path, takeover_timeout_s: float = 60.0):
        self.config = config
        self.path = lock_path(config)
        self.takeover_timeout_s = takeover_timeout_s
        self._fd: int | None = None

    def holder(self) -> int | None:
        """The PID written by the holder, ``None`` when unreadable."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def _try(self) -> bool:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        return True

    def acquire(self, force: bool = False) -> None:
        """Take the lock, or (``force``) take it over from the running holder.

        Raises:
            FatalError: another process holds it (the message names its PID and ``--force``), or
                with ``force`` the holder is not a ``threes`` process or did not let go.
        """
        if self._try():
            return
        pid = self.holder()
        who = f"pid {pid}" if pid else "a process whose pid is not recorded"
        if not force:
            self.release()
            raise FatalError(
                f"{self.config} is already run by another `threes run` ({who}; lock {self.path}): stop it first, "
                "or pass --force to stop it and take over"
            )
        if pid is None or pid == os.getpid() or not _is_threes(pid):
            self.release()
            raise FatalError(f"--force: the holder of {self.path} ({who}) is not a `threes run` this can stop")
        log.warning("run: --force: stopping the `threes run` of %s (pid %d), up to %.0f s", self.config, pid,
                    self.takeover_timeout_s)
        self._signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.takeover_timeout_s
        while time.monotonic() < deadline:
            if self._try():
                return
            time.sleep(0.2)
        log.warning("run: --force: pid %d did not stop within %.0f s: killing it", pid, self.takeover_timeout_s)
        self._signal(pid, signal.SIGKILL)
        for _ in range(50):
            if self._try():
                return
            time.sleep(0.2)
        self.release()
        raise FatalError(f"--force: pid {pid} still holds {self.path} after SIGKILL")

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def release(self) -> None:
        """Let go of the lock (closing the descriptor drops the ``flock``); the file stays."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
