"""CPU seconds per pipeline component, read from ``/proc`` (Linux), between two moments.

``threes demo`` measures where the CPU of its pipeline phase goes: the stream
job (its Python driver, the Spark JVM it starts and the JVM's Python workers),
each sync service process, the sources, the demo's own process (replay and
watcher), and the local stack's servers (Kafka, Elasticsearch, the S3 server,
PostgreSQL with all its backends).

**What is counted.** A component is a *root* process and its descendants (other
components' roots and their trees excluded: the demo's own children are the
pipeline's processes). For every process, ``/proc/<pid>/stat`` gives

* ``utime`` + ``stime``: CPU of all its threads, live and exited, and
* ``cutime`` + ``cstime``: CPU of its children that exited and were waited for
  (reaped), recursively (``proc(5)``).

So the sum of the four over a live tree counts every process that ever ran in
it, as long as the dead were reaped inside the tree (PostgreSQL's postmaster
reaps its backends, Spark's ``pyspark.daemon`` its workers). The component's
CPU between two readings is the difference of the sums; a process that exits
between them moves from its own line to its parent's ``cutime``, which keeps the
difference right. A process re-parented to ``init`` before it is reaped takes
its CPU away (the difference is clamped at 0); none of the pipeline's do.

The machine's busy time comes from ``/proc/stat`` (``user + nice + system +
irq + softirq + steal`` of the ``cpu`` line), so the summary also shows what
ran *beside* the pipeline (other users' jobs on a shared machine).
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROC = Path("/proc")


def clock_ticks() -> int:
    """Clock ticks per second of ``/proc`` times (``sysconf(_SC_CLK_TCK)``, 100 on Linux)."""
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


@dataclass(frozen=True)
class ProcStat:
    """The fields of one ``/proc/<pid>/stat`` line the accounting needs.

    Attributes:
        pid: process id.
        comm: executable name (at most 15 characters, may hold spaces and parentheses).
        ppid: parent's process id.
        utime: user CPU of all its threads, clock ticks.
        stime: system CPU of all its threads, clock ticks.
        cutime: user CPU of its reaped children (recursively), clock ticks.
        cstime: system CPU of its reaped children (recursively), clock ticks.
        starttime: when it started, clock ticks after boot (tells a reused pid apart).
    """

    pid: int
    comm: str
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int
    starttime: int

    @property
    def ticks(self) -> int:
        """Its own CPU and its reaped children's, clock ticks."""
        return self.utime + self.stime + self.cutime + self.cstime


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line (``proc(5)``).

    The second field is the executable name in parentheses, which may itself
    contain spaces and ``)``: the line is split at the *last* ``)``.

    Args:
        text: the file's content, e.g. ``"42 (java) S 1 42 42 0 -1 ... "``.

    Returns:
        The parsed fields (times in clock ticks).

    Raises:
        ValueError: the line is not a stat line.
    """
    head, paren, rest = text.rpartition(")")
    pid_text, open_paren, comm = head.partition(" (")
    fields = rest.split()
    if not paren or not open_paren or len(fields) < 20:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    # fields[0] is field 3 of proc(5) (state): field n is fields[n - 3]
    return ProcStat(
        pid=int(pid_text),
        comm=comm,
        ppid=int(fields[1]),
        utime=int(fields[11]),
        stime=int(fields[12]),
        cutime=int(fields[13]),
        cstime=int(fields[14]),
        starttime=int(fields[19]),
    )


def parse_machine_busy(text: str) -> int:
    """Busy clock ticks of all CPUs from ``/proc/stat``'s ``cpu`` line.

    ``user + nice + system + irq + softirq + steal``; ``guest`` time is already
    inside ``user``, and ``idle`` and ``iowait`` are not busy.

    Raises:
        ValueError: no ``cpu`` line.
    """
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:9]] + [0] * max(0, 9 - len(parts))
            user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
            return user + nice + system + irq + softirq + steal
    raise ValueError("no cpu line in /proc/stat")


@dataclass
class ProcTable:
    """Every process of the machine at one moment.

    Attributes:
        at: ``time.monotonic()`` of the reading.
        procs: pid -> its stat.
        machine_busy: busy clock ticks of the whole machine (``None`` when unreadable).
    """

    at: float
    procs: dict[int, ProcStat]
    machine_busy: int | None = None

    def children(self) -> dict[int, list[int]]:
        """Parent pid -> its children's pids."""
        out: dict[int, list[int]] = defaultdict(list)
        for p in self.procs.values():
            out[p.ppid].append(p.pid)
        return out


def read_proc(root: Path = PROC) -> ProcTable:
    """Read every process's stat line and the machine's busy time.

    Processes that exit while they are read are skipped.

    Args:
        root: the proc file system (a folder of the same shape in tests).
    """
    at = time.monotonic()
    procs: dict[int, ProcStat] = {}
    for entry in os.scandir(root):
        if not entry.name.isdigit():
            continue
        try:
            stat = parse_stat((Path(entry.path) / "stat").read_text())
        except (OSError, ValueError):
            continue
        procs[stat.pid] = stat
    try:
        busy: int | None = parse_machine_busy((root / "stat").read_text())
    except (OSError, ValueError):
        busy = None
    return ProcTable(at, procs, busy)


def tree(table: ProcTable, root: int, exclude: Iterable[int] = ()) -> list[int]:
    """The pids of ``root`` and its descendants, not descending into ``exclude`` (other components' roots).

    Args:
        table: a reading.
        root: the tree's root pid; an empty list when it is not running.
        exclude: pids whose subtrees belong elsewhere.
    """
    if root not in table.procs:
        return []
    skip = set(exclude) - {root}
    kids = table.children()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(c for c in kids.get(pid, ()) if c not in skip)
    return out


def tree_ticks(table: ProcTable, root: int, exclude: Iterable[int] = ()) -> dict[str, int]:
    """CPU clock ticks of a process tree, per executable name (``comm``), see :func:`tree`."""
    out: dict[str, int] = defaultdict(int)
    for pid in tree(table, root, exclude):
        p = table.procs[pid]
        out[p.comm] += p.ticks
    return dict(out)


@dataclass
class CpuReport:
    """CPU used by each component between two readings.

    Attributes:
        window_s: wall seconds between the readings.
        components: component -> CPU seconds (``None``: its process was not running).
        processes: component -> executable name -> CPU seconds.
        machine_busy_s: CPU seconds of the whole machine (every process, ours or not).
    """

    window_s: float
    components: dict[str, float | None] = field(default_factory=dict)
    processes: dict[str, dict[str, float]] = field(default_factory=dict)
    machine_busy_s: float | None = None

    @property
    def pipeline_s(self) -> float:
        """The components' total, CPU seconds."""
        return sum(v for v in self.components.values() if v is not None)

    def as_dict(self, events: int | None = None, per: str = "event") -> dict[str, Any]:
        """JSON-ready: per component, the total, cores used, the rest of the machine and, given ``events``, µs each.

        Args:
            events: events processed in the window; adds ``<per>s`` and ``cpu_us_per_<per>``
                (the pipeline's total CPU microseconds per event).
            per: what an event is called (``flight``).
        """
        total = self.pipeline_s
        out: dict[str, Any] = {
            "window_s": round(self.window_s, 1),
            "components_s": {k: (None if v is None else round(v, 1)) for k, v in self.components.items()},
            "processes_s": {
                k: {n: round(s, 1) for n, s in sorted(v.items(), key=lambda kv: -kv[1])}
                for k, v in self.processes.items()
            },
            "pipeline_s": round(total, 1),
            "pipeline_cores": round(total / self.window_s, 2) if self.window_s > 0 else None,
            "machine_busy_s": None if self.machine_busy_s is None else round(self.machine_busy_s, 1),
            "other_s": None if self.machine_busy_s is None else round(max(0.0, self.machine_busy_s - total), 1),
        }
        if events:
            out[f"{per}s"] = events
            out[f"cpu_us_per_{per}"] = round(total / events * 1e6)
        return out


def cpu_between(before: ProcTable, after: ProcTable, roots: Mapping[str, int], hz: int | None = None) -> CpuReport:
    """CPU seconds of each component's tree between two readings.

    A pid in ``after`` whose start time differs from ``before``'s is a new process
    (its whole CPU counts); a component's total never goes below 0.

    Args:
        before: the first reading.
        after: the second reading.
        roots: component -> root pid.
        hz: clock ticks per second (:func:`clock_ticks` when ``None``).
    """
    hz = hz or clock_ticks()
    all_roots = set(roots.values())
    report = CpuReport(window_s=after.at - before.at)
    for name, root in roots.items():
        if root not in after.procs:
            report.components[name] = None
            continue
        first = before.procs.get(root)
        same_root = first is not None and first.starttime == after.procs[root].starttime
        start = tree_ticks(before, root, all_roots) if same_root else {}
        end = tree_ticks(after, root, all_roots)
        report.components[name] = max(0, sum(end.values()) - sum(start.values())) / hz
        report.processes[name] = {
            comm: (ticks - start.get(comm, 0)) / hz for comm, ticks in end.items() if ticks - start.get(comm, 0) > 0
        }
    if before.machine_busy is not None and after.machine_busy is not None:
        report.machine_busy_s = (after.machine_busy - before.machine_busy) / hz
    return report


class CpuMeter:
    """Measure components' CPU from a starting moment: :meth:`start`, then :meth:`read` any number of times.

    Args:
        roots: returns component -> root pid; called at :meth:`start` (the processes must be running).
        proc: the proc file system.
    """

    def __init__(self, roots: Callable[[], Mapping[str, int]], proc: Path = PROC):
        self._roots_fn = roots
        self.proc = proc
        self.roots: dict[str, int] = {}
        self._start: ProcTable | None = None
        self.hz = clock_ticks()

    def start(self) -> None:
        """Take the first reading (call right before the measured work begins)."""
        self.roots = dict(self._roots_fn())
        self._start = read_proc(self.proc)

    def read(self) -> CpuReport:
        """The CPU of each component since :meth:`start`.

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        if self._start is None:
            raise RuntimeError("CpuMeter.read() before start()")
        return cpu_between(self._start, read_proc(self.proc), self.roots, self.hz)


def stack_pids(home: Path | None = None, skip: tuple[str, ...] = ("mysql",)) -> dict[str, int]:
    """The local stack's server processes, from the PID records it keeps (``.threes/run/<service>.json``).

    Read from the records, not from ``threes local status``: the tests point
    ``THREES_*`` variables at the stack they started, which ``status`` then
    reports as external services without a pid. A record whose process is gone
    or is not ours (its command line lacks the record's marker) is left out, as
    are services reached elsewhere (they have no record) and ``skip`` (MariaDB
    is no part of the demo's pipeline).

    Args:
        home: the stack's folder (``THREES_HOME`` or ``.threes`` when ``None``).
        skip: service names not to measure.

    Returns:
        service name (the record's file name: ``kafka``, ``postgres``, ``spark-master``...) -> pid.
    """
    from threes.local import LocalStack
    from threes.local.process import PidRecord, owns

    run = LocalStack(home).layout.run
    out: dict[str, int] = {}
    for path in sorted(run.glob("*.json")) if run.is_dir() else []:
        record = PidRecord.load(path)
        if path.stem not in skip and record is not None and owns(record.pid, record.marker):
            out[path.stem] = record.pid
    return out
