"""The installed `threes` command: errors are one clear line, never a traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

THREES = shutil.which("threes", path=str(Path(sys.executable).parent)) or "threes"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([THREES, *args], capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_missing_config_file_is_one_line():
    result = run("validate", "/nonexistent/pipeline.yaml")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "/nonexistent/pipeline.yaml: cannot read config file: No such file or directory" in result.stderr


@pytest.mark.parametrize("command", [["--help"], ["local", "--help"], ["source", "--help"], ["stream", "--help"], ["sync", "--help"]])
def test_every_command_group_is_mounted(command):
    result = run(*command)
    assert result.returncode == 0, result.stderr
    assert "Usage: threes" in result.stdout


def test_bad_gc_threshold_of_a_service_is_one_line():
    result = subprocess.run([THREES, "sync", "run", "/nonexistent/pipeline.yaml"], capture_output=True, text=True,
                            timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "THREES_GC_THRESHOLD_0": "lots"})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "THREES_GC_THRESHOLD_0='lots': expected a non-negative integer" in result.stderr


def test_a_native_crash_leaves_every_threads_python_stack_in_the_log() -> None:
    # librdkafka aborted threes run once in CI with nothing but an exit code; the entry point
    # turns faulthandler on, so such a crash prints where each thread was.
    crash = ("import sys; sys.argv = ['threes', 'version']; import threes.cli as c; "
             "c.app = lambda: __import__('ctypes').string_at(0); c.run()")
    done = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, timeout=60)
    assert done.returncode < 0
    assert "Fatal Python error: Segmentation fault" in done.stderr and "in run" in done.stderr

