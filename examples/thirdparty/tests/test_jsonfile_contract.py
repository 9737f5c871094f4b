"""The jsonfile connectors against threes' contract kit: a real folder and a real Kafka.

Run with ``pytest tests --threes-kafka HOST:PORT`` (or ``THREES_KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from threes_jsonfile.config import JsonfileSinkConfig
from threes_jsonfile.connection import TOKEN_FILE, JsonfileConnection
from threes_jsonfile.sink import JsonfileSink, read_state

from threes.testing.sink import SinkContract
from threes.testing.source import SourceContract

TOKEN = "folder-token-4711"
PARTS = 3
SCHEMA = {
    "type": "record", "name": "item", "namespace": "example.jsonfile", "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "amount", "type": ["null", "double"], "default": None},
    ],
}


def guarded_folder(path: Path) -> Path:
    """A folder that accepts only :data:`TOKEN`."""
    path.mkdir(parents=True)
    (path / TOKEN_FILE).write_text(TOKEN)
    return path


class TestJsonfileSourceContract(SourceContract):
    """Entity i lives in ``part-{i % 3}.jsonl``; a part left empty is deleted."""

    def setup_system(self, ctx: dict[str, Any]) -> None:
        tmp = ctx["request"].getfixturevalue("tmp_path")
        ctx["root"] = guarded_folder(tmp / "data")
        (ctx["root"] / "items").mkdir()
        (tmp / "item.avsc").write_text(json.dumps(SCHEMA))
        ctx["schema"] = str(tmp / "item.avsc")
        ctx["rows"] = {}

    def connections(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return {"files": {"type": "jsonfile", "root": str(ctx["root"]), "token": TOKEN}}

    def bad_connections(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], str]:
        secret = "wrong-token-0815"
        return {"files": {"type": "jsonfile", "root": str(ctx["root"]), "token": secret}}, secret

    def source_config(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return {"name": ctx["name"], "type": "jsonfile_source", "connection": "files", "topic": ctx["topic"],
                "path": "items", "key": ["id"], "value_schema": ctx["schema"], "batch_records": 4}

    def make_row(self, i: int, version: int = 0) -> dict[str, Any]:
        return {"id": i, "name": f"n{i}v{version}", "amount": i * 1.5 + version if i % 5 else None}

    def _write_parts(self, ctx: dict[str, Any], parts: set[int]) -> None:
        for p in parts:
            rows = [r for i, r in sorted(ctx["rows"].items()) if i % PARTS == p]
            path = ctx["root"] / "items" / f"part-{p}.jsonl"
            if rows:
                path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            else:
                path.unlink(missing_ok=True)

    def upsert(self, ctx: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        for r in rows:
            ctx["rows"][r["id"]] = r
        self._write_parts(ctx, {r["id"] % PARTS for r in rows})

    def delete(self, ctx: dict[str, Any], keys: list[tuple[Any, ...]]) -> None:
        for (i,) in keys:
            ctx["rows"].pop(i, None)
        self._write_parts(ctx, {i % PARTS for (i,) in keys})

    def system_state(self, ctx: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {(i,): dict(r) for i, r in ctx["rows"].items()}


class TestJsonfileSinkContract(SinkContract):
    """One JSON file per key under ``<root>/out``."""

    @staticmethod
    def _sink(root: Path, token: str) -> JsonfileSink:
        config = JsonfileSinkConfig(name="items-files", type="jsonfile_sink", connection="files",
                                    topics=["updates.items"], path="out")
        return JsonfileSink(config, JsonfileConnection(type="jsonfile", root=str(root), token=SecretStr(token)))

    @pytest.fixture
    def sink(self, tmp_path: Path) -> Iterator[JsonfileSink]:
        s = self._sink(guarded_folder(tmp_path / "data"), TOKEN)
        s.open()
        yield s
        s.close()

    @pytest.fixture
    def bad_sink(self, tmp_path: Path) -> JsonfileSink:
        return self._sink(guarded_folder(tmp_path / "data"), "wrong-token-0815")

    def state(self, sink: JsonfileSink) -> dict[str, tuple[int, dict[str, Any]]]:
        return read_state(sink.folder)
