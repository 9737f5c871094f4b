"""Interactive queries on the job's metrics port: real Kafka, real Spark, a running job.

The answer equals the snapshot after a change and is 404 after a tombstone; ``as_of``
on a versioned snapshot; a query answers while a micro-batch is running; 200
concurrent clients for 10 s get correct answers; the broadcast and the partitioned
engines (one bucket file read).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .conftest import flight
from .test_as_of import T1, T2, T_A, put_version

pytestmark = pytest.mark.spark


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def until(check: Any, timeout_s: float = 120.0) -> Any:
    """Poll ``check()`` until it returns something truthy (the job refreshes between micro-batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.3)


def covers(job: Any, topic: str, partition: int, offset: int) -> bool:
    return job.snapshots["airports"].offsets.get(topic, {}).get(partition, 0) > offset


@pytest.mark.parametrize("engine", ["broadcast", "partitioned"])
def test_queries_follow_the_snapshot_answer_during_a_batch_and_under_200_clients(spark, env, engine) -> None:
    put_version(env, "A", T_A)
    put_version(env, "John F Kennedy Intl", T_A, faa="JFK")
    port = free_port()
    snapshot = {"name": "airports", "topics": [env.airports], "key_schema": "nycflights13/airport_key",
                "value_schema": "nycflights13/airport", "retention": "30 days"}
    if engine == "partitioned":
        snapshot["broadcast_max_rows"] = 0
    config = env.config(snapshots=[snapshot], metrics_port=port, lookups=[
        {"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_", "fields": ["name"]}])
    job = env.start(spark, config)
    snap = job.snapshots["airports"]
    assert snap.mode == engine

    code, doc = get(port, "/snapshots/airports/EWR")
    assert code == 200 and doc["value"]["name"] == "A" and doc["value"]["lat"] == 40.69
    assert doc["offsets"] == json.loads(json.dumps({t: {str(p): o for p, o in ps.items()}
                                                    for t, ps in snap.offsets.items()}))
    code, doc = get(port, "/snapshots/airports")
    assert code == 200 and doc["keys"] == 2 and doc["engine"] == engine and doc["versions"] == 2
    assert doc["retention"] == "30 days"

    # a change: once the snapshot covers it, the answer is the new value
    partition, offset = put_version(env, "B", T1)
    env.put_flights([flight(1)])  # a micro-batch refreshes the snapshot
    until(lambda: covers(job, env.airports, partition, offset))
    code, doc = get(port, "/snapshots/airports/EWR")
    assert code == 200 and doc["value"]["name"] == "B"
    # a tombstone: 404
    partition, offset = put_version(env, None, T2, faa="JFK")
    env.put_flights([flight(2)])
    until(lambda: covers(job, env.airports, partition, offset))
    code, doc = get(port, "/snapshots/airports/JFK")
    assert code == 404 and doc["error"] == "deleted (tombstone)"
    # as of a time: the version valid then; before the key existed: 404; a bad time or key: 400
    code, doc = until(lambda: (lambda r: r if r[0] == 200 and r[1]["valid_to_ms"] else None)(
        get(port, f"/snapshots/airports/EWR?as_of={T_A + 1}")))
    assert doc["value"]["name"] == "A" and doc["valid_from_ms"] == T_A and doc["valid_to_ms"] == T1
    code, doc = get(port, "/snapshots/airports/EWR?as_of=2013-01-07T00:00:00Z")
    assert code == 200 and doc["value"]["name"] == "B"
    assert get(port, f"/snapshots/airports/EWR?as_of={T_A - 1}")[0] == 404
    assert get(port, "/snapshots/airports/EWR?as_of=soon")[0] == 400
    assert get(port, "/snapshots/airports?faa=EWR&nope=1")[0] == 400
    assert get(port, "/snapshots/nosuch/EWR")[0] == 404

    # a query while a micro-batch runs: the batch is held in the middle until the answer came
    inside, release = threading.Event(), threading.Event()
    records = job._batch.records

    def held(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        release.wait(120)
        return records(*args, **kwargs)

    job._batch.records = held
    try:
        env.put_flights([flight(3)])
        assert inside.wait(120)
        code, doc = get(port, "/snapshots/airports/EWR")
        assert code == 200 and doc["value"]["name"] == "B"
    finally:
        release.set()
        job._batch.records = records

    # 200 concurrent clients for 10 s: every answer correct
    deadline = time.monotonic() + 10

    def client(i: int) -> tuple[int, int]:
        good = bad = 0
        while time.monotonic() < deadline:
            code, doc = get(port, "/snapshots/airports/EWR" if i % 2 else "/snapshots/airports/JFK")
            ok = (code, doc.get("value", {}).get("name")) == ((200, "B") if i % 2 else (404, None))
            good, bad = good + ok, bad + (not ok)
        return good, bad

    with ThreadPoolExecutor(200) as pool:
        results = list(pool.map(client, range(200)))
    assert sum(b for _g, b in results) == 0 and all(g > 0 for g, _b in results)
    job.stop()

    # threes query: the same answers without the job, from its checkpoint plus the topics' tail
    from stream_app.snapshot.offline_query import query_offline

    put_version(env, "C", T2)  # written after the job stopped: only the tail has it
    code, doc = query_offline(config, env.kafka, spark, env.tmp, "airports", ["EWR"])
    assert code == 200 and doc["value"]["name"] == "C"
    code, doc = query_offline(config, env.kafka, spark, env.tmp, "airports", ["faa=EWR"], as_of=str(T_A + 1))
    assert code == 200 and doc["value"]["name"] == "A"
    code, doc = query_offline(config, env.kafka, spark, env.tmp, "airports", ["JFK"])
    assert code == 404
