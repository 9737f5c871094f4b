"""S3Source's position stays small however many objects the prefix holds (logic only: a stub S3 client)."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest

from connectors.s3 import source as s3_source
from connectors.s3.config import S3SourceConfig
from connectors.s3.connection import S3Connection

SCHEMA = {"type": "record", "name": "row", "fields": [{"name": "id", "type": "long"}, {"name": "v", "type": "string"}]}
BASE = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


class StubS3:
    """Objects ``{key: (last_modified, etag, body)}``; counts GETs."""

    def __init__(self, objects: dict[str, tuple[dt.datetime, str, bytes]]) -> None:
        self.objects = objects
        self.gets = 0

    def head_bucket(self, **_kw: Any) -> None:
        return None

    def get_paginator(self, _name: str) -> Any:
        stub = self

        class Pages:
            def paginate(self, **_kw: Any) -> Any:
                keys = sorted(stub.objects)
                for i in range(0, len(keys), 1000):  # S3 pages of 1,000 keys, lexicographic
                    yield {"Contents": [{"Key": k, "LastModified": stub.objects[k][0], "ETag": stub.objects[k][1]}
                                        for k in keys[i:i + 1000]]}

        return Pages()

    def get_object(self, Key: str, **_kw: Any) -> dict[str, Any]:  # boto3's argument name
        self.gets += 1
        return {"Body": io.BytesIO(self.objects[Key][2])}


@pytest.fixture
def make_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    (tmp_path / "s.avsc").write_text(json.dumps(SCHEMA))

    def make(stub: StubS3) -> s3_source.S3Source:
        monkeypatch.setattr(s3_source, "s3_client", lambda _conn: stub)
        cfg = S3SourceConfig(name="many", type="s3_source", connection="s3", topic="state.many", bucket="b",
                             prefix="p/", format="csv", key=["id"], value_schema=str(tmp_path / "s.avsc"))
        return s3_source.S3Source(cfg, S3Connection(type="s3"))

    return make


def _objects(n: int, per_second: int = 5) -> dict[str, tuple[dt.datetime, str, bytes]]:
    return {f"p/{i:06d}.csv": (BASE + dt.timedelta(seconds=i // per_second), f'"etag-{i}"', f"id,v\n{i},x\n".encode())
            for i in range(n)}


def test_position_is_bounded_with_many_objects(make_source: Any) -> None:
    stub = StubS3(_objects(20_000))
    src = make_source(stub)
    src.open(None)
    largest = max(len(json.dumps(b.position)) for b in src.poll() if b.position is not None)
    # the old format listed every object (~70 bytes each: 1.4 MB here, over Kafka's 1 MB message limit)
    assert largest < 1_000, largest
    position = src._position()
    assert position["hwm"] == {"modified": (BASE + dt.timedelta(seconds=3999)).isoformat(), "key": "p/019999.csv"}
    assert sorted(position["at_hwm"]) == [f"p/{i:06d}.csv" for i in range(19_995, 20_000)]

    # resumed from it: nothing is read again, then only what is new or replaced
    again = make_source(stub)
    again.open(position)
    stub.gets = 0
    assert [b for b in again.poll() if b.records] == []
    assert stub.gets == 0
    stub.objects["p/020000.csv"] = (BASE + dt.timedelta(seconds=3999), '"late"', b"id,v\n20000,late\n")
    stub.objects["p/000007.csv"] = (BASE + dt.timedelta(seconds=5000), '"new"', b"id,v\n7,new\n")
    read = [r for b in again.poll() for r in b.records]
    assert [v["v"] for _k, v in read] == ["late", "new"]  # a same-second latecomer, then a replaced object


def test_old_position_format_is_converted(make_source: Any) -> None:
    objects = _objects(10)
    stub = StubS3(objects)
    old = {"objects": {k: {"etag": e, "rows": 1, "done": True} for k, (_lm, e, _b) in objects.items()}}
    old["objects"]["p/000009.csv"] = {"etag": '"etag-9"', "rows": 0, "done": False}
    src = make_source(stub)
    src.open(old)
    read = [r for b in src.poll() for r in b.records]
    assert [k["id"] for k, _v in read] == [9]  # only the half-read object
    position = src._position()
    assert "objects" not in position and position["hwm"]["key"] == "p/000009.csv"
