"""ColumnCache: column expressions and JVM column lists built once, reused by every micro-batch's plan."""

from __future__ import annotations

from typing import Any

from stream_app.columns import ColumnCache


def _round_trips(spark: Any, fn: Any) -> tuple[Any, int]:
    """``fn()`` and the py4j commands it sent.

    Only this thread's commands count, and no "delete object" command: py4j's finalizer
    thread sends those for Python proxies collected meanwhile, whichever code made them.
    """
    import threading

    from py4j.protocol import MEMORY_COMMAND_NAME, MEMORY_DEL_SUBCOMMAND_NAME

    client = spark.sparkContext._gateway._gateway_client
    calls = [0]
    send = client.send_command
    me, delete = threading.get_ident(), MEMORY_COMMAND_NAME + MEMORY_DEL_SUBCOMMAND_NAME

    def counting(command: str, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me and not command.startswith(delete):
            calls[0] += 1
        return send(command, *args, **kwargs)

    client.send_command = counting
    try:
        return fn(), calls[0]
    finally:
        client.send_command = send


def test_entries_are_built_once() -> None:
    cache, built = ColumnCache(), []
    assert cache.get("k", lambda: built.append(1) or ["x"]) == ["x"]
    assert cache.get("k", lambda: built.append(1) or ["y"]) == ["x"]
    assert built == [1] and len(cache) == 1


def test_a_cached_select_equals_select_and_reuses_its_jvm_column_list(spark: Any) -> None:
    from pyspark.sql import functions as f

    cache = ColumnCache()
    names = [f"c{i}" for i in range(40)]
    columns = cache.get("wide", lambda: [(f.col("id") + i).alias(n) for i, n in enumerate(names)])
    first = spark.range(5)
    assert cache.select(first, columns).collect() == first.select(*columns).collect()
    entries = len(cache)
    # a later micro-batch: another DataFrame, the same column objects
    later = spark.range(3, 9)
    cached, cached_trips = _round_trips(spark, lambda: cache.select(later, columns))
    plain, plain_trips = _round_trips(spark, lambda: later.select(*columns))
    assert cached.collect() == plain.collect() and cached.columns == names
    assert len(cache) == entries  # no new entry for the same columns
    # py4j sends a Python list element by element; the kept JVM Seq goes in one call
    assert plain_trips >= len(names) and cached_trips <= 3, (plain_trips, cached_trips)


def test_rows_where_keeps_each_expression_below_it_evaluated_once(spark) -> None:
    """The snapshot's undecodable records (dead letters): found without decoding every record again."""
    from schemas.serde import AvroSerializer, fingerprint, schema_json
    from stream_app.columns import rows_where
    from stream_app.plan.model import Schema
    from stream_app.plan.spark_types import spark_type
    from stream_app.snapshot.data import ERROR, OFFSET
    from stream_app.snapshot.decoding import record_decoder

    key = {"type": "record", "name": "K", "namespace": "t", "fields": [{"name": "id", "type": "string"}]}
    value = {
        "type": "record",
        "name": "V",
        "namespace": "t",
        "fields": [{"name": n, "type": "long"} for n in ("a", "b", "c", "d")],
    }
    k, v = AvroSerializer(key), AvroSerializer(value)
    rows = [
        (k({"id": "x"}), v({"a": 1, "b": 2, "c": 3, "d": 4}), "t", 0, 0),
        (k({"id": "y"}), b"\xc3\x01" + fingerprint(value) + b"\xff", "t", 0, 1),  # a value that does not decode
        (None, v({"a": 1, "b": 2, "c": 3, "d": 4}), "t", 0, 2),  # no key
    ]
    raw = spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset long")
    writers = {fingerprint(s): schema_json(s) for s in (key, value)}
    key_type = spark_type(spark, Schema(key, schema_json(key), fingerprint(key)))
    decoded = record_decoder(writers, schema_json(key), schema_json(value), key_type, {"t": 0})(raw)

    bad = rows_where(decoded, decoded[ERROR].isNotNull(), [OFFSET, ERROR])
    assert sorted((r[OFFSET], r[ERROR].split(" ")[0]) for r in bad.collect()) == [(1, "value"), (2, "record")]

    def decodes(df: Any) -> int:
        return df._jdf.queryExecution().optimizedPlan().toString().count("from_avro(")

    assert decodes(bad) == decodes(decoded.select(OFFSET, ERROR))  # a filter here decoded again for the predicate
    assert decodes(decoded.filter(decoded[ERROR].isNotNull()).select(OFFSET, ERROR)) > decodes(bad)
