"""``threes run``'s live view reads Kafka in a child process: a native crash there ends only that child.

librdkafka has aborted on an assertion (``SIGABRT``) while a broker went away mid-request
(``docs/operations.md``); in the supervisor's own process that ended ``threes run``. The
isolated :class:`~threes.pipeline.flow_reader.FlowReader` takes the readings in a child of its own,
against the real broker here: the child is killed with the signal such a crash sends, a new
child starts, and readings go on (with a record produced after the crash in them).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

from kernel.kafka import clients
from kernel.kafka.topics import ensure_compacted_topic
from threes.config import pipeline_from_dict
from threes.pipeline.flow_reader import FlowReader
from threes.pipeline.kafka_probe import KafkaProbe


def _wait(what: str, check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_crashed_reading_child_is_replaced_and_readings_go_on(kafka: Any, kafka_conf: dict[str, Any],
                                                               unique: str) -> None:
    topic = f"updates.flow.{unique}"
    ensure_compacted_topic(kafka_conf, topic, partitions=2)
    producer = clients.kafka_producer(kafka)
    for i in range(5):
        producer.produce(topic, key=str(i).encode(), value=b"v")
    assert producer.flush(30) == 0
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"db": {"type": "rds", "url": "sqlite://"}},
        "sync": [{"name": f"flow-{unique}", "dead_letter_topic": f"dlq.flow.{unique}",
                  "sinks": [{"name": "db", "type": "rds_sink", "connection": "db", "topics": [topic],
                             "table": "unused", "key": ["id"]}]}],
    })
    reader = FlowReader(pipeline, functools.partial(KafkaProbe, pipeline.kafka), every_s=0.2, isolated=True,
                        max_backoff_s=1.0)
    reader.start()
    try:
        _wait("a first reading", lambda: reader.latest is not None and reader.latest.topics.get(topic) == 5)
        assert reader.latest is not None and reader.latest.lag == {f"flow-{unique}": 5}  # nothing committed yet
        first = reader.pid
        assert first is not None and first != os.getpid()

        os.kill(first, signal.SIGABRT)  # what librdkafka's failed assertion sends
        crashed_at = time.time()
        producer.produce(topic, key=b"after", value=b"v")
        assert producer.flush(30) == 0
        _wait("a new reading child", lambda: reader.pid not in (None, first))
        assert reader.restarts == 1
        _wait("a reading after the crash",
              lambda: reader.latest is not None and reader.latest.at > crashed_at and reader.latest.topics[topic] == 6)
        second = reader.pid
    finally:
        reader.stop()
    assert second is not None
    _wait("the reading child to end on stop", lambda: not _alive(second), timeout_s=10)


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it if it ended
    except ChildProcessError:
        return False
    return finished == 0


def test_threes_run_outlives_a_crash_of_its_live_views_reader(tmp_path: Any, kafka: Any, kafka_conf: dict[str, Any],
                                                              endpoints: Any, unique: str) -> None:
    # The whole wiring: `threes run` reads its live view in a child; that child aborts (as librdkafka did), the
    # run notes it, goes on supervising, and a new child's reading shows a record produced after the crash.
    import re
    import subprocess
    import sys
    from pathlib import Path

    topic = f"updates.run.{unique}"
    ensure_compacted_topic(kafka_conf, topic, partitions=1)  # as the stream job would
    config = Path(tmp_path) / "pipeline.yaml"
    config.write_text(
        f'kafka: {{bootstrap_servers: "{kafka.bootstrap_servers}"}}\n'
        f'connections: {{es: {{type: elasticsearch, hosts: ["{endpoints.elasticsearch_url}"]}}}}\n'
        f"sync:\n  - name: search\n    dead_letter_topic: sync-dlq.{unique}\n"
        f"    sinks: [{{name: idx, type: elasticsearch_sink, connection: es, topics: [{topic}], index: idx_{unique}}}]\n"
    )
    threes = str(Path(sys.executable).with_name("threes"))
    process = subprocess.Popen(
        [threes, "run", str(config), "--only", "sync", "--log-dir", str(Path(tmp_path) / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=os.environ.copy(),
    )
    lines: list[str] = []
    assert process.stdout is not None
    try:
        for line in process.stdout:  # a status line with the first reading (about every 10 s)
            lines.append(line.rstrip("\n"))
            if f" {topic}=0 " in line:
                break
        readers = [pid for pid in _children(process.pid) if "multiprocessing.spawn" in _cmdline(pid)]
        assert len(readers) == 1, "\n".join(lines)
        os.kill(readers[0], signal.SIGABRT)
        producer = clients.kafka_producer(kafka)
        producer.produce(topic, key=b"after", value=None)  # a tombstone: the sink has nothing to write
        assert producer.flush(30) == 0
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if f" {topic}=1 " in line:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=90)
    text = "\n".join(lines) + "\n" + rest
    assert re.search(rf"the flow reader \(pid {readers[0]}\) ended with signal 6; a new one starts in 1 s", text), text
    assert f" {topic}=1 " in "\n".join(lines), text  # read by the new child
    assert process.returncode == 0, text
    assert "[run] stopped: sync stopped (exit code 0)" in rest, text


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (started by any of its threads)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except FileNotFoundError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state
                found.append(int(entry))
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""
