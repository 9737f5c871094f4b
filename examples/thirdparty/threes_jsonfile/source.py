"""JsonfileSource: the entities of a folder of JSON Lines files, into a compacted topic."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

from connectors.api.source import SourceBatch, SourceSchemas, SourceTask, TopicState, tombstone_batches
from kernel.exceptions import ConfigError, RetriableError, SetupError
from threes_jsonfile.config import JsonfileSourceConfig
from threes_jsonfile.connection import JsonfileConnection, open_folder

log = logging.getLogger(__name__)


class JsonfileSource(SourceTask):
    """Every ``*.jsonl`` file of ``<root>/<path>``: one JSON object per line, one entity per key.

    Delivery: at least once. A file is read whole when its content changed (SHA-256), and
    every entity of it is written again; the position is the digest of each file read.
    Idempotency key: the entity key (``key`` fields) of the compacted topic. Deletes: an
    entity that left every file is tombstoned by reconciliation after a cycle that saw a
    file change or vanish. No backpressure of its own (the worker's producer applies it).

    Example::

        connections:
          files: {type: jsonfile, root: ./data, token: "${env:THREES_JSONFILE_TOKEN}"}
        sources:
          - {name: items, type: jsonfile_source, connection: files, path: items,
             topic: state.items, key: [id], value_schema: item.avsc}
    """

    def open(self, position: Mapping[str, Any] | None) -> SourceSchemas:
        """Open the folder, read the schema, and resume from the files' digests in ``position``.

        Raises:
            SetupError: the folder is missing or refuses the token.
            ConfigError: the schema lacks a key field.
        """
        config = cast(JsonfileSourceConfig, self.config)
        try:
            self.folder = open_folder(cast(JsonfileConnection, self.connection)) / config.path
        except SetupError as exc:  # the operator needs to know which source cannot start
            raise SetupError(f"source {self.name!r}: {exc}") from exc
        self.digests: dict[str, str] = dict(position["files"]) if position else {}
        self.changed = False
        value = json.loads(Path(str(config.value_schema)).read_text())
        fields = {f["name"]: f for f in value["fields"]}
        self.key_fields = list(config.key or ())
        missing = [k for k in self.key_fields if k not in fields]
        if missing:
            raise ConfigError(f"source {self.name!r}: key field(s) {missing} are not in the value schema")
        key = {"type": "record", "name": f"{value['name']}_key", "fields": [fields[k] for k in self.key_fields]}
        return SourceSchemas(key=key, value=value)

    def _files(self) -> dict[str, Path]:
        try:
            return {p.name: p for p in sorted(self.folder.glob("*.jsonl"))}
        except OSError as exc:
            raise RetriableError(f"source {self.name!r}: cannot list {self.folder}: {exc}") from exc

    def _rows(self, path: Path) -> tuple[list[dict[str, Any]], str]:
        try:
            data = path.read_bytes()
        except OSError as exc:  # removed or rewritten while listed: the next cycle sees it again
            raise RetriableError(f"source {self.name!r}: cannot read {path}: {exc}") from exc
        rows = [json.loads(line) for line in data.splitlines() if line.strip()]
        return rows, hashlib.sha256(data).hexdigest()

    def poll(self) -> Iterator[SourceBatch]:
        """Yield the entities of every file whose content changed, ``batch_records`` at a time."""
        files = self._files()
        size = self.config.batch_records
        for name, path in files.items():
            rows, digest = self._rows(path)
            if self.digests.get(name) == digest:
                continue
            records = [({k: row[k] for k in self.key_fields}, row) for row in rows]
            self.digests[name] = digest
            self.changed = True
            for start in range(0, max(len(records), 1), size):
                last = start + size >= len(records)
                # the position moves past the file only with its last batch: a crash re-reads it whole
                yield SourceBatch(records[start:start + size], {"files": dict(self.digests)} if last else None)
        gone = sorted(set(self.digests) - set(files))
        for name in gone:
            del self.digests[name]
        if gone:
            self.changed = True
            yield SourceBatch([], {"files": dict(self.digests)})

    def wants_reconcile(self) -> bool:
        """After a cycle that saw a file change or vanish (an entity may have left it)."""
        changed, self.changed = self.changed, False
        return changed

    def reconcile(self, state: TopicState) -> Iterator[SourceBatch]:
        """Tombstones for the topic's live keys that no file holds any more."""
        present = {
            state.encode_key({k: row[k] for k in self.key_fields})
            for path in self._files().values()
            for row in self._rows(path)[0]
        }
        gone = [key for key in state.live if key not in present]
        log.info("source=%s reconcile: %d live keys, %d gone", self.name, len(present), len(gone))
        yield from tombstone_batches(gone, self.config.batch_records)
