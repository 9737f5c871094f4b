"""Start-up order on real Kafka: the stream job's missing inputs are one clear line, ``threes run`` waits and creates.

``threes stream run`` started before its events topic (or a snapshot topic) exists
stops at once, before Spark starts, with one line naming the topic and what creates
it: no traceback, no ``AttributeError`` from ``stop()``. ``threes run --only sync``
waits for its sinks' topics, naming who creates each, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

THREES = str(Path(sys.executable).with_name("threes"))

CONFIG = """\
kafka: {{bootstrap_servers: "{bootstrap}"}}
connections:
  es: {{type: elasticsearch, hosts: ["{es}"]}}
stream:
  events: {{topic: events.{u}, value_schema: event.avsc}}
  snapshots:
    - {{name: things, topics: [{snapshot_topic}], key_schema: key.avsc, value_schema: thing.avsc}}
  lookups: [{{snapshot: things, on: {{thing_id: thing_id}}, prefix: thing_}}]
  enriched_topic: enriched.{u}
  updates: [{{topic: updates.{u}, key: [event_id]}}]
  dead_letter_topic: dlq.{u}
  checkpoint_location: checkpoints
sync:
  - name: search
    dead_letter_topic: sync-dlq.{u}
    sinks:
      - {{name: idx, type: elasticsearch_sink, connection: es, topics: [updates.{u}], index: idx_{u}}}
"""


def write_config(folder: Path, endpoints: Any, unique: str, snapshot_topic: str) -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(CONFIG.format(bootstrap=endpoints.kafka_bootstrap, es=endpoints.elasticsearch_url, u=unique,
                                  snapshot_topic=snapshot_topic))
    return path


def stream_run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([THREES, "stream", "run", str(config)], capture_output=True, text=True, timeout=120,
                          cwd=config.parent, env=os.environ.copy())


def test_stream_run_before_its_events_topic_exists_is_one_line(tmp_path: Path, endpoints: Any, unique: str,
                                                                kafka_conf: dict[str, Any]) -> None:
    from kernel.kafka.topics import ensure_compacted_topic

    ensure_compacted_topic(kafka_conf, f"things.{unique}", partitions=1)
    done = stream_run(write_config(tmp_path, endpoints, unique, f"things.{unique}"))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"error the events topic 'events.{unique}' (stream.events.topic) does not exist. start its producer first "
        "(`threes replay` creates it), create it, or run the pipeline with `threes run`, which creates it from "
        "stream.events.topic_spec"
    ], done.stderr
    assert "Traceback" not in done.stderr and "AttributeError" not in done.stderr


def test_stream_run_before_a_snapshot_topic_exists_names_it_and_its_source(tmp_path: Path, endpoints: Any,
                                                                           unique: str) -> None:
    done = stream_run(write_config(tmp_path, endpoints, unique, f"missing.{unique}"))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error the snapshot topic 'missing.{unique}' (stream.snapshots[0].topics) "
                                  "does not exist. start its source first"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_run_only_sync_waits_for_its_topics_and_stops_cleanly(tmp_path: Path, endpoints: Any, unique: str) -> None:
    config = write_config(tmp_path, endpoints, unique, f"things.{unique}")
    process = subprocess.Popen(
        [THREES, "run", str(config), "--only", "sync", "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=os.environ.copy(),
    )
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if "waiting for topic" in line:
            break
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0, "\n".join(lines) + rest
    waiting = next(line for line in lines if "waiting for topic" in line)
    assert f"sync waiting (waiting for topic updates.{unique} (created by the stream job))" in waiting
    assert not (tmp_path / "logs" / "sync.log").exists()  # never started: nothing to wait for was there
    assert "Traceback" not in rest
    assert "[run] stopped: sync stopped (not started)" in rest


def test_run_restarts_a_part_that_dies_after_it_was_ready(tmp_path: Path, endpoints: Any, unique: str,
                                                          kafka_conf: dict[str, Any]) -> None:
    import re

    from kernel.kafka.topics import ensure_compacted_topic

    ensure_compacted_topic(kafka_conf, f"updates.{unique}", partitions=1)  # as the stream job would
    config = write_config(tmp_path, endpoints, unique, f"things.{unique}")
    process = subprocess.Popen(
        [THREES, "run", str(config), "--only", "sync", "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=os.environ.copy(),
    )
    lines: list[str] = []
    pids: list[int] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        started = re.match(r"\[run\] started sync \(pid (\d+)\)", line)
        if started:
            pids.append(int(started.group(1)))
            if len(pids) == 1:
                os.kill(pids[0], signal.SIGKILL)  # the sync process dies (an OOM kill, say)
            else:
                break
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=90)
    text = "\n".join(lines) + "\n" + rest
    assert len(pids) == 2 and pids[0] != pids[1], text
    assert re.search(r"\[run\] sync exited with code -9 after \d+ s; restarting in 1 s", text), text
    assert process.returncode == 0, text
    assert "Traceback" not in text
