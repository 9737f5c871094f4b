"""Shared pieces of the local stack: layout, errors, processes, ports and JDKs.

Everything the local stack writes lives under one folder (``.threes/`` by
default)::

    .threes/
      m2/          Maven's project-local repository
      downloads/   archives fetched by Maven (Elasticsearch zip)
      run/         PID records (``<service>.json``) and the stack lock
      logs/        one log per service (``<service>.log``) and Maven's logs
      kafka/ postgres/ elasticsearch/ s3/   installs, configs and data
      spark-jars/  Spark's Kafka and Avro connectors with their dependencies
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
"""The only address any local service binds to or is reached at."""

#: Popen objects of the services started by this process, kept so that Python
#: does not warn about (or lose track of) children that outlive the call.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class LocalStackError(Exception):
    """A local service could not be installed, started, reached or stopped.

    The message is one line that says what is wrong and what to do about it.
    """


@dataclass(frozen=True)
class Layout:
    """Paths of the project-local folder.

    Attributes:
        home: Absolute path of the folder (``.threes``).
    """

    home: Path

    @property
    def m2(self) -> Path:
        """Maven's project-local repository."""
        return self.home / "m2"

    @property
    def downloads(self) -> Path:
        """Archives fetched by Maven."""
        return self.home / "downloads"

    @property
    def run(self) -> Path:
        """PID records and the stack lock."""
        return self.home / "run"

    @property
    def logs(self) -> Path:
        """Log folder."""
        return self.home / "logs"

    def log(self, name: str) -> Path:
        """Return the log file of service ``name``."""
        return self.logs / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        """Return the PID record of service ``name``."""
        return self.run / f"{name}.json"

    def service_dir(self, name: str) -> Path:
        """Return the install/data folder of service ``name``."""
        return self.home / name

    def create(self) -> None:
        """Create the top-level folders (idempotent)."""
        for path in (self.home, self.m2, self.downloads, self.run, self.logs):
            path.mkdir(parents=True, exist_ok=True)


# --------------------------------------------------------------------------- PID records


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
        tmp.write_text(
            json.dumps(
                {"pid": self.pid, "started": self.started.isoformat(), "marker": self.marker}
            )
        )
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
    return bool(line) and marker in line and is_alive(pid)


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
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as out:
                out.write(f"\n=== {datetime.now(UTC).isoformat()} {' '.join(cmd)}\n".encode())
                out.flush()
                proc = subprocess.run(
                    list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    cwd=cwd, env=full_env, timeout=timeout, check=False,
                )
            output = ""
        else:
            proc = subprocess.run(
                list(cmd), stdin=subprocess.DEVNULL, capture_output=True, cwd=cwd,
                env=full_env, timeout=timeout, check=False,
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


# --------------------------------------------------------------------------- waiting


def wait_until(
    probe: Callable[[], object],
    *,
    timeout: float,
    what: str,
    log: Path | None = None,
    alive: Callable[[], bool] | None = None,
    interval: float = 0.5,
) -> None:
    """Call ``probe`` until it returns without raising, or fail after ``timeout`` seconds.

    Args:
        probe: Raises (any exception) while the thing is not ready.
        timeout: Seconds to wait.
        what: Name used in the error ("Elasticsearch").
        log: Log file named in the error.
        alive: Returns False when the process died: fail at once instead of waiting.
        interval: Seconds between probes.

    Raises:
        LocalStackError: On timeout or when the process died.
    """
    see = f"; see {log}" if log else ""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            probe()
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last = exc
        if alive is not None and not alive():
            raise LocalStackError(f"{what} exited during startup{see}")
        if time.monotonic() >= deadline:
            reason = f" (last error: {_short(last)})" if last else ""
            raise LocalStackError(
                f"{what} did not become healthy within {timeout:.0f} s{reason}{see}"
            )
        time.sleep(interval)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]


# --------------------------------------------------------------------------- users and JDKs


def is_root() -> bool:
    """Whether we run as root (services that refuse root then run as another user)."""
    return os.geteuid() == 0


def ensure_system_user(name: str) -> pwd.struct_passwd:
    """Return the OS user ``name``, creating it as a system user when missing (root only).

    Raises:
        LocalStackError: If the user is missing and cannot be created.
    """
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    run(
        ["useradd", "--system", "--user-group", "--no-create-home",
         "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
        what=f"create the OS user {name!r} (useradd)",
    )
    return pwd.getpwnam(name)


def chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    """Give ``path`` and everything below it to ``user`` (skips entries already owned)."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(root, name)
            st = os.lstat(full)
            if st.st_uid != user.pw_uid or st.st_gid != user.pw_gid:
                os.lchown(full, user.pw_uid, user.pw_gid)
    os.chown(path, user.pw_uid, user.pw_gid)


def make_traversable(path: Path) -> None:
    """Let other users reach ``path``: add the ``x`` bit for others to each parent folder.

    Only folders that lack it are changed (never read or write bits).
    """
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if not mode & 0o001:
            logger.info("making %s traversable (chmod o+x) for the service users", parent)
            os.chmod(parent, mode | 0o001)


def as_user(user: str | None, cmd: Sequence[str]) -> list[str]:
    """Prefix ``cmd`` so that it execs as ``user`` (keeps the environment); no-op for None."""
    if user is None:
        return list(cmd)
    entry = pwd.getpwnam(user)
    return [
        "setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
        "--", *cmd,
    ]


def java_major(java_home: Path) -> int | None:
    """Return the feature version of the JDK at ``java_home`` (17, 21, 25...), or None."""
    try:
        release = (java_home / "release").read_text()
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release, re.MULTILINE)
    if not match or not (java_home / "bin" / "java").exists():
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def find_java(
    minimum: int, *, prefer: Sequence[str] = (), env_vars: Sequence[str] = ("JAVA_HOME",)
) -> Path:
    """Find a JDK home with feature version ``>= minimum``.

    Order: the ``env_vars`` that point at a good enough JDK, then ``prefer``
    paths, then the newest JDK under ``/usr/lib/jvm``.

    Raises:
        LocalStackError: If there is none.
    """
    candidates = [Path(os.environ[v]) for v in env_vars if os.environ.get(v)]
    candidates += [Path(p) for p in prefer]
    for home in candidates:
        major = java_major(home)
        if major is not None and major >= minimum:
            return home
    found: list[tuple[int, Path]] = []
    jvm = Path("/usr/lib/jvm")
    if jvm.is_dir():
        for home in jvm.iterdir():
            major = java_major(home)
            if major is not None and major >= minimum and not home.is_symlink():
                found.append((major, home))
    if found:
        return max(found)[1]
    raise LocalStackError(
        f"no Java {minimum}+ JDK found (checked {', '.join(env_vars)} and /usr/lib/jvm); "
        f"install one, e.g. apt-get install -y openjdk-17-jdk-headless"
        + (" (Elasticsearch needs 21+; set ES_JAVA_HOME)" if minimum >= 21 else "")
    )


def now() -> datetime:
    """Return the current time, timezone-aware UTC."""
    return datetime.now(UTC)
