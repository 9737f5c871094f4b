"""As-of (temporal) lookups against a versioned snapshot: real Kafka, real Spark.

A reference value (airport EWR's name) changes at t1 and t2; events at t0 < t1 < t2,
replayed after both changes, get the name valid at their own time, on the broadcast
and the partitioned engines. Also: an event older than the retention gets null and is
counted; the same events run twice give byte-identical update records; a restart
between the changes keeps the versions even when Kafka no longer holds them.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from typing import Any

import pytest
from prometheus_client import REGISTRY

from kernel.updates import with_source_ts

from .conftest import airport, flight

pytestmark = pytest.mark.spark


def ms(day: int, month: int = 1, year: int = 2013) -> int:
    return int(dt.datetime(year, month, day, tzinfo=dt.UTC).timestamp() * 1000)


T_A, T1, T2 = ms(1), ms(5), ms(10)  # versions: A from Jan 1 (Kafka timestamp), B from Jan 5, C from Jan 10
RETENTION = "30 days"  # horizon: Jan 10 - 30 days = Dec 11, 2012


def put_version(
    env: Any, name: str | None, at_ms: int, header: bool = True, faa: str = "EWR"
) -> tuple[int, int]:
    """``faa`` as ``name`` (``None``: a tombstone) from ``at_ms``: the ``threes.source_ts`` header, or only
    the Kafka record timestamp. Returns its (partition, offset)."""
    value = None if name is None else env.airport_ser(airport(faa, name))
    acked: list[Any] = []
    if header:
        # a Kafka timestamp far from the source time: the header must win
        env.producer.produce(env.airports, key=env.key_ser({"faa": faa}), value=value,
                             headers=with_source_ts(None, at_ms), timestamp=ms(1, 6, 2020),
                             on_delivery=lambda err, msg: acked.append(msg))
    else:
        env.producer.produce(env.airports, key=env.key_ser({"faa": faa}), value=value, timestamp=at_ms,
                             on_delivery=lambda err, msg: acked.append(msg))
    assert env.producer.flush(10) == 0
    return acked[0].partition(), acked[0].offset()


def at(i: int, when: dt.datetime) -> dict[str, Any]:
    event = flight(i, origin="EWR", dest="EWR")
    event["time_hour"] = when
    return event


EVENTS = {
    1: dt.datetime(2013, 1, 2, tzinfo=dt.UTC),  # t0: A
    2: dt.datetime(2013, 1, 6, tzinfo=dt.UTC),  # between t1 and t2: B
    3: dt.datetime(2013, 1, 5, tzinfo=dt.UTC),  # exactly t1: B (an interval includes its start)
    4: dt.datetime(2013, 1, 12, tzinfo=dt.UTC),  # after t2: C
    5: dt.datetime(2012, 12, 20, tzinfo=dt.UTC),  # inside the retention, before EWR existed: null
    6: dt.datetime(2012, 11, 1, tzinfo=dt.UTC),  # older than the retention: null, counted
}
EXPECTED = {1: "A", 2: "B", 3: "B", 4: "C", 5: None, 6: None}


def as_of_config(env: Any, engine: str, checkpoint: str = "checkpoint", **extra: Any) -> Any:
    snapshot = {"name": "airports", "topics": [env.airports], "key_schema": "nycflights13/airport_key",
                "value_schema": "nycflights13/airport", "retention": RETENTION}
    if engine == "partitioned":
        snapshot["broadcast_max_rows"] = 0
    return env.config(
        snapshots=[snapshot],
        lookups=[
            {"snapshot": "airports", "on": {"origin": "faa"}, "as_of": "time_hour", "prefix": "origin_",
             "fields": ["name"]},
            {"snapshot": "airports", "on": {"dest": "faa"}, "prefix": "dest_", "fields": ["name"]},
        ],
        checkpoint_location=str(env.tmp / checkpoint),
        **extra,
    )


def run_once(env: Any, spark: Any, config: Any, expect: int) -> list[dict[str, Any]]:
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(240)
    job.stop()
    return job


def too_old_total(job: str) -> float:
    return REGISTRY.get_sample_value("threes_stream_as_of_too_old_total", {"job": job, "snapshot": "airports"}) or 0


@pytest.mark.parametrize("engine", ["broadcast", "partitioned"])
def test_events_replayed_after_both_changes_get_the_value_valid_at_their_time(spark, env, engine) -> None:
    put_version(env, "A", T_A, header=False)
    put_version(env, "B", T1)
    put_version(env, "C", T2)
    env.put_flights([at(i, when) for i, when in EVENTS.items()])
    config = as_of_config(env, engine)
    before = too_old_total(config.name)
    job = run_once(env, spark, config, len(EVENTS))
    if engine == "partitioned":
        assert job.snapshots["airports"].mode == "partitioned"
    got = env.consume(env.enriched, lambda rs: len(rs) >= len(EVENTS))
    by_id = {r["value"]["flight_id"]: r["value"] for r in got}
    assert {i: v["origin_name"] for i, v in by_id.items()} == EXPECTED
    assert {v["dest_name"] for v in by_id.values()} == {"C"}  # the lookup without as_of: the latest value
    assert job.too_old == {"airports": 1}
    assert too_old_total(config.name) - before == 1


def test_the_same_events_twice_give_byte_identical_update_records(spark, env) -> None:
    put_version(env, "A", T_A, header=False)
    put_version(env, "B", T1)
    put_version(env, "C", T2)
    env.put_flights([at(i, when) for i, when in EVENTS.items()])
    updates = [{"topic": env.updates, "kind": "projection", "key": ["flight_id"], "version": "offset"}]
    run_once(env, spark, as_of_config(env, "broadcast", "first", updates=updates), len(EVENTS))
    first = env.consume(env.updates, lambda rs: len(rs) >= len(EVENTS))
    run_once(env, spark, as_of_config(env, "broadcast", "second", updates=updates), len(EVENTS))
    both = env.consume(env.updates, lambda rs: len(rs) >= 2 * len(EVENTS))
    assert {r["value"]["flight_id"]: r["value"]["origin_name"] for r in first} == EXPECTED
    # every update record of the first run again, byte for byte, in the second (and nothing else)
    seen = Counter((r["key"], r["raw"]) for r in both)
    assert len(seen) == len(EVENTS) and set(seen.values()) == {2}, seen


@pytest.mark.parametrize("engine", ["broadcast", "partitioned"])
def test_a_restart_between_the_changes_keeps_the_versions_kafka_no_longer_has(spark, env, engine) -> None:
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from kernel.kafka import clients

    put_version(env, "A", T_A, header=False)
    put_version(env, "B", T1)
    env.put_flights([at(1, EVENTS[1])])
    config = as_of_config(env, engine)
    job = run_once(env, spark, config, 1)
    assert job.snapshots["airports"].versions.source == "topics"
    first = env.consume(env.enriched, lambda rs: len(rs) >= 1)
    assert first[0]["value"]["origin_name"] == "A"
    # Kafka forgets A and B (as compaction would): only the checkpointed versions still know them
    from .conftest import end_offsets

    ends = end_offsets(env.conf, env.airports)
    admin = clients.kafka_admin(env.kafka)
    # DeleteRecords needs the delete policy too; the snapshot still reads the topic (compact,delete). No
    # time-based retention: the records' timestamps are years old, the broker would delete them all
    resource = ConfigResource(ResourceType.TOPIC, env.airports, incremental_configs=[
        ConfigEntry("retention.ms", "-1", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact,delete", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)
    deadline = time.monotonic() + 60
    while True:  # the broker applies the new policy shortly after the change is accepted
        futures = admin.delete_records([TopicPartition(env.airports, p, o) for p, o in ends.items() if o > 0])
        try:
            for future in futures.values():
                future.result(10)
            break
        except KafkaException as exc:
            if "POLICY_VIOLATION" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    put_version(env, "C", T2)
    env.put_flights([at(i, EVENTS[i]) for i in (2, 3, 4)])
    job = run_once(env, spark, config, 3)
    assert job.snapshots["airports"].versions.source == "checkpoint"
    got = env.consume(env.enriched, lambda rs: len(rs) >= 4)
    assert {r["value"]["flight_id"]: r["value"]["origin_name"] for r in got} == {1: "A", 2: "B", 3: "B", 4: "C"}


@pytest.mark.parametrize("wait", [True, False])
def test_an_event_arriving_before_its_reference_version_gets_it_when_the_lookup_waits(spark, env, wait) -> None:
    import threading

    put_version(env, "A", T_A, header=False)
    put_version(env, "B", T1)
    env.put_flights([at(7, dt.datetime(2013, 1, 10, tzinfo=dt.UTC))])  # at t2, before the t2 version exists
    config = as_of_config(env, "broadcast")
    if wait:
        waiting = config.lookups[0].model_copy(update={"wait_for_reference": "120 seconds"})
        config = config.model_copy(update={"lookups": [waiting, config.lookups[1]]})
    produced = threading.Event()
    jobs_before = len(env.jobs)

    def waiting() -> bool:
        return len(env.jobs) > jobs_before and env.jobs[-1].waiting_for == "airports"

    def late_reference() -> None:
        # C (valid from t2) is written only once the micro-batch holding the event waits for it
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and not waiting():
            time.sleep(0.1)
        if waiting():
            put_version(env, "C", T2)
            produced.set()

    if wait:
        threading.Thread(target=late_reference, daemon=True).start()
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(240)
    job.stop()
    got = env.consume(env.enriched, lambda rs: len(rs) >= 1)
    if wait:
        assert produced.is_set()  # the batch did wait, and C came while it waited
        assert got[0]["value"]["origin_name"] == "C"
    else:
        assert got[0]["value"]["origin_name"] == "B"  # joined with what the snapshot had: the older version


def test_realtime_as_of_lookups_read_the_jvm_stores_versions_and_the_job_serves_them(spark, env) -> None:
    """Real-time mode: the same events and versions as the micro-batch test, the same names; the job's query
    port answers from the same store (``as_of`` with the version's interval)."""
    import json
    import socket
    import urllib.request

    from stream_app.realtime import lookup_jar

    lookup_jar()
    put_version(env, "A", T_A, header=False)
    put_version(env, "B", T1)
    put_version(env, "C", T2)
    env.put_flights([at(i, when) for i, when in EVENTS.items()])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = as_of_config(env, "broadcast", "rt", mode="realtime", checkpoint_interval="5 seconds",
                          query_port=port)
    job = env.start(spark, config)
    try:
        got = env.consume(env.enriched, lambda rs: len(rs) >= len(EVENTS), timeout_s=180)
        by_id = {r["value"]["flight_id"]: r["value"] for r in got}
        # event 6 is older than the retention: the store's horizon gives null, as the micro-batch engines
        assert {i: v["origin_name"] for i, v in by_id.items()} == EXPECTED
        assert {v["dest_name"] for v in by_id.values()} == {"C"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/snapshots/airports/EWR?as_of={T1 + 1}") as resp:
            doc = json.loads(resp.read())
        assert doc["value"]["name"] == "B" and doc["valid_from_ms"] == T1 and doc["valid_to_ms"] == T2
    finally:
        job.stop()
