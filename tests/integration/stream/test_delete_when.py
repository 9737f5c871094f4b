"""``delete_when`` end to end: the stream job's tombstones, through a running sync service, delete in every sink.

An update topic's ``delete_when`` makes an event emit a tombstone (a null value with the
event's version) for its key; the sync service then deletes the PostgreSQL row and the
Elasticsearch document. The S3 sink is an archive: it appends the tombstone as a row with
``deleted: true`` and its version, so the key's newest row (a reader's merge, as
``tests/integration/sync/test_s3_sink.s3_state`` does it) says deleted. A second job over the
same events writes byte-identical update records, which change nothing in the sinks.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from elasticsearch import NotFoundError, helpers
from sqlalchemy import MetaData, Table, inspect, select

from kernel.updates import decode_version
from sync_service.service import SyncService
from tests.integration.sync.helpers import group_lag, pipeline, run_in_thread, wait_until
from tests.integration.sync.test_s3_sink import list_keys, read_rows

from .language_helpers import produce, write_schema

pytestmark = pytest.mark.spark

ORDER = {
    "type": "record",
    "name": "OrderEvent",
    "namespace": "threes.test.deletes",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "status", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}


def order(i: int, status: str, minute: int = 0) -> tuple[bytes, dict[str, Any]]:
    ts = dt.datetime(2024, 5, 1, 12, minute, tzinfo=dt.UTC)
    return str(i).encode(), {"order_id": i, "status": status, "amount": Decimal("10.05") * i, "ts": ts}


FIRST = [order(i, "open") for i in range(1, 7)]
# 2 changes, 3 and 5 are cancelled (tombstones), 6 becomes a test order (this update topic's where drops it)
SECOND = [order(2, "shipped", 1), order(3, "cancelled", 2), order(5, "cancelled", 3), order(6, "test", 4)]
UPDATES = len(FIRST) + 3  # six upserts, one more upsert, two tombstones


def pg_state(engine: Any, table: str) -> dict[int, tuple[str, int]]:
    if not inspect(engine).has_table(table):
        return {}
    t = Table(table, MetaData(), autoload_with=engine)
    with engine.connect() as conn:
        return {r.order_id: (r.status, r._version) for r in conn.execute(select(t))}


def es_state(es: Any, index: str) -> dict[int, tuple[str, int]]:
    try:
        es.indices.refresh(index=index)
    except NotFoundError:
        return {}
    return {int(h["_id"]): (h["_source"]["status"], h["_version"])
            for h in helpers.scan(es, index=index, version=True)}


def s3_newest(s3: Any, bucket: str) -> dict[int, tuple[bool, int, str | None]]:
    """Per key, the archive's row of highest version: (deleted, version, status)."""
    best: dict[str, dict[str, Any]] = {}
    for key in list_keys(s3, bucket):
        for row in read_rows(s3, bucket, key):
            seen = best.get(row["key"])
            if seen is None or (row["version"], row["offset"]) > (seen["version"], seen["offset"]):
                best[row["key"]] = row
    # the archive's key column is the record key as JSON: {"order_id": 4}
    return {json.loads(k)["order_id"]: (r["deleted"], r["version"], (r["value"] or {}).get("status"))
            for k, r in best.items()}


def update_records(env: Any, expected: int) -> list[tuple[int, int, bytes, bytes | None, bytes]]:
    """The update topic's records: (partition, offset, key bytes, value bytes, version header bytes)."""
    got = env.consume(env.updates, lambda rs: len(rs) >= expected, deserialize=False)
    return sorted(((r["partition"], r["offset"], r["key"], r["raw"], r["headers"]["version"]) for r in got),
                  key=lambda r: r[:2])


def test_delete_when_deletes_in_every_sink_and_a_second_job_writes_the_same_bytes(
    spark, env, kafka, pg, pg_engine, es_conn, es, s3_conn, s3, unique
):
    write_schema(env, "order.avsc", ORDER)
    table, index, bucket = f"orders_{unique}", f"orders-{unique}", f"orders-{unique}"
    s3.create_bucket(Bucket=bucket)
    projection = {"topic": env.updates, "kind": "projection", "key": ["order_id"], "version": "offset",
                  "where": "status <> 'test'", "delete_when": "status = 'cancelled'"}
    config = env.config(
        events={"topic": env.events, "value_schema": "order.avsc", "starting_offsets": "earliest"},
        snapshots=[], lookups=[], updates=[projection],
    )
    sync = pipeline(kafka, {
        "pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()},
        "es": {"type": "elasticsearch", "hosts": es_conn.hosts},
        "s3": {"type": "s3", "endpoint_url": s3_conn.endpoint_url, "region": s3_conn.region,
               "access_key_id": s3_conn.access_key_id,
               "secret_access_key": s3_conn.secret_access_key.get_secret_value(), "path_style": True},
    }, [{
        "name": f"orders-{unique}", "dead_letter_topic": f"sync.dlq.{unique}",
        "batch": {"max_records": 100, "max_age_ms": 200},
        "sinks": [
            {"name": "db", "type": "rds_sink", "connection": "pg", "topics": [env.updates], "table": table,
             "key": ["order_id"], "create_table": True},
            {"name": "search", "type": "elasticsearch_sink", "connection": "es", "topics": [env.updates],
             "index": index},
            {"name": "lake", "type": "s3_sink", "connection": "s3", "topics": [env.updates], "bucket": bucket,
             "format": "jsonl", "rotate_records": 100, "rotate_interval_s": 1.0},
        ],
    }])
    thread = stop = None
    try:
        job = env.start(spark, config)  # runs on: the events come in two rounds
        produce(env, env.events, FIRST, ORDER)
        service = SyncService(sync.kafka, sync.sync[0], dict(sync.connections))
        thread, stop, errors = run_in_thread(service)
        every = set(range(1, 7))
        wait_until(lambda: set(pg_state(pg_engine, table)) == every and set(es_state(es, index)) == every
                   and set(s3_newest(s3, bucket)) == every, 120, "the first round in every sink")

        produce(env, env.events, SECOND, ORDER)
        kept = {1: "open", 2: "shipped", 4: "open", 6: "open"}
        wait_until(lambda: {k: s for k, (s, _v) in pg_state(pg_engine, table).items()} == kept
                   and {k: s for k, (s, _v) in es_state(es, index).items()} == kept
                   and all(s3_newest(s3, bucket).get(k, (False,))[0] for k in (3, 5)), 120,
                   "the deletes in every sink")
        assert not errors, errors
        first_run = update_records(env, UPDATES)
        assert len(first_run) == UPDATES
        tombstones = [r for r in first_run if r[3] is None]
        assert len(tombstones) == 2
        # a tombstone's version is its event's offset: newer than the key's upsert, so the sinks apply it
        lake = s3_newest(s3, bucket)
        assert {k for k, (deleted, _v, _s) in lake.items() if deleted} == {3, 5}
        assert {k: s for k, (deleted, _v, s) in lake.items() if not deleted} == kept
        versions = {k: v for k, (_s, v) in pg_state(pg_engine, table).items()}
        assert versions == {k: v for k, (_s, v) in es_state(es, index).items()}
        assert {decode_version(r[4]) for r in tombstones} == {v for k, (d, v, _s) in lake.items() if d}
        job.stop(checkpoint=False)

        # the same events through a second job (its own checkpoint): the same update records, byte for byte
        again = config.model_copy(update={"checkpoint_location": str(env.tmp / "checkpoint-again")})
        second = env.start(spark, again, available_now=True)
        assert second.await_termination(180)
        both = update_records(env, 2 * UPDATES)
        assert len(both) == 2 * UPDATES
        ends = {p: max(o for q, o, *_ in first_run if q == p) for p, *_ in first_run}
        replayed = [r for r in both if r[1] > ends.get(r[0], -1)]
        assert Counter(r[2:] for r in replayed) == Counter(r[2:] for r in first_run)
        # and the sinks, which apply only newer versions, keep what they had
        group = sync.sync[0].consumer_group()
        wait_until(lambda: group_lag(env.conf, group, env.updates) == 0, 60, "the sync service to commit the replay")
        assert {k: v for k, (_s, v) in pg_state(pg_engine, table).items()} == versions
        assert {k: v for k, (_s, v) in es_state(es, index).items()} == versions
        assert {k: s for k, (s, _v) in pg_state(pg_engine, table).items()} == kept
        assert not errors, errors
    finally:
        if stop is not None:
            stop.set()
            thread.join(60)
        for name in (table, f"{table}__deleted"):
            Table(name, MetaData()).drop(pg_engine, checkfirst=True)
        try:
            es.indices.delete(index=index)
        except NotFoundError:
            pass
        for key in list_keys(s3, bucket):
            s3.delete_object(Bucket=bucket, Key=key)
        s3.delete_bucket(Bucket=bucket)


def test_a_replayed_micro_batch_writes_the_same_update_bytes(spark, env):
    """A micro-batch whose commit was lost (a crash after the write) runs again: the same records, byte for byte.

    The replay joins the snapshot offsets recorded for the batch and evaluates the same expressions
    (where, delete_when) on the same events, so upserts and tombstones repeat with their versions.
    """
    write_schema(env, "order.avsc", ORDER)
    projection = {"topic": env.updates, "kind": "projection", "key": ["order_id"], "version": "offset",
                  "where": "status <> 'test'", "delete_when": "status = 'cancelled'"}
    config = env.config(
        events={"topic": env.events, "value_schema": "order.avsc", "starting_offsets": "earliest"},
        snapshots=[], lookups=[], updates=[projection], where="order_id <> 4",
    )
    produce(env, env.events, FIRST + SECOND, ORDER)
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(180)
    first = update_records(env, UPDATES - 1)  # order 4 dropped by the stream's where
    assert len(first) == UPDATES - 1 and sum(r[3] is None for r in first) == 2
    last = job.last_batch["batch_id"]
    job.stop(checkpoint=False)
    # the crash: the batch's output was written, its commit never was
    (env.tmp / "checkpoint" / "events" / "commits" / str(last)).unlink()
    again = env.start(spark, config, available_now=True)
    assert again.await_termination(180)
    assert again.last_batch["batch_id"] == last and again.last_batch["replay"] is True
    both = update_records(env, 2 * len(first))
    assert len(both) == 2 * len(first)
    ends = {p: max(o for q, o, *_ in first if q == p) for p, *_ in first}
    replayed = [r for r in both if r[1] > ends.get(r[0], -1)]
    assert Counter(r[2:] for r in replayed) == Counter(r[2:] for r in first)
