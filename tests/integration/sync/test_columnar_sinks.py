"""The sinks' columnar paths (values decoded by schemas.columnar) against their per-record paths, on real targets."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, select

from connectors.api.sink_records import SinkBatch, latest_per_key
from connectors.rds.config import RdsSinkConfig
from connectors.rds.sink import RdsSink
from kernel.config.policies import RetryPolicy
from kernel.updates import encode_version
from schemas.serde import AvroDeserializer, AvroSerializer
from schemas.store import InMemorySchemaStore
from sync_service.batching import Job
from sync_service.isolation import write_isolating
from sync_service.metrics import SyncMetrics
from sync_service.writer import BatchWriter
from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink
from tests.unit.test_columnar import EVERY_TYPE, every_value

pytestmark = pytest.mark.integration

# the RDS sink's columnar COPY takes scalar columns; nested and binary values stay per record
SCALARS = copy.deepcopy(EVERY_TYPE)
SCALARS["fields"] = [
    {"name": "id", "type": "long"},
    *[f for f in SCALARS["fields"] if f["name"] not in ("b", "a", "a_null", "r", "ra", "fx", "dec_fixed")],
]


def decoded_batch(n: int, *, bad_at: int | None = None) -> SinkBatch:
    store = InMemorySchemaStore()
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(SCALARS, store)
    names = {f["name"] for f in SCALARS["fields"]}
    raw = []
    for i in range(n):
        key = i % (n - 5)  # a few keys twice: the newest version wins
        value = {k: v for k, v in every_value(i).items() if k in names} | {"id": key}
        if i == bad_at:
            value["s"] = "NUL \x00 byte"  # PostgreSQL text refuses NUL
        tomb = i % 11 == 5
        raw.append(FakeMessage(i, key_ser(key), None if tomb else value_ser(value),
                               headers=[("version", encode_version(i + 1))]))
    writer = BatchWriter("svc", ScriptedSink(), AvroDeserializer(store), FakeProducer(), "dlq", RetryPolicy(),
                         SyncMetrics("svc"))
    batch = writer.decode(Job("fake", "t", 0, raw, 100))
    assert batch.tables
    return batch


def rows(sink: RdsSink) -> list[dict[str, Any]]:
    table = Table(sink.config.table, MetaData(), autoload_with=sink.engine)
    with sink.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(table).order_by(table.c.id)).mappings()]


def make_sink(pg: Any, name: str) -> RdsSink:
    sink = RdsSink(RdsSinkConfig(name=name, type="rds_sink", connection="db", topics=["t"], table=name, key=["id"],
                                 create_table=True, value_schema=None), pg)
    sink.open()
    return sink


@pytest.mark.parametrize("session_time_zone", [None, "Asia/Kathmandu"])
def test_postgres_columnar_copy_equals_the_per_record_path(pg: Any, unique: str, session_time_zone: str | None) -> None:
    if session_time_zone:  # zoned timestamps are copied as UTC wall time: whatever the session's zone
        pg = pg.model_copy(update={"url": f"{pg.url}?options=-c%20TimeZone%3D{session_time_zone.replace('/', '%2F')}"})
    columnar, per_record = make_sink(pg, f"col_{unique}"), make_sink(pg, f"rec_{unique}")
    if session_time_zone:
        with columnar.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == session_time_zone
    try:
        batch = decoded_batch(60)
        assert columnar.write(batch) == []
        tables, rest = columnar._rows().columnar(batch, latest_per_key(batch.records))
        assert tables and all(r.is_delete for r in rest), "every upsert went through the columnar COPY"
        assert per_record.write(SinkBatch(batch.topic, 0, 0, 59, batch.records)) == []  # no tables: per record
        got, want = rows(columnar), rows(per_record)
        assert len(got) > 40 and got == want
        # a replay changes nothing
        assert columnar.write(decoded_batch(60)) == [] and rows(columnar) == want
    finally:
        for sink in (columnar, per_record):
            Table(sink.config.table, MetaData()).drop(sink.engine, checkfirst=True)
            sink.close()


def test_postgres_columnar_copy_still_dead_letters_only_the_refused_record(pg: Any, unique: str) -> None:
    sink = make_sink(pg, f"bad_{unique}")
    try:
        batch = decoded_batch(30, bad_at=7)
        failures = write_isolating(sink.write, batch)  # the sink runtime bisects the refused COPY
        assert [f.record.offset for f in failures] == [7]
        assert "0x00" in str(failures[0].error) or "NUL" in str(failures[0].error).upper()
        applied = {r["id"] for r in rows(sink)}
        expected = {r.key for r in batch.records if not r.is_delete and r.offset != 7}
        assert applied and applied <= expected and 7 not in applied
    finally:
        Table(sink.config.table, MetaData()).drop(sink.engine, checkfirst=True)
        sink.close()
