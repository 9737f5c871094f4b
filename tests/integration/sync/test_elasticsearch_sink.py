"""ElasticsearchSink against the real Elasticsearch (minimal integ-test server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from elasticsearch import helpers

from connectors.config.models import ElasticsearchConnection
from connectors.elasticsearch.config import ElasticsearchSinkConfig
from connectors.elasticsearch.sink import ElasticsearchSink
from tests.integration.sync.contract import SinkContract, batch, record


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
        except Exception as exc:  # noqa: BLE001
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
