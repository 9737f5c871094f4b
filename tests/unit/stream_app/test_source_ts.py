"""The ``threes.source_ts`` header travels from an event to its update record (small frames, local Spark)."""

from __future__ import annotations

from typing import Any

from connectors.updates import _INT64, SOURCE_TS_HEADER, VERSION_HEADER, source_ts_of
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
