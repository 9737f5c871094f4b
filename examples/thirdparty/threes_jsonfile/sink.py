"""JsonfileSink: update records into one JSON file per key."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote

from connectors.api.sink import RecordFailure, Sink, SinkBatch, latest_per_key
from kernel.exceptions import RetriableError, SetupError
from threes_jsonfile.config import JsonfileSinkConfig
from threes_jsonfile.connection import JsonfileConnection, open_folder


class JsonfileSink(Sink):
    """One file ``<root>/<path>/<key>.json`` per key: ``{"key", "version", "deleted", "value"}``.

    Delivery: at least once, idempotent. Idempotency key: the record key; a record is
    applied only when its ``version`` is newer than the file's, so replays and late
    duplicates change nothing. A tombstone keeps its file, marked ``deleted`` with its
    version, so an older update that arrives later cannot bring the key back. Each file is
    replaced atomically (write, fsync, rename). No backpressure: a local disk is never
    busy, only full (``RetriableError``).

    Example::

        sync:
          - name: export
            dead_letter_topic: updates.dlq
            sinks:
              - {name: items-files, type: jsonfile_sink, connection: files, topics: [updates.items], path: out}
    """

    def open(self) -> None:
        """Open the folder and create ``path`` in it.

        Raises:
            SetupError: the folder is missing or refuses the token.
        """
        config = cast(JsonfileSinkConfig, self.config)
        try:
            self.folder = open_folder(cast(JsonfileConnection, self.connection)) / config.path
        except SetupError as exc:
            raise SetupError(f"sink {self.name!r}: {exc}") from exc
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise ``SetupError`` unless the folder exists and accepts the token."""
        open_folder(cast(JsonfileConnection, self.connection))

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        """Apply the newest record of each key when it is newer than the key's file."""
        with self._lock:  # one writer at a time: read-compare-replace of a file is not atomic
            for record in latest_per_key(batch.records):
                path = self.folder / f"{quote(record.key_id, safe='')}.json"
                held = _read(path)
                if held is not None and held["version"] >= record.version:
                    continue
                doc = {"key": record.key, "version": record.version, "deleted": record.is_delete,
                       "value": record.value}
                try:
                    _replace(path, json.dumps(doc, default=_json_default, sort_keys=True).encode())
                except OSError as exc:
                    raise RetriableError(f"sink {self.name!r}: cannot write {path}: {exc}") from exc
        return []


def read_state(folder: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    """The live keys of a sink's folder: ``key_id`` -> ``(version, value)``; deleted keys absent."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")):
        doc = _read(path)
        if doc is not None and not doc["deleted"]:
            out[unquote(path.stem)] = (doc["version"], doc["value"])
    return out


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return cast(dict[str, Any], json.loads(path.read_bytes()))
    except FileNotFoundError:
        return None


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return str(value)  # Decimal, UUID: their exact text
