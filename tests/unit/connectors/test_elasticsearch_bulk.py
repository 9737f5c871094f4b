"""ElasticsearchSink's per-item results (logic only: a scripted client stands in for the cluster)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest

from connectors.api.sink_records import SinkBatch, SinkRecord
from connectors.elasticsearch.bulk import ElasticsearchItemError, ElasticsearchThrottledError
from connectors.elasticsearch.config import ElasticsearchSinkConfig
from connectors.elasticsearch.sink import ElasticsearchSink
from kernel.exceptions import RetriableError, SinkBackpressureError, SinkBlockedError


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


def _batch(n: int) -> SinkBatch:
    return SinkBatch("t", 0, 0, n - 1, [SinkRecord("t", 0, i, i, {"a": i}, i + 1) for i in range(n)])


def _writing(s: ElasticsearchSink) -> ElasticsearchSink:
    s._pool = ThreadPoolExecutor(1)
    s._index_ready = True
    return s


def test_most_items_still_429_after_the_retries_are_backpressure() -> None:
    client = ScriptedClient([[429, 429, 201], [429, 429]])
    s = _writing(sink(client, item_retries=1))
    with pytest.raises(SinkBackpressureError):
        s.write(_batch(3))


def test_a_lone_item_still_429_after_the_retries_is_backpressure() -> None:
    s = _writing(sink(ScriptedClient([[429], [429]]), item_retries=1))
    with pytest.raises(SinkBackpressureError):
        s.write(_batch(1))


def test_a_few_items_still_429_while_the_rest_is_indexed_are_refused_not_about_their_data() -> None:
    client = ScriptedClient([[201, 429, 201, 201], [429], [429]])
    s = _writing(sink(client, item_retries=2))
    failures = s.write(_batch(4))
    assert client.sent == [["0", "1", "2", "3"], ["1"], ["1"]]
    assert [(f.record.offset, f.about_data) for f in failures] == [(1, False)]
    assert isinstance(failures[0].error, ElasticsearchThrottledError) and "3 attempt(s)" in str(failures[0].error)


def test_a_write_block_on_items_blocks_the_sink() -> None:
    class Blocked(ScriptedClient):
        def bulk(self, operations: bytes, filter_path: str) -> dict[str, Any]:
            answer = super().bulk(operations, filter_path)
            for item in answer["items"]:
                item["index"]["error"] = {"type": "cluster_block_exception", "reason": "index [i] blocked by: "
                                          "[TOO_MANY_REQUESTS/12/disk usage exceeded flood-stage watermark]"}
            return answer

    s = _writing(sink(Blocked([[429, 429]])))
    with pytest.raises(SinkBlockedError, match="flood-stage"):
        s.write(_batch(2))


def test_items_answered_5xx_make_the_batch_retriable() -> None:
    client = ScriptedClient([[201, 503]])
    s = sink(client)
    with pytest.raises(RetriableError) as raised:
        s._send(chunk(s, 2))
    assert not isinstance(raised.value, SinkBackpressureError)
