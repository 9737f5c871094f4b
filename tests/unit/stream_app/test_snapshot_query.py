"""Interactive queries' pure parts: Spark's bucket of a key, keys and times from text, JSON values, the route."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from kernel.status.http import StatusServer
from stream_app.snapshot.query import SnapshotQueries
from stream_app.snapshot.query_keys import QueryError, jsonable, key_of, parse_time_ms
from stream_app.snapshot.query_reads import base_rows_of_key, newest_in_log, spark_murmur3, version_at

KEYS = ["", "a", "ab", "abc", "abcd", "EWR", "K00042", "Zürich", "東京", "{\"carrier\":\"UA\",\"flight\":1545}", "x" * 37]


def test_murmur3_is_sparks_hash_of_the_key_string(spark: Any) -> None:
    from pyspark.sql import functions as f

    rows = spark.createDataFrame([(k,) for k in KEYS], "k string").select("k", f.hash("k").alias("h")).collect()
    assert {r["k"]: spark_murmur3(r["k"].encode()) for r in rows} == {r["k"]: r["h"] for r in rows}


def key_type(*fields: tuple[str, str]) -> Any:
    from pyspark.sql import types as T

    kinds = {"string": T.StringType(), "long": T.LongType(), "int": T.IntegerType(), "double": T.DoubleType()}
    return T.StructType([T.StructField(n, kinds[k]) for n, k in fields])


def test_keys_render_like_the_snapshots_lookup_key(spark: Any) -> None:
    from pyspark.sql import functions as f

    from stream_app.snapshot.data import lookup_key

    composite = key_type(("carrier", "string"), ("flight", "long"))
    frame = spark.createDataFrame([("UA", 1545), ("Zü", 7)], "carrier string, flight long")
    spark_keys = [r[0] for r in frame.select(lookup_key(f.struct("carrier", "flight"), composite)).collect()]
    assert [key_of(composite, {"carrier": "UA", "flight": "1545"}), key_of(composite, {"carrier": "Zü", "flight": "7"})
            ] == spark_keys
    assert key_of(key_type(("id", "long")), {"id": "42"}) == "42"
    with pytest.raises(QueryError, match="is an integer, got 'x'"):
        key_of(composite, {"carrier": "UA", "flight": "x"})
    with pytest.raises(QueryError, match=r"missing \['flight'\], unknown \['nope'\]"):
        key_of(composite, {"carrier": "UA", "nope": "1"})
    with pytest.raises(QueryError, match="cannot be queried"):
        key_of(key_type(("a", "string"), ("b", "double")), {"a": "x", "b": "1.5"})


def test_times_values_and_versions() -> None:
    assert parse_time_ms("1357084800000") == parse_time_ms("2013-01-02T00:00:00Z") == parse_time_ms("2013-01-02")
    with pytest.raises(QueryError):
        parse_time_ms("yesterday")
    when = dt.datetime(2013, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert jsonable({"d": decimal.Decimal("1.50"), "t": when, "day": dt.date(2013, 1, 2), "b": b"\x00",
                     "m": [("k", 1)], "l": [1, 2]}) == {
        "d": "1.50", "t": "2013-01-02T03:04:05Z", "day": "2013-01-02", "b": "AA==", "m": {"k": 1}, "l": [1, 2]}
    versions = pa.table({"__lk": ["k", "k"], "__from": [10, 20], "__to": [20, None], "v": ["A", "B"]})
    assert [version_at(versions, t) and version_at(versions, t)["v"] for t in (9, 10, 19, 20, 99)] == [
        None, "A", "A", "B", "B"]
    log = pa.table({"__lk": ["k", "j", "k"], "__deleted": [False, False, True], "v": ["A", "J", None]})
    assert newest_in_log(log, "k")["__deleted"] and newest_in_log(log, "j")["v"] == "J"
    assert newest_in_log(log, "z") is None
    base = pa.table({"__lk": ["a", "b", "c"], "v": [1, 2, 3]})
    assert base_rows_of_key(base, "b").to_pylist() == [{"__lk": "b", "v": 2}]
    assert base_rows_of_key(base, "z") is None
    newer = pa.table({"__lk": ["b"], "v": [20]})  # a new base: its own index
    assert base_rows_of_key(newer, "b").to_pylist() == [{"__lk": "b", "v": 20}]


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_route_answers_4xx_with_a_message_never_a_traceback() -> None:
    server = StatusServer(lambda: {})
    server.add_route("/snapshots", SnapshotQueries({}).handle)
    port = server.serve(0)
    try:
        code, doc = get(port, "/snapshots/nosuch/K1")
        assert code == 404 and doc == {"error": "no snapshot 'nosuch' (have: [])"}
        code, doc = get(port, "/snapshots")
        assert code == 404 and "try /snapshots/{name}" in doc["error"]

        def broken(path: str, query: Any) -> Any:
            raise RuntimeError("secret internals")

        server.add_route("/broken", broken)
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/broken", timeout=10)
        assert exc.value.code == 500 and b"secret" not in exc.value.read()
    finally:
        server.close()


def test_threes_query_names_an_unknown_snapshot_in_one_line_before_starting_spark() -> None:
    from typer.testing import CliRunner

    from threes.cli import app

    example = Path(__file__).resolve().parents[3] / "examples" / "pipeline.yaml"
    result = CliRunner().invoke(app, ["query", str(example), "nosuch", "42"])
    assert result.exit_code == 2  # a bad query; 1 is kept for a key the snapshot does not hold
    assert "no snapshot 'nosuch' in stream.snapshots (have: ['customers'])" in result.output
    assert "Traceback" not in result.output


def test_fast_answers_from_indexes_and_sends_file_reads_to_a_thread() -> None:
    import types

    from pyspark.sql import types as T

    base = pa.table({"__lk": ["a", "b"], "v": [decimal.Decimal("1.50"), decimal.Decimal("2.00")]})
    overlay = pa.table({"__lk": ["b", "c", "b"], "__deleted": [False, False, True],
                        "v": [decimal.Decimal("9"), decimal.Decimal("3.25"), None]})
    snap = types.SimpleNamespace(
        name="s", offsets={"t": {1: 7, 0: 5}}, value_names=["v"], versions=None, _log=overlay,
        base=types.SimpleNamespace(mode="broadcast", table=base),
        plan=types.SimpleNamespace(key=types.SimpleNamespace(spark_type=T.StructType([T.StructField("k", T.StringType())]))),
    )
    queries = SnapshotQueries({"s": snap})
    # a new base and overlay: their indexes are built on a thread (handle), never on the event loop (fast)
    assert queries.fast("/snapshots/s/a", {}) is None
    assert queries.handle("/snapshots/s/a", {}) == (
        200, {"snapshot": "s", "key": "a", "offsets": {"t": {"0": 5, "1": 7}}, "value": {"v": "1.50"}})
    assert queries.fast("/snapshots/s/a", {})[1]["value"] == {"v": "1.50"}
    assert queries.fast("/snapshots/s/c", {})[1]["value"] == {"v": "3.25"}  # the overlay's new key
    assert queries.fast("/snapshots/s/b", {})[0] == 404  # the overlay's last record of b: a tombstone
    assert queries.fast("/snapshots/s/z", {})[0] == 404
    snap._log = None  # merged: the base answers
    assert queries.fast("/snapshots/s/b", {})[1]["value"] == {"v": "2.00"}
    assert queries.fast("/snapshots/s", {}) is None  # the description counts keys: on a thread
