"""The Iceberg sink's logic without a catalog: schema judgement, offsets in summaries, key filters, config."""

from __future__ import annotations

import json
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError

from connectors.iceberg.config import IcebergSinkConfig
from connectors.iceberg.connection import IcebergConnection, catalog_properties
from connectors.iceberg.offsets import offset_of, recorded_offsets, with_offset
from connectors.iceberg.rows import key_filter, key_tuple, match_tuple
from connectors.iceberg.table_schema import SchemaRefused, align, compare, plan
from threes.testing.sink import record


def test_a_new_field_is_a_new_optional_column() -> None:
    table = pa.schema([("id", pa.int64()), ("name", pa.large_string())])
    writer = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("note", pa.string())])
    adds, promotes = plan(table, writer)
    assert [(f.name, f.nullable) for f in adds] == [("note", True)]
    assert promotes == {}


def test_widening_promotes_and_narrower_writers_fit() -> None:
    assert compare("qty", pa.int32(), pa.int64()) == pa.int64()
    assert compare("qty", pa.int64(), pa.int32()) is None
    assert compare("x", pa.float32(), pa.float64()) == pa.float64()
    assert compare("amount", pa.decimal128(10, 2), pa.decimal128(12, 2)) == pa.decimal128(12, 2)
    assert compare("amount", pa.decimal128(12, 2), pa.decimal128(10, 2)) is None
    assert compare("ts", pa.timestamp("us", "UTC"), pa.timestamp("ms", "UTC")) is None


@pytest.mark.parametrize(
    ("column", "writer", "words"),
    [
        (pa.decimal128(10, 2), pa.decimal128(10, 3), "scale"),
        (pa.int64(), pa.string(), "cannot hold"),
        (pa.string(), pa.int64(), "cannot hold"),
        (pa.timestamp("us", "UTC"), pa.timestamp("us"), "cannot hold"),
    ],
)
def test_a_change_the_column_cannot_hold_exactly_is_refused_naming_it(column: Any, writer: Any, words: str) -> None:
    with pytest.raises(SchemaRefused, match=f"column 'c' is .*{words}"):
        compare("c", column, writer)


def test_align_casts_safely_and_fills_absent_columns() -> None:
    target = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(12, 2)), ("gone", pa.large_string())])
    rows = pa.table({"id": pa.array([1], pa.int32()), "amount": pa.array([Decimal("1.25")], pa.decimal128(10, 2))})
    out = align(rows, target)
    assert out.schema == target
    assert out.to_pylist() == [{"id": 1, "amount": Decimal("1.25"), "gone": None}]
    with pytest.raises(pa.ArrowInvalid):  # a value that would be rounded is refused, never rounded
        align(
            pa.table({"amount": pa.array([Decimal("1.255")], pa.decimal128(10, 3))}),
            pa.schema([("amount", pa.decimal128(10, 2))]),
        )


def _snapshot(sid: int, parent: int | None, props: dict[str, str]) -> Any:
    return SimpleNamespace(
        snapshot_id=sid, parent_snapshot_id=parent, summary=SimpleNamespace(additional_properties=props)
    )


class _Table:
    def __init__(self, snapshots: list[Any]):
        self.by_id = {s.snapshot_id: s for s in snapshots}
        self.current = snapshots[-1] if snapshots else None

    def current_snapshot(self) -> Any:
        return self.current

    def snapshot_by_id(self, sid: int) -> Any:
        return self.by_id.get(sid)


def test_offsets_come_from_the_newest_snapshot_that_has_them() -> None:
    prop = "threes.kafka.offsets.lake"
    table = _Table(
        [
            _snapshot(1, None, {prop: json.dumps({"t": {"0": 5}})}),
            _snapshot(2, 1, {prop: json.dumps({"t": {"0": 9, "1": 3}})}),
            _snapshot(3, 2, {}),  # another writer's snapshot (a compaction without them, Spark)
        ]
    )
    offsets = recorded_offsets(table, prop)
    assert offset_of(offsets, "t", 0) == 9 and offset_of(offsets, "t", 1) == 3 and offset_of(offsets, "t", 2) == -1
    assert recorded_offsets(_Table([]), prop) == {}
    assert recorded_offsets(table, "threes.kafka.offsets.other") == {}


def test_a_commit_carries_every_partition_and_never_moves_one_back() -> None:
    merged = json.loads(with_offset({"t": {"0": 9, "1": 3}}, "t", 1, 7))
    assert merged == {"t": {"0": 9, "1": 7}}
    assert json.loads(with_offset({"t": {"0": 9}}, "t", 0, 4)) == {"t": {"0": 9}}
    assert json.loads(with_offset({}, "u", 2, 0)) == {"u": {"2": 0}}


def test_keys_and_their_filters() -> None:
    assert key_tuple(record(7, 1, 0), ["id"]) == (7,)
    composite = record(7, 1, 0)
    composite.key = {"carrier": "AA", "flight": 7}
    assert key_tuple(composite, ["flight", "carrier"]) == (7, "AA")
    assert match_tuple(composite, ["flight", "carrier"]) == ('[7,"AA"]',)
    assert match_tuple(record(7, 1, 0), ["id"]) == (7,)
    with pytest.raises(ValueError, match="no field"):
        key_tuple(composite, ["tailnum"])
    assert "In" in repr(key_filter(["id"], [(1,), (2,)]))
    assert "Or" in repr(key_filter(["a", "b"], [(1, "x"), (2, "y")]))
    assert "AlwaysFalse" in repr(key_filter(["id"], []))


def test_config_needs_a_key_to_upsert_and_buckets_for_bucket() -> None:
    base = {"name": "lake", "type": "iceberg_sink", "connection": "lake", "topics": ["updates.x"], "table": "ns.t"}
    with pytest.raises(ValidationError, match="needs `key`"):
        IcebergSinkConfig.model_validate(base)
    assert IcebergSinkConfig.model_validate({**base, "mode": "append"}).key == []
    with pytest.raises(ValidationError, match="buckets"):
        IcebergSinkConfig.model_validate(
            {**base, "key": ["id"], "partition_by": [{"field": "id", "transform": "bucket"}]}
        )
    with pytest.raises(ValidationError, match="table"):
        IcebergSinkConfig.model_validate({**base, "key": ["id"], "table": "no_namespace"})


def test_the_catalog_password_never_shows() -> None:
    conn = IcebergConnection.model_validate(
        {
            "type": "iceberg",
            "uri": "postgresql+psycopg://u:s3cret@db:5432/c",
            "warehouse": "s3://lake/wh",
            "storage": {"access_key_id": "k", "secret_access_key": "hush"},
        }
    )
    assert "s3cret" not in conn.uri and "s3cret" not in repr(conn) and "hush" not in repr(conn)
    props = catalog_properties(conn)
    assert props["uri"] == "postgresql+psycopg://u:s3cret@db:5432/c"  # revealed only to pyiceberg
    assert props["s3.secret-access-key"] == "hush" and conn.bucket == "lake"
    rest = IcebergConnection.model_validate(
        {"type": "iceberg", "catalog": "rest", "uri": "http://cat:8181", "token": "t0k", "warehouse": "s3://lake"}
    )
    assert catalog_properties(rest)["token"] == "t0k" and "t0k" not in repr(rest)


def test_the_version_guard_with_tombstones() -> None:
    from connectors.iceberg.tombstones import decide

    latest = [
        record(1, 5, 0),
        record(2, 3, 1, delete=True),
        record(3, 2, 2),
        record(4, 7, 3, delete=True),
        record(5, 9, 4, delete=True),
    ]
    keys = [(1,), (2,), (3,), (4,), (5,)]
    rows = {(1,): 4, (2,): 1, (4,): 8, (5,): 2}
    tombs = {(3,): 3, (5,): 9}  # key 5: this delete's tombstone is there already (a crash between the commits)
    d = decide(latest, keys, rows, tombs)
    assert [r.key for r in d.upserts] == [1]  # 3 is older than its tombstone
    assert d.replaced == [(1,), (2,), (5,)]  # 4's delete is older than its row; 5's row goes at last
    assert d.tombstones == [((2,), 3)] and d.recorded == []


def test_the_iceberg_commands_are_registered() -> None:
    from typer.testing import CliRunner

    from threes.cli import app

    result = CliRunner().invoke(app, ["iceberg", "--help"])
    assert result.exit_code == 0 and "expire" in result.output and "compact" in result.output
