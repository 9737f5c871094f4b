"""The reader schemas of a job: the events' from its file, each snapshot's from its file or its topics' writers.

A snapshot without ``key_schema`` / ``value_schema`` reads with the latest writer schema its
topics carry (the schema store's subjects ``<topic>-key`` / ``<topic>-value``), and every writer
version is matched to the reader (:func:`~stream_app.plan.writer_match.match_writers`); a
Debezium snapshot reads the ``after`` records of its change events, and gets an envelope reader.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schemas import load_schema
from schemas.debezium import after_schema, envelope_reader
from schemas.exceptions import SchemaNotFoundError
from schemas.serde import schema_json
from stream_app.avro_schemas import string_key_schema
from stream_app.config import SnapshotConfig, StreamJobConfig
from stream_app.plan.model import SnapshotPlan, schema_of
from stream_app.plan.writer_match import WriterVersions, match_writers


class ReaderSchemas:
    """Loads reader schemas, reporting each problem at its path under ``stream``.

    Args:
        base_dir: where relative schema paths start (the current directory when ``None``).
        writer_versions: the schema store's subject versions; ``None`` (no connection): a snapshot
            without reader schemas is not resolved, and no writer is matched.
        problem: takes ``(path under stream, message)``.
    """

    def __init__(
        self, base_dir: Path | None, writer_versions: WriterVersions | None, problem: Callable[[str, str], None]
    ):
        self.base_dir, self.writer_versions, self.problem = base_dir, writer_versions, problem
        self.envelopes: dict[str, dict[str, Any]] = {}  # snapshot -> Debezium envelope reader (Avro formats)

    def load(self, ref: str, path: str) -> dict[str, Any] | None:
        """The Avro record schema ``ref`` (a file or a shipped schema); ``None`` after a problem at ``path``."""
        try:
            avro = load_schema(ref, self.base_dir or Path.cwd())
        except SchemaNotFoundError as exc:
            self.problem(path, str(exc))
            return None
        if not isinstance(avro, dict) or avro.get("type") != "record":
            self.problem(path, f"{ref}: the schema must be an Avro record")
            return None
        return avro

    def snapshots(
        self, config: StreamJobConfig
    ) -> tuple[dict[str, tuple[dict[str, Any], dict[str, Any]]], set[str]]:
        """Each snapshot's key and value reader schemas, and the snapshots whose schemas only the topics know.

        Returns:
            snapshot name -> ``(key, value)`` for the snapshots resolved; the names of those left
            unresolved without writer versions (validate without a connection).
        """
        snaps: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        unknown: set[str] = set()  # snapshots whose schemas only the topics know (validate without a connection)
        for i, snap in enumerate(config.snapshots):
            if snap.key_format == "string":  # plain UTF-8 keys: one string field, no schema to load
                key: dict[str, Any] | None = string_key_schema(snap.name, snap.key_field or "key")
            else:
                key = self.snapshot_schema(i, snap, "key", snap.key_schema)
            value = self.snapshot_schema(i, snap, "value", snap.value_schema)
            if key is not None and value is not None:
                snaps[snap.name] = (key, value)
            elif self.writer_versions is None and (snap.value_schema is None or snap.key_schema is None):
                unknown.add(snap.name)
        return snaps, unknown

    def _writers_of(self, snap: SnapshotConfig, kind: str) -> list[tuple[str, dict[str, Any]]]:
        writer_versions = self.writer_versions
        assert writer_versions is not None
        return [(t, json.loads(text)) for t in snap.topics for text in writer_versions(f"{t}-{kind}")]

    def _debezium_rows(self, i: int, snap: SnapshotConfig) -> list[tuple[str, dict[str, Any]]]:
        """The ``after`` records of a Debezium snapshot's writer envelopes."""
        rows = []
        for topic, envelope in self._writers_of(snap, "value"):
            try:
                rows.append((topic, after_schema(envelope)))
            except ValueError as exc:
                self.problem(f"snapshots[{i}].envelope", f"topic {topic!r}: {exc}")
        return rows

    def snapshot_schema(self, i: int, snap: SnapshotConfig, kind: str, ref: str | None) -> dict[str, Any] | None:
        """Snapshot ``i``'s ``kind`` (``key``/``value``) reader schema, its writers matched; ``None`` if unknown."""
        path = f"snapshots[{i}].{kind}_schema"
        fmt = snap.key_format if kind == "key" else snap.value_format
        debezium = kind == "value" and snap.envelope == "debezium"
        if fmt == "connect_json":  # the records carry their schemas; no store keeps them (ref is required)
            return self.load(ref, path) if ref is not None else None
        if ref is not None:
            reader = self.load(ref, path)
        elif self.writer_versions is None:
            return None
        else:
            reader = self._latest_writer(i, snap, kind, debezium)
        if reader is None or self.writer_versions is None:
            return reader
        writers = self._debezium_rows(i, snap) if debezium else self._writers_of(snap, kind)
        for message in match_writers(reader, writers):
            self.problem(path, message)
        if debezium:
            found = [envelope for _, envelope in self._writers_of(snap, "value")]
            if found:
                self.envelopes[snap.name] = envelope_reader(reader, found)
            else:
                self.problem(f"snapshots[{i}].envelope", f"no change event schema recorded for topic(s) {snap.topics} "
                             "(subject <topic>-value): start the connector that writes them first")
        return reader

    def _latest_writer(self, i: int, snap: SnapshotConfig, kind: str, debezium: bool) -> dict[str, Any] | None:
        """The reader a snapshot without a reader schema gets: the latest writer schema of its topics."""
        writers = self._debezium_rows(i, snap) if debezium else self._writers_of(snap, kind)
        if not writers:
            self.problem(f"snapshots[{i}].{kind}_schema",
                         f"no {kind} schema recorded for topic(s) {snap.topics} (subject <topic>-{kind} in the "
                         f"schema topic): start the source that writes them first, or set {kind}_schema")
            return None
        # the latest schema of the first topic (of any topic when it has none yet) reads them all
        first = [w for t, w in writers if t == snap.topics[0]] or [w for _, w in writers]
        return {k: v for k, v in first[-1].items() if k != "aliases"}


def snapshot_plan(config: SnapshotConfig, key: dict[str, Any], value: dict[str, Any]) -> SnapshotPlan:
    """A snapshot's schemas, and the id of the pair (an older checkpoint of other reader schemas is not used)."""
    schema_id = hashlib.sha256((schema_json(key) + schema_json(value)).encode()).hexdigest()[:16]
    return SnapshotPlan(config, schema_of(key), schema_of(value), schema_id)
