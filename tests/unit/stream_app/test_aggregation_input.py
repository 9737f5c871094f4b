"""The aggregation's input: the enriched topic's records decoded once each, undecodable ones dropped."""

from __future__ import annotations

from schemas.serde import AvroSerializer, fingerprint, schema_json
from stream_app.updates import aggregation_input

ENRICHED = {
    "type": "record",
    "name": "Enriched",
    "namespace": "t",
    "fields": [
        {"name": "origin", "type": "string"},
        {"name": "dest", "type": "string"},
        {"name": "delay", "type": ["null", "double"], "default": None},
        {"name": "distance", "type": "long"},
        {"name": "carrier", "type": "string"},
    ],
}


def _records(spark):
    encode = AvroSerializer(ENRICHED)
    good = {"origin": "EWR", "dest": "ORD", "delay": 3.5, "distance": 719, "carrier": "UA"}
    rows = [
        (encode(good), [("source", b"event-own-header"), ("source", b"flights:0:7")]),
        (b"\xc3\x01" + fingerprint(ENRICHED) + b"\xff\xff", [("source", b"flights:0:8")]),  # body does not decode
        (encode({**good, "delay": None, "dest": "LAX"}), [("source", b"flights:1:3")]),
    ]
    return spark.createDataFrame(rows, "value binary, headers array<struct<key: string, value: binary>>")


def test_each_record_is_decoded_once_and_undecodable_ones_are_dropped(spark):
    reader = schema_json(ENRICHED)
    events = aggregation_input(_records(spark), {fingerprint(ENRICHED): reader}, reader, "source")

    rows = sorted(tuple(r) for r in events.collect())
    assert events.columns == ["origin", "dest", "delay", "distance", "carrier", "__source"]
    assert rows == [
        ("EWR", "LAX", None, 719, "UA", "flights:1:3"),
        ("EWR", "ORD", 3.5, 719, "UA", "flights:0:7"),  # the last source header: the job's own
    ]
    # one decode per record: a filter on the decoded struct would be pushed below the decode by the
    # optimizer, which then decodes again for each field the corrupt-body check reads
    plan = events._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("from_avro(") == 1, plan
