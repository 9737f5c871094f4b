"""ElasticsearchSink against the real Elasticsearch (minimal integ-test server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from elasticsearch import helpers

from connectors.elasticsearch.config import ElasticsearchSinkConfig
from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.elasticsearch.sink import ElasticsearchSink
from threes.testing.sink import SinkContract, batch, record


def make_config(index: str, **extra: Any) -> ElasticsearchSinkConfig:
    return ElasticsearchSinkConfig(name=f"es-{index}", type="elasticsearch_sink", connection="es",
                                   topics=["updates.items"], index=index, **extra)


def es_state(es: Any, index: str) -> dict[str, tuple[int, dict[str, Any]]]:
    es.indices.refresh(index=index)
    return {h["_id"]: (h["_version"], h["_source"]) for h in helpers.scan(es, index=index, version=True)}


class TestElasticsearchSink(SinkContract):
    @pytest.fixture
    def sink(self, es_conn: ElasticsearchConnection, es: Any, unique: str) -> Iterator[ElasticsearchSink]:
        # chunks of 7 actions: every batch goes out as several concurrent bulk requests
        s = ElasticsearchSink(make_config(f"items-{unique}", chunk_records=7), es_conn)
        s.open()
        yield s
        s.close()
        es.indices.delete(index=f"items-{unique}", ignore_unavailable=True)

    @pytest.fixture
    def bad_sink(self, es_conn: ElasticsearchConnection) -> ElasticsearchSink:
        conn = ElasticsearchConnection(type="elasticsearch", hosts=["http://127.0.0.1:9"], request_timeout_s=2)
        return ElasticsearchSink(make_config("nowhere"), conn)

    def state(self, sink: ElasticsearchSink) -> dict[str, tuple[int, dict[str, Any]]]:
        try:
            return es_state(sink.client, sink.config.index)
        except Exception as exc:
            if "index_not_found" in str(exc):
                return {}
            raise

    def test_rejected_field_is_a_record_failure(self, sink: ElasticsearchSink, es: Any) -> None:
        es.indices.create(index=sink.config.index, mappings={"properties": {"qty": {"type": "integer"}}})
        recs = [record(k, 1, k) for k in range(10)]
        recs[4].value["qty"] = "not a number"  # the mapping refuses it: 400 mapper_parsing_exception
        failures = sink.write(batch(recs))
        assert [f.record.offset for f in failures] == [4]
        assert "document_parsing_exception" in str(failures[0].error) or "mapper" in str(failures[0].error)
        assert sorted(self.state(sink), key=int) == [str(k) for k in range(10) if k != 4]

    def test_negative_version_is_a_record_failure(self, sink: ElasticsearchSink) -> None:
        failures = sink.write(batch([record(1, -5, 0), record(2, 1, 1)]))
        assert [f.record.offset for f in failures] == [0]
        assert list(self.state(sink)) == ["2"]


TYPED = {
    "type": "record", "name": "Typed", "namespace": "threes.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "price", "type": "double"},
        {"name": "ratio", "type": ["null", "float"], "default": None},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "name", "type": "string"},
        {"name": "comment", "type": "string"},
        {"name": "place", "type": {"type": "record", "name": "Place", "fields": [
            {"name": "city", "type": "string"}, {"name": "lat", "type": "double"}]}},
    ],
}


def test_a_created_index_is_mapped_from_the_avro_schema(es_conn, es, unique, tmp_path) -> None:
    import datetime as dt
    from decimal import Decimal

    import fastavro

    from connectors.api.sink_records import SinkRecord
    from schemas.serde import fingerprint

    (tmp_path / "mapping.json").write_text('{"properties": {"comment": {"type": "text"}}}')
    index = f"typed-{unique}"
    sink = ElasticsearchSink(make_config(index, mapping_file=str(tmp_path / "mapping.json")), es_conn)
    sink.open()
    try:
        value = {"id": 1, "price": 0.1 + 0.2, "ratio": 0.5, "amount": Decimal("12.34"), "day": dt.date(1996, 3, 13),
                 "at": dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.UTC), "name": "a", "comment": "hello world",
                 "place": {"city": "Oslo", "lat": 59.91}}
        rec = SinkRecord(topic="updates.items", partition=0, offset=0, key=1, value=value, version=1, timestamp_ms=0,
                         size_bytes=100, value_schema=fastavro.parse_schema(TYPED), value_fingerprint=fingerprint(TYPED))
        assert sink.write(batch([rec])) == []
        props = es.indices.get_mapping(index=index)[index]["mappings"]["properties"]
        assert props["price"] == {"type": "double"} and props["ratio"] == {"type": "float"}
        # scaled_float needs the mapper-extras module; the minimal test server lacks it: double then
        assert props["amount"] in ({"type": "scaled_float", "scaling_factor": 100.0}, {"type": "double"})
        assert props["day"] == {"type": "date", "format": "strict_date||epoch_millis"}
        default = "strict_date_optional_time||epoch_millis"  # Elasticsearch's default: not echoed in the mapping
        assert props["at"]["type"] == "date" and props["at"].get("format", default) == default
        assert props["name"] == {"type": "keyword"} and props["id"] == {"type": "long"}
        assert props["comment"] == {"type": "text"}  # the mapping file wins
        assert props["place"]["properties"] == {"city": {"type": "keyword"}, "lat": {"type": "double"}}
        es.indices.refresh(index=index)
        hits = es.search(index=index, query={"range": {"price": {"gt": 0.3, "lt": 0.31}}})
        assert hits["hits"]["total"]["value"] == 1  # 0.30000000000000004 > 0.3 as a double; as a float both are 0.3f
    finally:
        sink.close()
        es.indices.delete(index=index, ignore_unavailable=True)
    keyword = ElasticsearchSink(make_config(index, decimal_mapping="keyword", string_mapping="text_and_keyword"),
                                es_conn)
    keyword.open()
    try:
        assert keyword.write(batch([rec])) == []
        props = es.indices.get_mapping(index=index)[index]["mappings"]["properties"]
        assert props["amount"] == {"type": "keyword"}
        assert props["name"] == {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
    finally:
        keyword.close()
        es.indices.delete(index=index, ignore_unavailable=True)
