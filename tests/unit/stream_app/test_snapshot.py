"""The snapshot as data: latest value per key, tombstones, re-inserts, change sets, replay filters."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from stream_app.snapshot.arrow_tables import apply_changes, below, dedupe_last
from stream_app.snapshot.data import event_lookup_key, latest_per_key, lookup_key

pytestmark = pytest.mark.spark

RECORDS = "__lk string, __lh long, __deleted boolean, __topic string, __partition int, __offset long, __rank int, __error string, name string, alt int"


def rows(spark, data):
    return spark.createDataFrame([(k, 0, d, t, p, o, r, e, n, a) for k, d, t, p, o, r, e, n, a in data], RECORDS)


def test_latest_per_key_honours_tombstones_and_reinserts(spark):
    records = rows(
        spark,
        [
            # key, deleted, topic, partition, offset, rank, error, name, alt
            ("EWR", False, "t", 0, 0, 0, None, "Newark", 18),
            ("JFK", False, "t", 1, 0, 0, None, "Kennedy", 13),
            ("EWR", False, "t", 0, 1, 0, None, "Newark Liberty", 18),  # update
            ("LGA", False, "t", 0, 2, 0, None, "La Guardia", 22),
            ("JFK", True, "t", 1, 1, 0, None, None, None),  # tombstone
            ("LGA", True, "t", 0, 3, 0, None, None, None),  # tombstone ...
            ("LGA", False, "t", 0, 4, 0, None, "LaGuardia", 21),  # ... then re-insert
            ("EWR", False, "t", 0, 5, 0, "value does not decode", None, None),  # bad record: ignored, not a delete
        ],
    )
    got = {r["__lk"]: (r["name"], r["alt"]) for r in latest_per_key(records, ["name", "alt"]).collect()}
    assert got == {"EWR": ("Newark Liberty", 18), "LGA": ("LaGuardia", 21)}


def test_latest_per_key_orders_by_offset_not_arrival_and_by_topic_rank(spark):
    records = rows(
        spark,
        [
            ("A", False, "t1", 0, 7, 0, None, "newer", 2),
            ("A", False, "t1", 0, 3, 0, None, "older", 1),
            ("B", False, "t2", 0, 1, 1, None, "from t2", 1),  # t2 is listed after t1: it wins
            ("B", False, "t1", 0, 9, 0, None, "from t1", 2),
        ],
    )
    got = {r["__lk"]: r["name"] for r in latest_per_key(records, ["name", "alt"]).collect()}
    assert got == {"A": "newer", "B": "from t2"}


def test_latest_per_key_keep_deleted_gives_a_change_set(spark):
    records = rows(spark, [("A", False, "t", 0, 0, 0, None, "a", 1), ("A", True, "t", 0, 1, 0, None, None, None)])
    got = latest_per_key(records, ["name", "alt"], keep_deleted=True).collect()
    assert [(r["__lk"], r["__deleted"], r["__offset"]) for r in got] == [("A", True, 1)]


def test_lookup_key_matches_between_event_and_snapshot_sides(spark):
    key_type = T.StructType([T.StructField("year", T.IntegerType()), T.StructField("origin", T.StringType())])
    snap = spark.createDataFrame([(2013, "EWR")], "year int, origin string")
    snap_key = snap.select(lookup_key(F.struct("year", "origin"), key_type).alias("k")).first()["k"]
    # the event names the fields differently, with a wider integer type and other column order
    events = spark.createDataFrame([("EWR", 2013), ("EWR", None)], "airport string, yr long")
    got = [r["k"] for r in events.select(event_lookup_key({"airport": "origin", "yr": "year"}, key_type).alias("k")).collect()]
    assert got == [snap_key, None]  # a null key field matches nothing
    single = T.StructType([T.StructField("id", T.LongType())])
    ids = spark.createDataFrame([(5,)], "customer_id int").select(event_lookup_key({"customer_id": "id"}, single).alias("k"))
    assert ids.first()["k"] == "5"


def test_event_lookup_key_must_cover_the_key():
    key_type = T.StructType([T.StructField("a", T.StringType()), T.StructField("b", T.StringType())])
    with pytest.raises(ValueError, match="every snapshot key field"):
        event_lookup_key({"x": "a"}, key_type)


def table(rows_, deleted=None):
    data = {"__lk": [r[0] for r in rows_], "__lh": [0] * len(rows_)}
    if deleted is not None:
        data["__deleted"] = deleted
    data["name"] = [r[1] for r in rows_]
    return pa.table(data)


def test_dedupe_last_and_apply_changes():
    base = table([("A", "a"), ("B", "b"), ("C", "c")])
    log = table([("B", "b2"), ("D", "d"), ("C", None), ("B", "b3"), ("D", None), ("D", "d2")], [False, False, True, False, True, False])
    changes = dedupe_last(log)
    assert changes.column("__lk").to_pylist() == ["C", "B", "D"]
    merged = apply_changes(base, changes)
    assert dict(zip(merged.column("__lk").to_pylist(), merged.column("name").to_pylist(), strict=True)) == {
        "A": "a",
        "B": "b3",
        "D": "d2",
    }
    assert merged.schema == base.schema


def test_below_keeps_log_rows_before_recorded_offsets():
    log = pa.table(
        {"__lk": ["A", "B", "A"], "__topic": ["t", "t", "t"], "__partition": [0, 1, 0], "__offset": [10, 4, 11]}
    )
    kept = below(log, {"t": {0: 11, 1: 4}})
    assert kept.column("__offset").to_pylist() == [10]


def test_latest_per_key_decodes_once_and_drops_errors_after_choosing(spark):
    """Without ``observe()`` before it, a filter on ``__error`` ahead of the window was pushed below the decode."""
    from schemas.serde import AvroSerializer, fingerprint, schema_json
    from stream_app.plan.model import Schema
    from stream_app.plan.spark_types import spark_type
    from stream_app.snapshot.data import ERROR, LK
    from stream_app.snapshot.decoding import record_decoder

    key = {"type": "record", "name": "K", "namespace": "t", "fields": [{"name": "id", "type": "string"}]}
    value = {"type": "record", "name": "V", "namespace": "t", "fields": [{"name": "name", "type": "string"}]}
    k, v = AvroSerializer(key), AvroSerializer(value)
    bad = b"\xc3\x01" + fingerprint(value) + b"\xff"  # a body that does not decode
    rows = [
        (k({"id": "A"}), v({"name": "a1"}), "t", 0, 0),
        (k({"id": "A"}), bad, "t", 0, 1),  # A's newest record is bad: a1 stays
        (k({"id": "B"}), bad, "t", 0, 2),  # B has nothing valid: no row
        (k({"id": "C"}), v({"name": "c1"}), "t", 0, 3),
        (None, v({"name": "x"}), "t", 0, 4),  # no key
    ]
    raw = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset long")
    writers = {fingerprint(s): schema_json(s) for s in (key, value)}
    key_type = spark_type(spark, Schema(key, schema_json(key), fingerprint(key)))
    decoded = record_decoder(writers, schema_json(key), schema_json(value), key_type, {"t": 0})(raw)

    latest = latest_per_key(decoded, partitions=2)
    assert sorted((r[LK], r["name"]) for r in latest.collect()) == [("A", "a1"), ("C", "c1")]

    def decodes(df):
        return df._jdf.queryExecution().optimizedPlan().toString().count("from_avro(")

    assert decodes(latest) == decodes(decoded.select(LK, ERROR, "__v"))  # each decode once, as in the decode
