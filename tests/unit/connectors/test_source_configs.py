"""Unit tests of the source config models' cross-field rules (errors say what to add, with the path)."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.exceptions import ConfigError
from threes.config import pipeline_from_dict


def _pipeline(source: dict[str, Any]) -> Any:
    return pipeline_from_dict({
        "kafka": {"bootstrap_servers": "localhost:9092"},
        "connections": {"pg": {"type": "rds", "url": "sqlite:///x.db"},
                        "es": {"type": "elasticsearch", "hosts": ["http://localhost:9200"]},
                        "s3": {"type": "s3"}},
        "sources": [{"name": "s", "topic": "state.s", **source}],
    })


@pytest.mark.parametrize(("source", "message"), [
    ({"type": "rds_source", "connection": "pg"}, "mode 'bulk' needs `table`"),
    ({"type": "rds_source", "connection": "pg", "table": "t", "mode": "timestamp"}, "needs `timestamp_column`"),
    ({"type": "rds_source", "connection": "pg", "table": "t", "mode": "incrementing"},
     "needs `incrementing_column`"),
    ({"type": "rds_source", "connection": "pg", "mode": "query", "query": "SELECT 1 AS a", "value_schema": "x"},
     "needs `key`"),
    ({"type": "rds_source", "connection": "pg", "table": "t", "value_schema": "x.avsc"},
     "`value_schema` is derived from the table"),
    ({"type": "elasticsearch_source", "connection": "es", "index": "i", "mode": "incremental"},
     "needs `updated_field`"),
    ({"type": "s3_source", "connection": "s3", "bucket": "b", "format": "csv"}, "needs `key`"),
    ({"type": "rds_source", "connection": "pg", "table": "t", "hold_for_transactions": "some"}, "hold_for"),
])
def test_invalid_source_configs(source: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _pipeline(source)
    assert message in str(err.value)
    assert "sources[0]" in str(err.value)


def test_valid_source_configs() -> None:
    p = _pipeline({"type": "rds_source", "connection": "pg", "table": "t", "mode": "timestamp+incrementing",
                   "timestamp_column": "ts", "incrementing_column": "id", "reconcile_interval_s": None})
    assert p.sources[0].reconcile_interval_s is None
    assert p.sources[0].hold_for_transactions == "writers"
    p = _pipeline({"type": "s3_source", "connection": "s3", "bucket": "b", "format": "parquet", "key": ["k"]})
    assert p.sources[0].tombstones_on_delete is True
