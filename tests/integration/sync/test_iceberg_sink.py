"""The Iceberg sink on the stack's SQL catalog (PostgreSQL) and S3 warehouse (s3proxy).

The update contract (:class:`threes.testing.sink.SinkContract`), the table read back by Polars'
own Parquet reader (planned by a fresh pyiceberg catalog) against an oracle, exactly once across
a restart and between two replicas, schema evolution and refusal, maintenance, and a catalog cut
off and restored under a running sync service (blocked, then resumed, nothing dead-lettered).
"""

from __future__ import annotations

import random
import threading
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from connectors.api.sink_records import SinkBatch, SinkRecord
from connectors.iceberg.config import IcebergSinkConfig
from connectors.iceberg.connection import IcebergConnection, load_catalog
from connectors.iceberg.maintenance import compact, data_files, expire, offset_holders
from connectors.iceberg.offsets import offset_of, recorded_offsets
from connectors.iceberg.sink import IcebergSink
from connectors.rds.connection import RdsConnection
from connectors.s3.connection import S3Connection
from kernel.config.models import KafkaConfig
from kernel.exceptions import SinkBlockedError
from schemas.serde import fingerprint
from sync_service.service import SyncService
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, pipeline, run_in_thread, wait_until
from tests.integration.sync.iceberg_helpers import TcpProxy, as_yaml, iceberg_connection, read_with_polars
from threes.testing.sink import SinkContract, batch, item, record

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lake(pg: RdsConnection, s3_conn: S3Connection) -> IcebergConnection:
    return iceberg_connection(pg, s3_conn)


def make_sink(lake: IcebergConnection, table: str, **options: Any) -> IcebergSink:
    config = IcebergSinkConfig.model_validate(
        {
            "name": options.pop("name", "lake"),
            "type": "iceberg_sink",
            "connection": "lake",
            "topics": ["updates.items"],
            "table": table,
            "key": ["id"],
            **options,
        }
    )
    sink = IcebergSink(config, lake)
    sink.open()
    return sink


def rows_of(lake: IcebergConnection, table: str) -> list[dict[str, Any]]:
    """The table's rows through a fresh catalog (pyiceberg's reader)."""
    return load_catalog(lake).load_table(table).scan().to_arrow().to_pylist()


class TestIcebergSinkContract(SinkContract):
    @pytest.fixture
    def sink(self, lake: IcebergConnection, unique: str) -> Any:
        sink = make_sink(lake, f"contract_{unique}.items")
        yield sink
        sink.close()

    @pytest.fixture
    def bad_sink(self, pg: RdsConnection, s3_conn: S3Connection, unique: str) -> IcebergSink:
        bad = iceberg_connection(pg, s3_conn).model_copy(update={"password": None})
        bad = bad.model_copy(update={"uri": pg.url.replace("threes@", "threes:wrong-password@")})
        bad = IcebergConnection.model_validate(bad.model_dump(mode="python") | {"password": "wrong-password"})
        config = IcebergSinkConfig(
            name="bad",
            type="iceberg_sink",
            connection="lake",
            topics=["updates.items"],
            table=f"contract_{unique}.bad",
            key=["id"],
        )
        return IcebergSink(config, bad)

    def state(self, sink: IcebergSink) -> dict[str, tuple[int, dict[str, Any]]]:
        return {str(r["id"]): (r["_version"], r) for r in rows_of(sink.connection, sink.config.table)}


def test_a_second_reader_sees_the_oracle_after_updates_and_deletes(lake: IcebergConnection, unique: str) -> None:
    """Random upserts and deletes over two partitions, partitioned by day and bucket: Polars reads the oracle."""
    table = f"oracle_{unique}.items"
    sink = make_sink(
        lake,
        table,
        partition_by=[
            {"field": "updated_at", "transform": "day"},
            {"field": "id", "transform": "bucket", "buckets": 4},
        ],
    )
    rng = random.Random(52)
    oracle: dict[int, int] = {}
    offsets = {0: 0, 1: 0}
    version = 0
    for _ in range(12):
        part = rng.randrange(2)
        recs = []
        for _ in range(rng.randrange(1, 60)):
            version += 1
            key = rng.randrange(0, 80, 2) + part  # each key lives in one partition, as Kafka keys do
            delete = key in oracle and rng.random() < 0.25
            recs.append(record(key, version, offsets[part], delete=delete, partition=part))
            offsets[part] += 1
            if delete:
                oracle.pop(key, None)
            else:
                oracle[key] = version
        assert sink.write(batch(recs)) == []
    sink.close()
    frame = read_with_polars(lake, table)
    got = {r["id"]: (r["_version"], r["name"], r["qty"]) for r in frame.to_dicts()}
    assert len(got) == frame.height  # one row per key
    assert got == {k: (v, item(k, v)["name"], item(k, v)["qty"]) for k, v in oracle.items()}
    spec = load_catalog(lake).load_table(table).spec()
    assert [f.name for f in spec.fields] == ["updated_at_day", "id_bucket"]


def test_a_batch_written_again_after_a_restart_adds_no_row(lake: IcebergConnection, unique: str) -> None:
    """Append mode: a restarted sink skips what the table's snapshot says it holds, whatever the group says."""
    table = f"replay_{unique}.events"
    first = make_sink(lake, table, mode="append", key=[])
    assert first.write(batch([record(k, k, k) for k in range(10)])) == []
    first.close()  # killed after the Iceberg commit, before the Kafka commit: Kafka sends it all again
    second = make_sink(lake, table, mode="append", key=[])
    assert second.write(batch([record(k, k, k) for k in range(15)])) == []  # 0-9 again, 10-14 new
    rows = rows_of(lake, table)
    assert sorted(r["_version"] for r in rows) == list(range(15))
    assert offset_of(recorded_offsets(second.table, "threes.kafka.offsets.lake"), "updates.items", 0) == 14


def test_two_replicas_never_write_a_record_twice(lake: IcebergConnection, unique: str) -> None:
    """Two sinks on the same table write the same batches at once: optimistic commits, offsets re-checked."""
    table = f"replicas_{unique}.events"
    make_sink(lake, table, mode="append", key=[]).write(batch([record(0, 0, 0)]))  # the table exists
    replicas = [make_sink(lake, table, mode="append", key=[]) for _ in range(2)]
    batches = [batch([record(o, o, o) for o in range(start, start + 20)]) for start in range(1, 201, 20)]
    errors: list[BaseException] = []

    def run(sink: IcebergSink) -> None:
        try:
            for b in batches:
                sink.write(b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    versions = sorted(r["_version"] for r in rows_of(lake, table))
    assert versions == list(range(201))


def test_two_replicas_upserting_and_deleting_end_at_the_oracle(lake: IcebergConnection, unique: str) -> None:
    """Upsert mode: the same batches (updates and deletes over 30 keys) from two replicas at once."""
    table = f"replicas_{unique}.items"
    make_sink(lake, table).write(batch([record(k, 0, k) for k in range(30)]))  # offsets 0-29, version 0
    replicas = [make_sink(lake, table) for _ in range(2)]
    rng = random.Random(7)
    oracle = dict.fromkeys(range(30), 0)
    batches = []
    for start in range(30, 330, 30):
        recs = []
        for offset in range(start, start + 30):
            key, delete = rng.randrange(30), rng.random() < 0.2
            recs.append(record(key, offset, offset, delete=delete))
            if delete:
                oracle.pop(key, None)
            else:
                oracle[key] = offset
        batches.append(batch(recs))
    errors: list[BaseException] = []

    def run(sink: IcebergSink) -> None:
        try:
            for b in batches:
                sink.write(b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    rows = rows_of(lake, table)
    assert len(rows) == len({r["id"] for r in rows})  # one row per key
    assert {r["id"]: r["_version"] for r in rows} == oracle


ITEM_V1 = {
    "type": "record",
    "name": "Price",
    "namespace": "threes.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 4}},
    ],
}
ITEM_V2 = {**ITEM_V1, "fields": [*ITEM_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
ITEM_V2_WIDE = {
    **ITEM_V2,
    "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "long"}, *ITEM_V2["fields"][2:]],
}
ITEM_SCALE = {
    **ITEM_V1,
    "fields": [
        *ITEM_V1["fields"][:2],
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    ],
}


def _priced(schema: dict[str, Any], rows: list[dict[str, Any]], first_offset: int) -> SinkBatch:
    parsed, fp = fastavro.parse_schema(schema), fingerprint(schema)
    recs = [
        SinkRecord(
            "updates.items",
            0,
            first_offset + i,
            r["id"],
            dict(r),
            version=first_offset + i + 1,
            value_schema=parsed,
            value_fingerprint=fp,
        )
        for i, r in enumerate(rows)
    ]
    return batch(recs)


def test_schema_evolves_decimals_stay_exact_and_a_scale_change_is_refused(lake: IcebergConnection, unique: str) -> None:
    table = f"schema_{unique}.prices"
    sink = make_sink(lake, table)
    exact = Decimal("12345678.1234")
    sink.write(_priced(ITEM_V1, [{"id": 1, "qty": 1, "amount": exact}], 0))
    sink.write(_priced(ITEM_V2, [{"id": 2, "qty": 2, "amount": Decimal("0.0001"), "note": "new field"}], 1))
    sink.write(_priced(ITEM_V2_WIDE, [{"id": 3, "qty": 2**40, "amount": Decimal("-1.5"), "note": None}], 2))
    schema = load_catalog(lake).load_table(table).schema()
    assert str(schema.find_field("note").field_type) == "string" and not schema.find_field("note").required
    assert str(schema.find_field("qty").field_type) == "long"  # int promoted to long
    assert str(schema.find_field("amount").field_type) == "decimal(12, 4)"
    rows = {r["id"]: r for r in rows_of(lake, table)}
    assert rows[1]["amount"] == exact and rows[1]["note"] is None
    assert rows[2]["amount"] == Decimal("0.0001") and rows[2]["note"] == "new field"
    assert rows[3]["qty"] == 2**40
    with pytest.raises(SinkBlockedError, match=r"column 'amount' is decimal128\(12, 4\).*scale"):
        sink.write(_priced(ITEM_SCALE, [{"id": 4, "qty": 1, "amount": Decimal("1.25")}], 3))
    assert sorted(rows_of(lake, table), key=lambda r: r["id"])[-1]["id"] == 3  # nothing written


def test_compaction_and_expiry_keep_the_rows_and_the_offsets(lake: IcebergConnection, unique: str) -> None:
    table = f"maint_{unique}.items"
    sink = make_sink(lake, table)
    for start in range(0, 50, 10):
        sink.write(batch([record(k, k + 1, k) for k in range(start, start + 10)]))
    before = sorted((r["id"], r["_version"]) for r in rows_of(lake, table))
    fresh = load_catalog(lake).load_table(table)
    files = data_files(fresh)
    result = compact(fresh)
    assert result.before == files > 1 and result.after == 1
    assert sorted((r["id"], r["_version"]) for r in rows_of(lake, table)) == before
    fresh.refresh()
    assert offset_of(recorded_offsets(fresh, "threes.kafka.offsets.lake"), "updates.items", 0) == 49
    expired = expire(fresh, older_than_s=0, retain_last=1)
    assert expired.after < expired.before
    fresh.refresh()
    assert "threes.kafka.offsets.lake" in offset_holders(fresh)
    # the sink, restarted, still skips what the table holds
    again = make_sink(lake, table)
    again.write(batch([record(k, 1, k) for k in range(10)]))
    assert sorted((r["id"], r["_version"]) for r in rows_of(lake, table)) == before


def test_an_unreachable_catalog_blocks_the_sink_and_it_resumes(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, s3_conn: S3Connection, unique: str
) -> None:
    """The catalog's database cut off under a running sync service: blocked, nothing dead-lettered, then all lands."""
    from sqlalchemy.engine import make_url

    url = make_url(pg.url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    conn = iceberg_connection(pg, s3_conn, uri=url.set(host="127.0.0.1", port=proxy.port).render_as_string(False))
    topic, table = f"updates.ice.{unique}", f"cut_{unique}.items"
    create_topic(kafka_conf, topic, 2)
    p = pipeline(
        kafka,
        {"lake": as_yaml(conn)},
        [
            {
                "name": f"ice-{unique}",
                "dead_letter_topic": f"dlq.ice.{unique}",
                "batch": {"max_records": 100, "max_age_ms": 200},
                "sinks": [
                    {
                        "name": "lake",
                        "type": "iceberg_sink",
                        "connection": "lake",
                        "topics": [topic],
                        "table": table,
                        "key": ["id"],
                        "errors": {"restart_backoff_s": 0.2, "restart_max_backoff_s": 1.0},
                    }
                ],
            }
        ],
    )
    producer = UpdateProducer(kafka, topic)
    for key in range(100):
        producer.send(key, 1)
    producer.flush()
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    group = p.sync[0].consumer_group()
    try:
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 90, "the first 100 rows")
        proxy.cut()
        for key in range(100, 200):
            producer.send(key, 1)
        producer.flush()

        def blocked() -> bool:
            sink = service.status()["sinks"][0]
            return sink["state"] == "blocked" and "not usable" in (sink["last_error"] or "")

        wait_until(lambda: blocked() or errors, 60, "the sink blocked by the unreachable catalog")
        assert group_lag(kafka_conf, group, topic) > 0
        proxy.start()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 120, "lag 0 once the catalog is back")
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
        proxy.cut()
    assert not errors, errors
    assert sorted(r["id"] for r in rows_of(conn, table)) == list(range(200))
    assert service.metrics.value("threes_sync_dead_letters_total", stage="write") == 0


def test_the_maintenance_commands_on_a_config(lake: IcebergConnection, unique: str, tmp_path: Any) -> None:
    import yaml
    from typer.testing import CliRunner

    from threes.cli import app

    table = f"cli_{unique}.items"
    sink = make_sink(lake, table)
    for start in range(0, 30, 10):
        sink.write(batch([record(k, k + 1, k) for k in range(start, start + 10)]))
    cfg = tmp_path / "lake.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "kafka": {"bootstrap_servers": "127.0.0.1:19092"},
                "connections": {"lake": as_yaml(lake)},
                "sync": [
                    {
                        "name": "s",
                        "dead_letter_topic": "dlq.s",
                        "sinks": [
                            {
                                "name": "lake",
                                "type": "iceberg_sink",
                                "connection": "lake",
                                "topics": ["updates.items"],
                                "table": table,
                                "key": ["id"],
                            }
                        ],
                    }
                ],
            }
        )
    )
    runner = CliRunner()
    compacted = runner.invoke(app, ["iceberg", "compact", str(cfg)])
    assert compacted.exit_code == 0, compacted.output
    assert "data file(s) rewritten into 1" in compacted.output
    expired = runner.invoke(app, ["iceberg", "expire", str(cfg), "--older-than-h", "0", "--retain-last", "1"])
    assert expired.exit_code == 0 and "expired" in expired.output, expired.output
    assert lake.storage.secret_access_key is not None
    assert lake.storage.secret_access_key.get_secret_value() not in compacted.output + expired.output
    missing = runner.invoke(app, ["iceberg", "compact", str(cfg), "--sink", "nope"])
    assert missing.exit_code == 1 and "no iceberg_sink named nope" in missing.output
    assert sorted(r["id"] for r in rows_of(lake, table)) == list(range(30))


def test_a_composite_key_is_matched_on_one_column(lake: IcebergConnection, unique: str) -> None:
    """Upserts and deletes by a two-field key: rows found and deleted through the canonical `_key` column."""
    table = f"composite_{unique}.items"
    sink = make_sink(lake, table, key=["id", "name"])

    def keyed(k: int, version: int, offset: int, delete: bool = False) -> SinkRecord:
        rec = record(k, version, offset, delete=delete)
        rec.key = {"name": f"item-{k}", "id": k}  # the record key's fields in another order than `key`
        if rec.value is not None:
            rec.value = {**rec.value, "name": f"item-{k}"}
        return rec

    sink.write(batch([keyed(k, 1, k) for k in range(2000)]))
    sink.write(batch([keyed(k, 2, 2000 + k, delete=k % 4 == 0) for k in range(0, 2000, 2)]))
    sink.write(batch([keyed(0, 1, 4000)]))  # older than its delete: stays deleted
    rows = rows_of(lake, table)
    want = {k: 1 if k % 2 else 2 for k in range(2000) if k % 4}
    assert {r["id"]: r["_version"] for r in rows} == want and len(rows) == len(want)
    assert {r["_key"] for r in rows} == {f'[{k},"item-{k}"]' for k in want}
