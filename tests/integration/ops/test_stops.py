"""SIGTERM ends a process that is retrying, within a bound, without retrying faster (issue #40 item 4).

Each test starts the real command in a subprocess against the local stack, makes it
retry (a wrong PostgreSQL password for a source; a PostgreSQL trigger that refuses a
key with a transient SQLSTATE for a sink, retried forever), sends SIGTERM once a few
attempts were logged, and asserts that the process exits within
:data:`STOP_BOUND_S` seconds (the bound is the feature) having made at most one
attempt after the signal (before the fix, the backoff returned at once once the stop
was set: ~20 attempts/s and no exit).
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

import yaml

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from tests.integration.ops.helpers import accept_all, fail_key, free_port, rows
from tests.integration.sync.helpers import UpdateProducer, create_topic, wait_until

THREES = str(Path(sys.executable).with_name("threes"))
STOP_BOUND_S = 10.0
BAD = 13


class Output:
    """A process's merged output, read line by line in a thread."""

    def __init__(self, process: subprocess.Popen[str]):
        self.lines: list[str] = []
        self._process = process
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.lines.append(line.rstrip("\n"))

    def count(self, pattern: str) -> int:
        return sum(1 for line in list(self.lines) if re.search(pattern, line))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def start(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], Output]:
    process = subprocess.Popen(  # our own console script
        [THREES, "-v", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
        env=os.environ.copy(),
    )
    return process, Output(process)


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses a socket LISTENs on ``port`` at (``/proc/net/tcp``), e.g. ``{"127.0.0.1"}``."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: TCP_LISTEN
            found.add(".".join(str(b) for b in reversed(bytes.fromhex(addr))))
    return found


def stop_within_bound(process: subprocess.Popen[str], out: Output, attempt: str) -> tuple[int, float]:
    """SIGTERM, then the exit code and the attempts logged after the signal (at most one may be under way)."""
    before = out.count(attempt)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
        raise AssertionError(f"still running {STOP_BOUND_S} s after SIGTERM ({out.count(attempt) - before} attempts "
                             f"since):\n{out.text[-3000:]}") from None
    took = time.monotonic() - sent
    time.sleep(0.2)  # the reader thread takes the last lines
    after = out.count(attempt) - before
    assert after <= 1, f"{after} attempts after SIGTERM (took {took:.1f} s):\n{out.text[-3000:]}"
    return code, took


def test_source_retrying_a_wrong_password_stops_on_sigterm(tmp_path: Path, kafka: KafkaConfig, pg: RdsConnection,
                                                           unique: str) -> None:
    url = pg.url.split("?", 1)[0]
    doc = {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"pg": {"type": "rds", "url": url, "password": "not-the-password"}},
        "sources": [{
            "name": f"wrongpw-{unique}", "type": "rds_source", "connection": "pg", "topic": f"state.wrongpw.{unique}",
            "table": "no_such_table", "mode": "incrementing", "incrementing_column": "id",
            "errors": {"retry_timeout_s": -1},
        }],
    }
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(doc))
    port = free_port()
    process, out = start(["source", "run", str(config), "--offsets-topic", f"offsets.{unique}",
                          "--metrics-port", str(port)], tmp_path)
    attempt = r"transient failure \(attempt \d+"
    try:
        wait_until(lambda: out.count(attempt) >= 2 or process.poll() is not None, 120, "two failed connections")
        assert process.poll() is None, out.text
        assert "password authentication failed" in out.text, out.text
        assert listening_on(port) == {"127.0.0.1"}  # --metrics-port binds loopback unless --metrics-host says
        code, _took = stop_within_bound(process, out, attempt)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert code == 0, out.text  # stopped while retrying is a stop, not a failure
    assert "not-the-password" not in out.text


def test_sync_retrying_a_refused_write_stops_on_sigterm(tmp_path: Path, kafka: KafkaConfig,
                                                        kafka_conf: dict[str, Any], pg: RdsConnection,
                                                        pg_engine: Any, unique: str) -> None:
    topic, table = f"updates.stops.{unique}", f"stops_{unique}"
    doc = {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
        "sync": [{
            "name": f"stops-{unique}", "dead_letter_topic": f"dlq.{unique}", "metrics_port": free_port(),
            "batch": {"max_records": 5, "max_age_ms": 100},
            "retry": {"initial_backoff_s": 0.1, "max_backoff_s": 0.5},
            "sinks": [{
                "name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic], "table": table,
                "key": ["id"], "create_table": True, "errors": {"retry_timeout_s": -1},
            }],
        }],
    }
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(doc))
    create_topic(kafka_conf, topic, 1)
    producer = UpdateProducer(kafka, topic)
    for key in range(5):
        producer.send(key, 1)
    producer.flush()
    process, out = start(["sync", "run", str(config)], tmp_path)
    attempt = r"sink=db .* failed, retrying in"
    try:
        wait_until(lambda: len(rows(pg_engine, table)) == 5 or process.poll() is not None, 120, "the first rows")
        assert process.poll() is None, out.text
        assert listening_on(doc["sync"][0]["metrics_port"]) == {"127.0.0.1"}  # metrics_host's default
        fail_key(pg_engine, table, BAD)  # a transient SQLSTATE on every write of BAD: retried forever
        producer.send(BAD, 1)
        producer.flush()
        wait_until(lambda: out.count(attempt) >= 2 or process.poll() is not None, 120, "two failed writes")
        assert process.poll() is None, out.text
        code, _took = stop_within_bound(process, out, attempt)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        accept_all(pg_engine, table)
    assert code == 0, out.text
    assert BAD not in rows(pg_engine, table)
