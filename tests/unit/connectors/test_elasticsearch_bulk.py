"""ElasticsearchSink's per-item results (logic only: a scripted client stands in for the cluster)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from connectors.api.sink import SinkRecord
from connectors.elasticsearch.config import ElasticsearchSinkConfig
from connectors.elasticsearch.sink import ElasticsearchItemError, ElasticsearchSink
from connectors.exceptions import RetriableError, SinkBackpressureError


class ScriptedClient:
    """Answers each ``bulk`` call with the next scripted list of item statuses; records what was sent."""

    def __init__(self, script: list[list[int]]):
        self.script = script
        self.sent: list[list[str]] = []

    def bulk(self, operations: bytes, filter_path: str) -> dict[str, Any]:
        lines = [orjson.loads(line) for line in operations.splitlines()]
        ids = [next(iter(line.values()))["_id"] for line in lines if set(line) <= {"index", "delete"}]
        self.sent.append(ids)
        statuses = self.script.pop(0)
        assert len(statuses) == len(ids)
        items = [{"index": {"_id": i, "status": s, **({"error": {"type": "x", "reason": "no"}} if s >= 300 else {})}}
                 for i, s in zip(ids, statuses, strict=True)]
        return {"errors": any(s >= 300 for s in statuses), "items": items}


def sink(client: ScriptedClient, item_retries: int = 1) -> ElasticsearchSink:
    cfg = ElasticsearchSinkConfig(name="es", type="elasticsearch_sink", connection="c", topics=["t"], index="i",
                                  item_retries=item_retries)
    s = ElasticsearchSink(cfg, None)
    s.client = client
    from elasticsearch import OrjsonSerializer

    s._serializer = OrjsonSerializer()
    return s


def chunk(s: ElasticsearchSink, n: int) -> list[tuple[SinkRecord, bytes]]:
    records = [SinkRecord("t", 0, i, i, {"a": i}, i + 1) for i in range(n)]
    return [(r, s._lines(r)) for r in records]


def test_an_answer_without_errors_reads_no_item() -> None:
    client = ScriptedClient([[201, 200, 201]])
    assert sink(client)._send(chunk(sink(client), 3)) == []
    assert client.sent == [["0", "1", "2"]]


def test_items_answered_429_are_sent_again_alone_and_refused_ones_are_failures() -> None:
    client = ScriptedClient([[201, 429, 400, 409], [201]])
    s = sink(client)
    failures = s._send(chunk(s, 4))
    assert client.sent == [["0", "1", "2", "3"], ["1"]]  # 409: a newer version is there, applied
    assert [f.record.offset for f in failures] == [2]
    assert isinstance(failures[0].error, ElasticsearchItemError) and "t[0]@2" in str(failures[0].error)


def test_items_still_429_after_the_retries_are_backpressure() -> None:
    client = ScriptedClient([[429, 201], [429]])
    s = sink(client, item_retries=1)
    with pytest.raises(SinkBackpressureError):
        s._send(chunk(s, 2))


def test_items_answered_5xx_make_the_batch_retriable() -> None:
    client = ScriptedClient([[201, 503]])
    s = sink(client)
    with pytest.raises(RetriableError) as raised:
        s._send(chunk(s, 2))
    assert not isinstance(raised.value, SinkBackpressureError)
