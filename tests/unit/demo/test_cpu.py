"""CPU accounting of the demo: /proc parsing, process trees, differences, and the summary's table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from threes.demo.cpu import (
    CpuMeter,
    ProcTable,
    cpu_between,
    parse_machine_busy,
    parse_stat,
    read_proc,
    tree,
)
from threes.demo.view import summary_table


def stat_line(
    pid: int, comm: str, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0, starttime: int = 1000
) -> str:
    """A /proc/<pid>/stat line as Linux writes it (fields 3..52)."""
    fields = [
        "S",
        ppid,
        pid,
        pid,
        0,
        -1,
        4194304,
        10,
        0,
        0,
        0,
        utime,
        stime,
        cutime,
        cstime,
        20,
        0,
        1,
        0,
        starttime,
        3133440,
        385,
    ] + [0] * 30
    return f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n"


def test_parse_stat_reads_times_and_a_name_with_spaces_and_parentheses() -> None:
    p = parse_stat(stat_line(4242, "a) b (c", 7, utime=150, stime=25, cutime=300, cstime=12, starttime=999))
    assert (p.pid, p.comm, p.ppid) == (4242, "a) b (c", 7)
    assert (p.utime, p.stime, p.cutime, p.cstime, p.starttime) == (150, 25, 300, 12, 999)
    assert p.ticks == 487


def test_parse_stat_of_this_process_and_a_bad_line() -> None:
    me = parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert me.pid == os.getpid() and me.ppid == os.getppid()
    with pytest.raises(ValueError):
        parse_stat("not a stat line")


def test_machine_busy_counts_user_nice_system_irq_softirq_steal_not_idle() -> None:
    text = "cpu  100 5 50 9000 30 2 3 4 0 0\ncpu0 50 2 25 4500 15 1 1 2 0 0\nintr 1 2\n"
    assert parse_machine_busy(text) == 100 + 5 + 50 + 2 + 3 + 4


def write_proc(root: Path, lines: list[str], busy: int) -> None:
    """A folder shaped like /proc: <pid>/stat per line, and stat with a cpu line."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        if old.name.isdigit():
            (old / "stat").unlink()
            old.rmdir()
    for line in lines:
        pid = line.split()[0]
        (root / pid).mkdir()
        (root / pid / "stat").write_text(line)
    (root / "stat").write_text(f"cpu  {busy} 0 0 5000 0 0 0 0 0 0\n")
    (root / "self").mkdir(exist_ok=True)  # not a pid: ignored


def test_components_are_disjoint_trees_and_reaped_children_stay_counted(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    roots = {"demo": 10, "sync": 20, "stream": 30, "postgres": 40, "kafka": 60}
    before = [
        stat_line(1, "init", 0, 0, 0),
        stat_line(10, "threes", 1, 100, 10),  # the demo: its children are other components
        stat_line(20, "threes", 10, 200, 20),
        stat_line(30, "threes", 10, 50, 5),
        stat_line(31, "java", 30, 1000, 100),
        stat_line(32, "python", 31, 30, 3),  # pyspark.daemon
        stat_line(33, "python", 32, 70, 7),  # a Python worker: exits before the second reading
        stat_line(40, "postgres", 1, 10, 10),
        stat_line(41, "postgres", 40, 40, 10),  # a backend: exits, reaped by the postmaster
        stat_line(50, "bash", 1, 500, 500),  # someone else's work
    ]
    write_proc(proc, before, busy=10_000)
    first = read_proc(proc)
    assert set(tree(first, 30, roots.values())) == {30, 31, 32, 33}
    assert set(tree(first, 10, roots.values())) == {10}
    after = [
        stat_line(1, "init", 0, 0, 0),
        stat_line(10, "threes", 1, 400, 40),  # +330
        stat_line(20, "threes", 10, 1200, 120),  # +1100
        stat_line(30, "threes", 10, 60, 5),  # +10
        stat_line(31, "java", 30, 5000, 500),  # +4400
        stat_line(32, "python", 31, 40, 3, cutime=90, cstime=9),  # +10, and the reaped worker 33: 77 -> 99
        stat_line(34, "python", 32, 200, 0, starttime=5000),  # a new worker: all of it counts
        stat_line(40, "postgres", 1, 20, 10, cutime=60, cstime=15),  # backend 41 reaped: 50 -> 75
        stat_line(42, "postgres", 40, 25, 5, starttime=6000),
        stat_line(50, "bash", 1, 900, 900),
    ]
    write_proc(proc, after, busy=19_000)
    second = read_proc(proc)
    second.at = first.at + 10.0
    report = cpu_between(first, second, roots, hz=100)
    assert report.components["demo"] == pytest.approx(3.3)
    assert report.components["sync"] == pytest.approx(11.0)
    # driver 0.1 + JVM 44 + daemon 0.1 + reaped worker 0.22 + new worker 2
    assert report.components["stream"] == pytest.approx(0.1 + 44 + 0.1 + 0.22 + 2.0)
    assert report.components["postgres"] == pytest.approx(0.1 + 0.25 + 0.3)
    assert report.components["kafka"] is None  # not running
    assert report.processes["stream"]["java"] == pytest.approx(44.0)
    assert report.machine_busy_s == pytest.approx(90.0)
    out = report.as_dict(events=1000, per="flight")
    assert out["pipeline_s"] == pytest.approx(3.3 + 11 + 46.42 + 0.65, abs=0.1)
    assert out["cpu_us_per_flight"] == pytest.approx(61_370, rel=0.01)
    assert out["other_s"] == pytest.approx(90.0 - out["pipeline_s"], abs=0.1)
    assert out["pipeline_cores"] == pytest.approx(out["pipeline_s"] / 10.0, abs=0.01)


def test_a_reused_pid_counts_as_a_new_process(tmp_path: Path) -> None:
    first = ProcTable(0.0, {7: parse_stat(stat_line(7, "java", 1, 5000, 0, starttime=100))})
    second = ProcTable(5.0, {7: parse_stat(stat_line(7, "java", 1, 300, 0, starttime=900))})
    assert cpu_between(first, second, {"kafka": 7}, hz=100).components["kafka"] == pytest.approx(3.0)


CHILD = """
import subprocess, sys, time
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"
subprocess.run([sys.executable, "-c", burn], check=True)  # a grandchild, reaped by the child
t = time.process_time()
while time.process_time() - t < 0.2:
    pass
print("done", flush=True)
time.sleep(60)
"""


def test_meter_measures_a_real_process_tree_apart_from_this_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        meter = CpuMeter(lambda: {"tree": child.pid, "me": os.getpid()})
        meter.start()
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        report = meter.read()
    finally:
        child.kill()
        child.wait()
    # 0.4 s in the reaped grandchild + 0.2 s in the child (interpreter start-up on top)
    assert report.components["tree"] is not None and report.components["tree"] >= 0.55
    assert report.components["me"] is not None and report.components["me"] < 0.3  # waiting on a pipe is not CPU
    assert report.window_s > 0


def test_summary_table_shows_cpu_per_component_and_per_flight() -> None:
    cpu = {
        "window_s": 150.0,
        "components_s": {
            "stream": 120.5,
            "sync": 110.0,
            "demo": 30.0,
            "kafka": 18.0,
            "postgres": 3.0,
            "s3": None,
            "spark-worker-1": 33.0,
        },
        "processes_s": {"stream": {"java": 110.0, "python": 8.5, "threes": 2.0}},
        "pipeline_s": 281.5,
        "pipeline_cores": 1.88,
        "machine_busy_s": 290.0,
        "other_s": 8.5,
        "flights": 336776,
        "cpu_us_per_flight": 836,
    }
    console = Console(record=True, width=160)
    console.print(summary_table({"cpu": cpu}))
    text = console.export_text()
    assert "stream job (driver, Spark JVM, Python workers)" in text and "java 110.0" in text
    assert "Spark worker-1 (stream job's executors)" in text
    assert "836 µs per flight" in text and "281.5" in text and "not running" in text


def test_stack_pids_reads_the_stack_s_records_of_live_processes_only(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from threes.demo.cpu import stack_pids
    from threes.local.process import PidRecord

    marker = f"{tmp_path}/kafka/"
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        run = tmp_path / "run"
        run.mkdir()
        PidRecord(server.pid, datetime.now(UTC), marker).save(run / "kafka.json")
        PidRecord(server.pid, datetime.now(UTC), marker).save(run / "mysql.json")  # not the demo's
        PidRecord(server.pid, datetime.now(UTC), "not-in-its-command-line").save(run / "postgres.json")
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        PidRecord(dead.pid, datetime.now(UTC), "x").save(run / "s3.json")
        assert stack_pids(tmp_path) == {"kafka": server.pid}
    finally:
        server.kill()
        server.wait()
