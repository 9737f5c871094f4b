"""Processes of the local stack: PID records, spawning, stopping, commands and ports."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .common import HOST, LocalStackError

logger = logging.getLogger(__name__)

#: Popen objects of the services started by this process, kept so that Python
#: does not warn about (or lose track of) children that outlive the call.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class PidRecord:
    """What was started: written to ``run/<service>.json``.

    Attributes:
        pid: Process id (also its process-group id: services start in a new session).
        started: When it was started (timezone-aware UTC).
        marker: A string that appears in the process's command line; a live
            process whose command line lacks it is not ours.
    """

    pid: int
    started: datetime
    marker: str

    def save(self, path: Path) -> None:
        """Write the record atomically to ``path``."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": self.pid, "started": self.started.isoformat(), "marker": self.marker}))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> PidRecord | None:
        """Read a record; None when the file is missing or unreadable."""
        try:
            data = json.loads(path.read_text())
            return cls(int(data["pid"]), datetime.fromisoformat(data["started"]), data["marker"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


# --------------------------------------------------------------------------- processes


def cmdline(pid: int) -> str | None:
    """Return the command line of ``pid`` (arguments joined by spaces), or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def is_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (reaping it if it is our child)."""
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def owns(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and its command line contains ``marker``."""
    line = cmdline(pid)
    return line is not None and marker in line and is_alive(pid)


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)


def spawn(
    cmd: Sequence[str],
    *,
    log: Path,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a long-running service process detached from our terminal.

    Args:
        cmd: The command and its arguments.
        log: File that receives stdout and stderr (appended to).
        cwd: Working directory.
        env: Extra environment variables on top of ``os.environ``.

    Returns:
        The Popen object; the child leads its own session and process group,
        so it survives our exit and ignores our terminal's Ctrl-C.

    Raises:
        LocalStackError: If the executable cannot be started.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {datetime.now(UTC).isoformat()} starting: {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=full_env,
                start_new_session=True,
            )
        except OSError as exc:
            raise LocalStackError(f"cannot run {cmd[0]}: {exc}") from exc
    _CHILDREN[proc.pid] = proc
    return proc


def terminate(pid: int, marker: str, timeout: float, sig: int = signal.SIGTERM) -> None:
    """Stop our process group ``pid`` gracefully, then kill it after ``timeout`` seconds.

    Does nothing when ``pid`` is gone or is not ours (its command line lacks ``marker``).

    Args:
        pid: Process id and process-group id of the service.
        marker: String that must appear in the process's command line.
        timeout: Seconds to wait after ``sig`` before SIGKILL.
        sig: The graceful signal.
    """
    if not owns(pid, marker):
        return
    _signal_group(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            break
        time.sleep(0.2)
    else:
        logger.warning("pid %d did not stop within %.0f s; killing it", pid, timeout)
        _signal_group(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while is_alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
    # Children of the group leader (Elasticsearch's server JVM) may outlive it briefly.
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pid, 0)
        except OSError:
            return
        time.sleep(0.2)
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid``, or only ``pid`` when it leads none."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass


def run(
    cmd: Sequence[str],
    *,
    what: str,
    log: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> str:
    """Run a short command to completion.

    Args:
        cmd: The command and its arguments.
        what: Human description used in the error message ("format Kafka storage").
        log: When given, output is appended there instead of being captured.
        cwd: Working directory.
        env: Extra environment variables.
        timeout: Seconds before the command is considered hung.

    Returns:
        Captured stdout+stderr (empty when ``log`` is given).

    Raises:
        LocalStackError: On a non-zero exit, a timeout or a missing executable.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        if log is not None:
            proc = _run_logged(cmd, log, cwd, full_env, timeout)
            output = ""
        else:
            proc = subprocess.run(
                list(cmd),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                cwd=cwd,
                env=full_env,
                timeout=timeout,
                check=False,
            )
            output = (proc.stdout + proc.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired as exc:
        raise LocalStackError(f"could not {what}: timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise LocalStackError(f"could not {what}: cannot run {cmd[0]}: {exc}") from exc
    if proc.returncode != 0:
        where = f"see {log}" if log is not None else _last_line(output)
        raise LocalStackError(f"could not {what} (exit code {proc.returncode}); {where}")
    return output


def _run_logged(cmd: Sequence[str], log: Path, cwd: Path | None, env: dict[str, str],
                timeout: float) -> subprocess.CompletedProcess[bytes]:
    """Run ``cmd`` with its output appended to ``log`` after a line naming it and the time (UTC)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {datetime.now(UTC).isoformat()} {' '.join(cmd)}\n".encode())
        out.flush()
        return subprocess.run(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            timeout=timeout,
            check=False,
        )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# --------------------------------------------------------------------------- ports


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def listener_pid(port: int) -> int | None:
    """Return the pid of the process listening on TCP ``port`` (IPv4/IPv6), if visible.

    Reads ``/proc/net/tcp*`` and matches socket inodes in ``/proc/<pid>/fd``;
    processes of other users are invisible when not root.
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            for fd in (proc_dir / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(proc_dir.name)
        except OSError:
            continue
    return None


def ensure_ports_free(service: str, ports: Sequence[int], env_var: str, home: Path) -> None:
    """Make sure the service's ports are free before starting it.

    A leftover process of ours (its command line names ``home``) still holding a
    port — e.g. an orphaned child after a crash — is stopped.

    Raises:
        LocalStackError: If a port is held by a process that is not ours.
    """
    for port in ports:
        if not port_open(port):
            continue
        pid = listener_pid(port)
        line = cmdline(pid) if pid else None
        if pid and line and str(home) in line:
            logger.warning("%s: stopping leftover process %d that holds port %d", service, pid, port)
            terminate(pid, str(home), timeout=20)
            if not port_open(port):
                continue
        who = f" by pid {pid} ({(line or '?')[:60]})" if pid else ""
        raise LocalStackError(
            f"port {HOST}:{port} needed by {service} is already in use{who}; stop that process, "
            f"or set {env_var} to use an already-running {service} instead"
        )
