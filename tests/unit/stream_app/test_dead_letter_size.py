"""The stream job's dead letters fit the dead letter topic: an oversized event is written without its value."""

from __future__ import annotations

from typing import Any

from kernel.dlq import DeadLetter
from stream_app.records import dead_letter_fields, record_of


def test_an_event_over_the_limit_is_dead_lettered_without_its_value(spark: Any) -> None:
    from pyspark.sql import functions as f

    rows = [(b"small-key", b"v" * 100, 0), (b"big-key", b"x" * 60_000, 1), (b"k" * 40_000, b"x" * 20_000, 2)]
    df = spark.createDataFrame(rows, "__key binary, __value binary, __offset long").withColumn(
        "__headers", f.array(f.struct(f.lit("version").alias("key"), f.lit(b"\x01").cast("binary").alias("value"))))
    fields = dead_letter_fields("dlq", "decode", "SkippableRecordError", f.lit("bad"), "job",
                                source_topic=f.lit("events"), partition=f.lit(0), offset=f.col("__offset"),
                                key=f.col("__key"), value=f.col("__value"), headers=f.col("__headers"),
                                max_bytes=4096 + 8192 + 50_000)
    out = {r["r"]["key"] or b"": r["r"] for r in df.select(record_of(*fields).alias("r")).collect()}
    small = out[b"small-key"]
    assert small["value"] == b"v" * 100
    context = DeadLetter.from_headers([(h["key"], h["value"]) for h in small["headers"]])
    assert context.omitted == () and context.original_bytes == 109
    assert ("version", b"\x01") in [(h["key"], h["value"]) for h in small["headers"]]

    big = out[b"big-key"]
    assert big["value"] is None
    headers = [(h["key"], h["value"]) for h in big["headers"]]
    context = DeadLetter.from_headers(headers)
    assert (context.topic, context.offset, context.omitted) == ("events", 1, ("value", "headers"))
    assert context.original_bytes == 60_007
    assert all(name != "version" for name, _ in headers)

    huge_key = out[b""]
    assert huge_key["value"] is None
    assert DeadLetter.from_headers([(h["key"], h["value"]) for h in huge_key["headers"]]).omitted == (
        "value", "headers", "key")
