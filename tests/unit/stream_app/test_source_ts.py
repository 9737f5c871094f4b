"""The ``threes.source_ts`` header travels from an event to its update record (small frames, local Spark)."""

from __future__ import annotations

from typing import Any

from kernel.updates import _INT64, SOURCE_TS_HEADER, VERSION_HEADER, source_ts_of
from stream_app.records import header_value, update_record


def test_the_events_source_timestamp_is_carried_to_the_update_record(spark: Any) -> None:
    from pyspark.sql import functions as f

    ts = _INT64.pack(1_700_000_000_123)
    frame = spark.createDataFrame(
        [
            (1, [("other", b"x"), (SOURCE_TS_HEADER, ts)]),
            (2, [("other", b"y")]),
            (3, None),
        ],
        "id long, __headers array<struct<key:string,value:binary>>",
    )
    source_ts = header_value(f.col("__headers"), SOURCE_TS_HEADER)
    out = frame.select(
        f.col("id"),
        update_record("updates.t", f.col("id").cast("string").cast("binary"), f.lit(b"v"), f.col("id"),
                      source_ts).alias("r"),
    ).orderBy("id").collect()
    headers = {row["id"]: [(h["key"], bytes(h["value"])) for h in row["r"]["headers"]] for row in out}
    assert [k for k, _v in headers[1]] == [VERSION_HEADER, SOURCE_TS_HEADER]
    assert source_ts_of(headers[1]) == 1_700_000_000_123
    assert [k for k, _v in headers[2]] == [VERSION_HEADER] and [k for k, _v in headers[3]] == [VERSION_HEADER]
    assert _INT64.unpack(headers[2][0][1])[0] == 2  # the version header is unchanged


def test_header_value_first_or_last_of_a_name_without_a_lambda(spark: Any) -> None:
    from pyspark.sql import functions as f

    frame = spark.createDataFrame(
        [
            (1, [("a", b"1"), ("b", b"2"), ("a", b"3")]),
            (2, [("b", b"2")]),
            (3, []),
            (4, None),
            (5, [("a", None)]),
        ],
        "id long, h array<struct<key:string,value:binary>>",
    )
    out = frame.select(
        "id", header_value(f.col("h"), "a").alias("first"), header_value(f.col("h"), "a", last=True).alias("last")
    )
    rows = {r["id"]: (r["first"], r["last"]) for r in out.collect()}
    as_bytes = {k: tuple(None if v is None else bytes(v) for v in pair) for k, pair in rows.items()}
    assert as_bytes == {1: (b"1", b"3"), 2: (None, None), 3: (None, None), 4: (None, None), 5: (None, None)}
    # compiled: no higher-order function, so the projection runs in whole-stage code generation
    plan = out._jdf.queryExecution().executedPlan().toString()
    assert "*(" in plan and "lambda" not in plan, plan
