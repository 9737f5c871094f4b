"""Aggregations over decimals (exact) and windows over a date event time (midnight UTC), in Spark local[2]."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import fastavro
import pytest

from schemas.serde import HEADER_BYTES
from stream_app.config import StreamJobConfig
from stream_app.plan import build_plan
from stream_app.updates import aggregate, aggregation_records

pytestmark = pytest.mark.spark

ORDER = {
    "type": "record", "name": "Order", "namespace": "threes.test",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "shop", "type": "string"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    ],
}


def test_decimal_sums_are_exact_and_a_date_is_its_midnight_utc(spark, tmp_path):
    from pyspark.sql.types import DateType, DecimalType, LongType, StringType, StructField, StructType

    (tmp_path / "order.avsc").write_text(json.dumps(ORDER))
    config = StreamJobConfig.model_validate({
        "events": {"topic": "orders", "value_schema": str(tmp_path / "order.avsc")},
        "enriched_topic": "orders.enriched", "dead_letter_topic": "orders.dlq",
        "checkpoint_location": str(tmp_path / "cp"),
        "updates": [{"topic": "updates.daily", "kind": "aggregation", "group_by": ["shop"], "event_time": "day",
                     "window": "1 day", "aggregations": {"total": "sum(amount)", "avg": "mean(amount)",
                                                        "top": "max(amount)"}}],
    })
    plan = build_plan(config, spark, tmp_path)
    update = plan.updates[0]
    assert update.event_time_is_date
    types = {f["name"]: f["type"] for f in update.value.avro["fields"]}
    assert types["total"][1] == {"type": "bytes", "logicalType": "decimal", "precision": 22, "scale": 2}
    schema = StructType([StructField("order_id", LongType()), StructField("shop", StringType()),
                         StructField("day", DateType()), StructField("amount", DecimalType(12, 2))])
    day = dt.date(1996, 3, 13)
    amounts = [Decimal("0.10"), Decimal("0.20"), Decimal("1234567890.01")]
    rows = [(i, "a", day, a) for i, a in enumerate(amounts)] + [(9, "a", day + dt.timedelta(days=1), Decimal("1.00"))]
    frame = spark.createDataFrame(rows, schema)
    out = aggregation_records(aggregate(frame, update), update).collect()
    parsed = fastavro.parse_schema(update.value.avro)
    values = sorted((fastavro.schemaless_reader(io.BytesIO(r["value"][HEADER_BYTES:]), parsed, None) for r in out),
                    key=lambda v: v["window_start"])
    first = values[0]
    assert first["window_start"] == dt.datetime(1996, 3, 13, tzinfo=dt.UTC)  # the date's midnight UTC
    assert first["total"] == Decimal("1234567890.31")  # exact: a double would give ...890.3099999
    assert first["avg"] == (sum(amounts) / 3).quantize(Decimal("0.000001")) and first["top"] == Decimal("1234567890.01")
    assert values[1]["window_start"] == dt.datetime(1996, 3, 14, tzinfo=dt.UTC) and values[1]["total"] == Decimal("1.00")
