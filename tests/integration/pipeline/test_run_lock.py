"""``threes run`` cannot fork twins (issue #40 item 5).

* Killed with SIGKILL, ``threes run`` takes its children along: none survives 5 s
  (``PR_SET_PDEATHSIG``), instead of the sync child running on as an orphan.
* A second ``threes run`` of the same YAML (named another way) refuses to start while the
  first runs, in one line naming the first's PID; ``--force`` stops the first and takes over.

The pipeline runs only its sync part (``--only sync``): no Spark starts.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.integration.pipeline.test_start_order import write_config

THREES = str(Path(sys.executable).with_name("threes"))


class Run:
    """A ``threes run --only sync`` in a subprocess, its output read line by line."""

    def __init__(self, config: str, cwd: Path, *extra: str):
        self.process = subprocess.Popen(  # our own console script
            [THREES, "run", config, "--only", "sync", "--log-dir", str(cwd / f"logs-{time.monotonic_ns()}"), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=os.environ.copy(),
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = 120) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                found = re.search(pattern, line)
                if found:
                    return found
            if self.process.poll() is not None:
                time.sleep(0.2)
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(90)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_children_die_with_a_killed_run(tmp_path: Path, endpoints: Any, unique: str,
                                        kafka_conf: dict[str, Any]) -> None:
    from kernel.kafka.topics import ensure_compacted_topic

    ensure_compacted_topic(kafka_conf, f"updates.{unique}", partitions=1)  # as the stream job would: sync starts
    config = write_config(tmp_path, endpoints, unique, f"things.{unique}")
    run = Run(str(config), tmp_path)
    kids: list[int] = []
    try:
        sync_pid = int(run.wait_for(r"\[run\] started sync \(pid (\d+)\)").group(1))
        run.wait_for(r"sync ready")
        kids = children(run.process.pid)
        assert sync_pid in kids, kids
        run.process.kill()  # SIGKILL: no handler of threes run runs
        run.process.wait(10)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(alive(k) for k in kids):
            time.sleep(0.1)
        survivors = [k for k in kids if alive(k)]
        assert not survivors, f"children of the killed run still alive after 5 s: {survivors}"
    finally:
        for k in kids:
            if alive(k):
                os.kill(k, signal.SIGKILL)


def test_a_second_run_of_the_same_pipeline_is_refused_and_force_takes_over(
    tmp_path: Path, endpoints: Any, unique: str,
) -> None:
    config = write_config(tmp_path, endpoints, unique, f"things.{unique}")  # its topic is missing: sync waits
    first = Run(str(config), tmp_path)
    third: Run | None = None
    try:
        first.wait_for("waiting for topic")
        other = tmp_path / "elsewhere"
        other.mkdir()
        # the same file named another way, from another folder
        second = subprocess.run(
            [THREES, "run", "../pipeline.yaml", "--only", "sync"], capture_output=True, text=True, cwd=other,
            env=os.environ.copy(), timeout=60,
        )
        output = (second.stdout + second.stderr).strip()
        assert second.returncode == 1, output
        assert len(output.splitlines()) == 1 and "Traceback" not in output, output
        assert f"is already run by another `threes run` (pid {first.process.pid};" in output, output
        assert "--force" in output
        assert first.process.poll() is None

        third = Run(str(config), tmp_path, "--force")
        third.wait_for("waiting for topic")
        assert first.process.wait(30) == 0, "\n".join(first.lines)  # stopped cleanly by the takeover
        assert third.process.poll() is None
        assert third.stop() == 0, "\n".join(third.lines)
    finally:
        for run in (first, third):
            if run is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait(30)
