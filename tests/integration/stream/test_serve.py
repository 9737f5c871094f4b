"""``threes serve CONFIG``: the JVM state store as a queryable replica, on real Kafka, with no Spark.

Answers follow the compacted topic (an update, a tombstone, ``as_of`` on versions at equal times);
bad queries get 4xx JSON; 500 concurrent clients get correct answers; a kill -9 restarts from the
RocksDB folder reading only the tail, with the same answers; a corrupt folder is rebuilt from the
topics with a warning; ``threes query`` asks the running server. (A query while a store loads, the
token and the request limits: ``stream_app/jvm``'s ``QueryServerTest``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

from .test_as_of import T1, T2, T_A, put_version

pytestmark = pytest.mark.integration

THREES = Path(sys.executable).parent / "threes"
ENV = {**os.environ, "THREES_HOME": str(ROOT / ".threes")}  # the local stack's connector jars: no Ivy at start


def line(process: subprocess.Popen[str], timeout_s: float = 300.0) -> str:
    """The process's next stdout line, failing after ``timeout_s`` rather than hanging."""
    import select

    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    assert ready, f"no output in {timeout_s:.0f} s"
    return process.stdout.readline()


def get(base: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(base + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)


class Served:
    """A ``threes serve`` process of a test."""

    def __init__(self, config: Path, cwd: Path):
        self.config, self.cwd = config, cwd
        self.state = cwd / ".threes" / "serve" / yaml_name(config)  # the default, which threes query finds
        self.process: subprocess.Popen[str] | None = None
        self.base = ""

    def start(self) -> Served:
        log = (self.cwd / "serve.out").open("a")
        self.process = subprocess.Popen(
            [str(THREES), "serve", str(self.config)],
            cwd=self.cwd,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        first = line(self.process)
        assert "serving" in first, first + (self.cwd / "serve.out").read_text()[-3000:]
        self.base = first.split(" on ", 1)[1].split(" ", 1)[0]
        assert line(self.process).strip() == "ready", (self.cwd / "serve.out").read_text()[-3000:]
        return self

    def jvm_pid(self) -> int:
        return int(json.loads((self.state / "server.json").read_text())["pid"])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


def yaml_name(config: Path) -> str:
    import yaml

    return yaml.safe_load(config.read_text())["stream"]["name"]


@pytest.fixture
def pipeline(env, kafka, tmp_path) -> Path:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {kafka.bootstrap_servers}
          schema_topic: {kafka.schema_topic}
        stream:
          name: serve-{env.unique}
          events: {{topic: {env.events}, value_schema: flight.avsc}}
          snapshots:
            - name: airports
              topics: [{env.airports}]
              key_schema: nycflights13/airport_key
              value_schema: nycflights13/airport
              retention: 30 days
          lookups:
            - {{snapshot: airports, on: {{origin: faa}}, prefix: origin_, fields: [name]}}
          enriched_topic: {env.enriched}
          dead_letter_topic: {env.dlq}
          checkpoint_location: {tmp_path / "checkpoint"}
        """)
    )
    return config


def test_serve_answers_from_the_store_and_restarts_from_its_folder_after_kill_9(env, pipeline, tmp_path):
    put_version(env, "A", T_A)
    put_version(env, "B", T1)
    put_version(env, "B at the same time, later offset", T1)
    put_version(env, "C", T2)
    put_version(env, "John F Kennedy Intl", T_A, faa="JFK")
    served = Served(pipeline, tmp_path).start()
    try:
        base = served.base
        code, doc, _ = get(base, "/snapshots/airports/EWR")
        assert code == 200 and doc["value"]["name"] == "C" and doc["value"]["lat"] == 40.69
        assert doc["offsets"][env.airports]  # the offsets the store covers
        code, doc, _ = get(base, f"/snapshots/airports/EWR?as_of={T1 + 1}")
        assert code == 200 and doc["value"]["name"] == "B at the same time, later offset"
        assert doc["valid_from_ms"] == T1 and doc["valid_to_ms"] == T2
        code, doc, _ = get(base, f"/snapshots/airports/EWR?as_of={T_A - 1}")
        assert code == 404 and "no version" in doc["error"]
        # a range scan in the store's key order (the Avro key bodies: a string's length, then its bytes)
        code, doc, _ = get(base, "/snapshots/airports?from=EWR&limit=10")
        assert code == 200 and [e["key"]["faa"] for e in doc["entries"]] == ["EWR", "JFK"]
        assert doc["entries"][1]["value"]["name"] == "John F Kennedy Intl"
        code, doc, _ = get(base, "/snapshots/airports?from=EWR&to=JFK&limit=10")
        assert [e["key"]["faa"] for e in doc["entries"]] == ["EWR"]
        assert len(get(base, "/snapshots/airports?limit=1")[1]["entries"]) == 1

        # the store follows the topic: a tombstone
        put_version(env, None, T2 + 1, faa="JFK")
        deadline = time.monotonic() + 60
        while get(base, "/snapshots/airports/JFK")[0] != 404:
            assert time.monotonic() < deadline, "the tombstone never reached the store"
            time.sleep(0.2)

        # bad queries: clear 4xx JSON, never a traceback
        assert get(base, "/snapshots/nope/EWR")[0] == 404
        assert get(base, "/snapshots/airports/EWR?as_of=yesterday")[0] == 400
        assert get(base, "/snapshots/airports/..%2F..%2Fetc%2Fpasswd")[0] == 404
        assert get(base, "/snapshots/airports?limit=0")[0] == 400
        code, doc, _ = get(base, "/snapshots/airports/" + "K" * (1 << 20))
        assert code in (404, 413, 414) and "Traceback" not in json.dumps(doc)

        # 500 concurrent clients, each 20 queries: every answer right
        def client(i: int) -> int:
            wrong = 0
            for _ in range(20):
                code, doc, _ = get(base, "/snapshots/airports/EWR")
                wrong += code != 200 or doc["value"]["name"] != "C"
            return wrong

        with ThreadPoolExecutor(500) as pool:
            assert sum(pool.map(client, range(500))) == 0

        # kill -9 of the JVM: the restart restores the folder, reads only the tail, same answers
        os.kill(served.jvm_pid(), signal.SIGKILL)
        served.process.wait(60)  # type: ignore[union-attr]
        time.sleep(1)
        put_version(env, "D", T2 + 2)
        served = Served(pipeline, tmp_path).start()
        base = served.base
        code, doc, _ = get(base, "/snapshots/airports")
        assert code == 200 and doc["restored_keys"] >= 1, doc
        assert get(base, "/snapshots/airports/EWR")[1]["value"]["name"] == "D"
        assert get(base, f"/snapshots/airports/EWR?as_of={T1 + 1}")[1]["value"]["name"] == (
            "B at the same time, later offset"
        )
        assert get(base, "/snapshots/airports/JFK")[0] == 404

        # threes query asks the running server
        done = subprocess.run(
            [str(THREES), "query", str(pipeline), "airports", "EWR"],
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["value"]["name"] == "D"
    finally:
        served.stop()


def test_a_corrupt_store_folder_is_rebuilt_from_the_topics(env, pipeline, tmp_path):
    from .conftest import airport

    for i in range(200):
        env.producer.produce(
            env.airports,
            key=env.key_ser({"faa": f"K{i:03d}"}),
            value=env.airport_ser({**airport("EWR", f"v{i}"), "faa": f"K{i:03d}"}),
        )
    assert env.producer.flush(30) == 0
    served = Served(pipeline, tmp_path).start()
    state = served.state
    served.stop()
    for path in state.rglob("*.sst"):  # truncate every table file
        path.write_bytes(b"\x01\x02\x03")
    served = Served(pipeline, tmp_path).start()
    try:
        code, doc, _ = get(served.base, "/snapshots/airports/K007")
        assert code == 200 and doc["value"]["name"] == "v7"  # never a wrong answer from the corrupt folder
        code, doc, _ = get(served.base, "/snapshots/airports")
        assert doc["keys"] == 200 and doc["restored_keys"] == -1  # read again from the topic
        log = (state / "serve.log").read_text()
        assert "rebuilt from the topics" in log, log[-3000:]
    finally:
        served.stop()
