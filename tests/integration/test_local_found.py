"""``threes local`` from a folder that is not the clone finds the running stack by its ports and health.

Each test runs the real command line as a subprocess in an empty folder, with no
``THREES_HOME`` and no ``THREES_*`` variable, against the shared stack on its default
ports (it never starts or stops a service of it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from threes.local import SERVERS

ROOT = Path(__file__).resolve().parents[2]


def threes(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``threes ARGS`` in ``cwd`` with the environment stripped of every ``THREES_*`` variable."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THREES_")}
    clean.update(PYTHONPATH=str(ROOT), COLUMNS="300", NO_COLOR="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "threes.cli", *args], cwd=cwd, env=clean, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def listener() -> Iterator[int]:
    """A plain TCP listener on a free loopback port: it accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_status_in_an_empty_folder_shows_the_running_stack(stack: Any, tmp_path: Path) -> None:
    result = threes("local", "status", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    for server in SERVERS:
        row = rows[server.name]
        assert "yes (started in " in row or "yes (started elsewhere)" in row, row
    assert not (tmp_path / ".threes").exists()  # status looks, it writes nothing


def test_env_in_an_empty_folder_points_at_the_running_stack(stack: Any, tmp_path: Path) -> None:
    result = threes("local", "env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = dict(line.removeprefix("export ").split("=", 1) for line in result.stdout.splitlines())
    assert printed["THREES_KAFKA_BOOTSTRAP"] == "127.0.0.1:19092"
    assert printed["THREES_ELASTICSEARCH_URL"] == "http://127.0.0.1:19200"
    # the CA of the folder the stack was started from (this folder has none), or a note that says to set it
    if "THREES_TLS_CA" in printed:
        assert Path(printed["THREES_TLS_CA"]).is_file()
        assert printed["THREES_KAFKA_SASL_BOOTSTRAP"] == "127.0.0.1:19094"
    else:
        assert "set THREES_TLS_CA" in result.stderr


def test_a_port_held_by_a_plain_listener_is_one_line(tmp_path: Path, listener: int) -> None:
    """``up`` of a Kafka whose port a plain socket holds stops before installing anything, in one line."""
    home = tmp_path / "home"
    result = threes(
        "local", "up", "--service", "kafka", "--kafka-port", str(listener), cwd=tmp_path, env={"THREES_HOME": str(home)}
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    (line,) = errors
    assert f"port 127.0.0.1:{listener} needed by Kafka is already in use by pid {os.getpid()}" in line
    assert "does not answer as Kafka" in line and "THREES_KAFKA_BOOTSTRAP" in line
    assert not (home / "kafka" / "lib").exists()  # nothing installed


def test_status_names_a_held_port_in_one_line(tmp_path: Path, listener: int) -> None:
    from threes.local.common import Layout
    from threes.local.kafka_cluster import KafkaCluster

    home = tmp_path / "home"
    KafkaCluster(1, listener).save(Layout(home))  # as `up --kafka-port` records it
    result = threes("local", "status", cwd=tmp_path, env={"THREES_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "port held" in result.stdout
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: kafka: port 127.0.0.1:{listener} needed by Kafka is already in use")
