"""ElasticsearchSource against the real Elasticsearch (minimal 9.x distribution) and Kafka."""

from __future__ import annotations

import datetime as dt
from typing import Any

from threes.config import pipeline_from_dict
from threes.testing.source import SourceContract, run_once, topic_state

MAPPING = {"properties": {"code": {"type": "keyword"}, "name": {"type": "text"}, "amount": {"type": "double"},
                          "seats": {"type": "integer"}, "updated_at": {"type": "date"},
                          "meta": {"properties": {"a": {"type": "long"}}}}}


def _es_connections(es_conn: Any, password: str | None = None) -> dict[str, Any]:
    conn: dict[str, Any] = {"type": "elasticsearch", "hosts": es_conn.hosts}
    if password:
        conn.update(username="elastic", password=password)
    return {"es": conn}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TestElasticsearchSourceContract(SourceContract):
    """The source contract on an index in ``incremental`` mode (``_id`` = code)."""

    def setup_system(self, ctx: dict[str, Any]) -> None:
        ctx["es"] = ctx["request"].getfixturevalue("es")
        ctx["es_conn"] = ctx["request"].getfixturevalue("es_conn")
        ctx["index"] = f"src-{ctx['unique']}"
        ctx["es"].indices.create(index=ctx["index"], mappings=MAPPING)

    def connections(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return _es_connections(ctx["es_conn"])

    def bad_connections(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], str]:
        # the test server has no security: a wrong host stands for a refused login
        secret = "wrong-secret-4711"
        conns = {"es": {"type": "elasticsearch", "hosts": ["http://127.0.0.1:9"], "username": "elastic",
                        "password": secret, "request_timeout_s": 2}}
        return conns, secret

    def source_config(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return {"name": ctx["name"], "type": "elasticsearch_source", "connection": "es", "topic": ctx["topic"],
                "index": ctx["index"], "mode": "incremental", "updated_field": "updated_at", "commit_delay_s": 0,
                "page_size": 6}

    def make_row(self, i: int, version: int = 0) -> dict[str, Any]:
        return {"code": f"c{i:03d}", "name": f"item {i} v{version}", "amount": i * 1.25 + version,
                "seats": i if i % 4 else None, "meta": {"a": i}}

    def upsert(self, ctx: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        for r in rows:
            ctx["es"].index(index=ctx["index"], id=r["code"], document={**r, "updated_at": _now()})
        ctx["es"].indices.refresh(index=ctx["index"])

    def delete(self, ctx: dict[str, Any], keys: list[tuple]) -> None:
        for (code,) in keys:
            ctx["es"].delete(index=ctx["index"], id=code)
        ctx["es"].indices.refresh(index=ctx["index"])

    def system_state(self, ctx: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
        resp = ctx["es"].search(index=ctx["index"], size=1000, query={"match_all": {}})
        out = {}
        for h in resp["hits"]["hits"]:
            s = h["_source"]
            out[(h["_id"],)] = {"code": s["code"], "name": s["name"], "amount": s["amount"], "seats": s.get("seats"),
                                "updated_at": s["updated_at"], "meta": f'{{"a":{s["meta"]["a"]}}}'}
        return out


def test_snapshot_mode_and_deletes(es: Any, es_conn: Any, kafka: Any, kafka_conf: Any, unique: str) -> None:
    index = f"snap-{unique}"
    es.indices.create(index=index, mappings={"properties": {"n": {"type": "long"}, "tag": {"type": "keyword"}}})
    for i in range(30):
        es.index(index=index, id=f"d{i}", document={"n": i, "tag": "x" if i % 2 else "y"})
    es.indices.refresh(index=index)
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _es_connections(es_conn),
        "sources": [{"name": f"snap-{unique}", "type": "elasticsearch_source", "connection": "es",
                     "topic": f"state.{unique}", "index": index, "mode": "snapshot", "page_size": 7,
                     "snapshot_interval_s": 0.01}],
    })
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert topic_state(kafka_conf, f"state.{unique}") == {
        (f"d{i}",): {"n": i, "tag": "x" if i % 2 else "y"} for i in range(30)}
    for i in range(0, 30, 3):
        es.delete(index=index, id=f"d{i}")
    es.index(index=index, id="d1", document={"n": 100, "tag": "z"})
    es.indices.refresh(index=index)
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert s.tombstones == 10
    expected = {(f"d{i}",): {"n": i, "tag": "x" if i % 2 else "y"} for i in range(30) if i % 3}
    expected[("d1",)] = {"n": 100, "tag": "z"}
    assert topic_state(kafka_conf, f"state.{unique}") == expected


def test_document_without_updated_field_is_found_by_reconciliation(es: Any, es_conn: Any, kafka: Any,
                                                                    kafka_conf: Any, unique: str) -> None:
    index = f"rec-{unique}"
    es.indices.create(index=index, mappings={"properties": {"v": {"type": "keyword"},
                                                            "updated_at": {"type": "date"}}})
    es.index(index=index, id="a", document={"v": "has", "updated_at": _now()})
    es.index(index=index, id="b", document={"v": "lacks"})
    es.indices.refresh(index=index)
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _es_connections(es_conn),
        "sources": [{"name": f"rec-{unique}", "type": "elasticsearch_source", "connection": "es",
                     "topic": f"state.{unique}", "index": index, "mode": "incremental",
                     "updated_field": "updated_at", "commit_delay_s": 0}],
    })
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    state = topic_state(kafka_conf, f"state.{unique}")
    assert sorted(state) == [("a",), ("b",)]
    assert state[("b",)] == {"v": "lacks", "updated_at": None}


def test_missing_index_is_a_config_error(es_conn: Any, kafka: Any, unique: str) -> None:
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _es_connections(es_conn),
        "sources": [{"name": f"nx-{unique}", "type": "elasticsearch_source", "connection": "es",
                     "topic": f"state.{unique}", "index": f"no-such-{unique}"}],
    })
    (s,) = run_once(pipeline).values()
    assert s.state == "failed"
    assert f"no-such-{unique}" in s.error and "does not exist" in s.error


def _pit_source(es: Any, es_conn: Any, kafka: Any, unique: str, mode: str) -> Any:
    from connectors.elasticsearch.source import ElasticsearchSource

    index = f"pit-{unique}"
    es.indices.create(index=index, mappings={"properties": {"v": {"type": "keyword"},
                                                            "updated_at": {"type": "date"}}})
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    for i in range(20):
        when = (start + dt.timedelta(seconds=i // 2)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        es.index(index=index, id=f"d{i:02d}", document={"v": f"v{i}", "updated_at": when})
    es.indices.refresh(index=index)
    source: dict[str, Any] = {"name": f"pit-{unique}", "type": "elasticsearch_source", "connection": "es",
                              "topic": f"state.{unique}", "index": index, "mode": mode, "page_size": 5}
    if mode == "incremental":
        source.update(updated_field="updated_at", commit_delay_s=0)
    pipeline = pipeline_from_dict({"kafka": {"bootstrap_servers": kafka.bootstrap_servers},
                                   "connections": _es_connections(es_conn), "sources": [source]})
    task = ElasticsearchSource(pipeline.sources[0], pipeline.connection("es"))
    task.open(None)
    return task


def test_point_in_time_expiry_resumes_at_the_last_position(es: Any, es_conn: Any, kafka: Any, unique: str) -> None:
    task = _pit_source(es, es_conn, kafka, unique, "incremental")
    pages = task.poll()
    first = next(pages)
    assert len(first.records) == 5
    # the worker held the page past the keep-alive (its producer was blocked): the cluster dropped the point in
    # time, and the next search answers 404 search_context_missing_exception, as closing it here makes it answer
    es.close_point_in_time(id=task._pit_id)
    rest = [r for batch in pages for r in batch.records]
    ids = [k["_id"] for k, _v in first.records + rest]
    # resumed at the last page's sort value (inclusive): nothing lost, at most that value's documents again
    assert sorted(set(ids)) == [f"d{i:02d}" for i in range(20)]
    assert len(ids) - 20 <= 2
    task.close()


def test_point_in_time_expiry_during_a_snapshot_is_retriable(es: Any, es_conn: Any, kafka: Any,
                                                            unique: str) -> None:
    from kernel.exceptions import RetriableError

    task = _pit_source(es, es_conn, kafka, unique, "snapshot")
    pages = task.poll()
    next(pages)
    es.close_point_in_time(id=task._pit_id)
    try:
        next(pages)
        raise AssertionError("the expired point in time went unnoticed")
    except RetriableError as exc:  # the worker retries the cycle: the snapshot starts again
        assert "expired" in str(exc) and "does not exist" not in str(exc)
    task.close()
