"""S3Source: rows of CSV, JSON Lines, Parquet or Avro objects under a bucket/prefix into a compacted topic.

Position (bounded: its size does not grow with the number of objects)::

    {"hwm": {"modified": "2024-05-01T12:30:00+00:00", "key": "in/0042.csv"},
     "at_hwm": {"in/0042.csv": "<etag>"},             # objects read whose LastModified is hwm's
     "reading": {"key": ..., "etag": ..., "rows": 500},  # the object being read, rows already emitted
     "reconciled": {"modified": ..., "key": ...}}       # changes checked up to here

Objects are read in ``(LastModified, key)`` order; the high-water mark says
every object up to it was read. An object at or below the mark is skipped
without a GET; one that is overwritten gets a newer ``LastModified`` and is
read again. S3's ``LastModified`` has a one-second resolution, so the objects
of the mark's second are kept with their ETags (``at_hwm``): one that appears
later in that same second, or is replaced within it (another ETag), is still
read. A crash resumes inside the object being read by skipping the rows
already emitted (same ETag), or reads it from the start (another ETag).
The previous position format (every object ever seen) is read and converted.

* A **new** object is read from its first row.
* A **changed** object (a newer ``LastModified``) is read again from the first
  row; then reconciliation reads its keys once more and emits tombstones for
  the keys it held before and no longer holds. Which keys an object held is
  not stored anywhere but the state topic: every record carries the header
  ``threes.s3.object`` (the object key), and the live keys of the topic tagged
  with an object are the keys it last gave.
* A **deleted** object yields tombstones for its live keys
  (``tombstones_on_delete``, default on): reconciliation finds keys tagged
  with an object the listing no longer has.
* **Half-written objects are never read**: S3 makes an object visible only when
  its upload completes (a multipart upload in progress is not listed), and the
  GET carries ``If-Match: <listed ETag>``, so an object replaced between listing
  and reading is skipped until the next listing (HTTP 412), never read mixed.
  ``min_age_s`` additionally waits for writers that replace an object in steps.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from connectors.api.source import BoundedLiveKeys, SourceBatch, SourceSchemas, SourceTask, TopicState
from connectors.runtime.avro import (
    CoercionError,
    key_schema_from,
    record_coercer,
)
from connectors.s3.config import S3SourceConfig
from connectors.s3.connection import S3Connection, s3_client
from connectors.s3.objects import ObjectChanged, ObjectReads
from kernel.exceptions import ConfigError, FatalError, RetriableError

log = logging.getLogger(__name__)

OBJECT_HEADER = "threes.s3.object"


class S3Source(ObjectReads, SourceTask):
    """Rows of objects under ``s3://bucket/prefix`` into a compacted topic, keyed by ``key``.

    Delivery guarantee: at least once. An object's row count is stored only
    after the broker acknowledged the rows before it; a crash re-reads the
    object and skips the rows already counted.

    Idempotency key: the ``key`` field(s) of each row, as an Avro record; a
    re-read object produces the same keys and values again.

    Backpressure: rows are read in batches of ``batch_records``; while the
    producer's queue is full the worker stops reading (the GET stream waits).

    YAML: see :class:`~connectors.s3.config.S3SourceConfig`
    (its example is rendered in docs/config-reference.md).
    """

    config: S3SourceConfig
    connection: S3Connection
    source_header = OBJECT_HEADER

    def __init__(self, config: S3SourceConfig, connection: S3Connection, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.client: Any = None
        self.hwm: tuple[dt.datetime, str] | None = None
        self.at_hwm: dict[str, str] = {}
        self.reading: dict[str, Any] | None = None
        self.reconciled: tuple[dt.datetime, str] | None = None
        self.legacy: dict[str, dict[str, Any]] = {}  # a position of the old format: {object: {etag, rows, done}}
        self.listed: dict[str, dict[str, Any]] = {}  # the last listing (memory only), for deletes and changes
        self.read_here: dict[str, int] = {}  # objects read by this process -> distinct keys they gave
        self._reconcile_due = True  # deletes are found by reconciliation: once after every start

    # -- open -----------------------------------------------------------------------------------------

    def open(self, position: Mapping[str, Any] | None) -> SourceSchemas:
        """Check the bucket, settle the value schema (config or first object), resume from ``position``.

        Raises:
            RetriableError: S3 cannot be reached.
            ConfigError: no such bucket, a key field not in the schema, or no object to infer a schema from.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        cfg = self.config
        self.where = f"s3://{cfg.bucket}/{cfg.prefix}"
        self.client = s3_client(self.connection)
        try:
            self.client.head_bucket(Bucket=cfg.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket"):
                raise ConfigError(f"source {cfg.name!r}: bucket {cfg.bucket!r} does not exist") from exc
            raise FatalError(f"source {cfg.name!r}: cannot access bucket {cfg.bucket!r}: {code or exc}") from exc
        except BotoCoreError as exc:
            raise RetriableError(f"source {cfg.name!r}: S3 not reachable: {exc}") from exc
        if cfg.value_schema:
            from schemas import load_schema

            schema = load_schema(cfg.value_schema)
        else:
            schema = self._infer_schema()
        self.value_schema = schema
        try:
            self.key_schema = key_schema_from(schema, cfg.key or [], cfg.name)
        except KeyError as exc:
            raise ConfigError(f"source {cfg.name!r}: key field {exc.args[0]!r} is not a field of the value schema "
                              f"(fields: {[f['name'] for f in schema.get('fields', [])]})") from exc
        self.key_fields = [f["name"] for f in self.key_schema["fields"]]
        self.coerce = record_coercer(schema, empty_is_null=cfg.format == "csv")
        self._resume(position or {})
        return SourceSchemas(key=self.key_schema, value=self.value_schema)

    def _resume(self, position: Mapping[str, Any]) -> None:
        self.hwm = _mark(position.get("hwm"))
        self.at_hwm = dict(position.get("at_hwm") or {})
        self.reading = dict(position["reading"]) if position.get("reading") else None
        self.reconciled = _mark(position.get("reconciled"))
        self.legacy = {k: dict(v) for k, v in (position.get("objects") or {}).items()}
        if self.legacy:
            half = [(k, v) for k, v in self.legacy.items() if not v.get("done") and not v.get("deleted")]
            if half and self.reading is None:
                key, entry = half[0]
                self.reading = {"key": key, "etag": entry.get("etag"), "rows": int(entry.get("rows", 0))}

    # -- poll -------------------------------------------------------------------------------------------

    def _position(self) -> dict[str, Any]:
        return {
            "hwm": _mark_json(self.hwm),
            "at_hwm": dict(self.at_hwm),
            "reading": dict(self.reading) if self.reading else None,
            "reconciled": _mark_json(self.reconciled),
        }

    def _done(self, key: str, etag: str, modified: dt.datetime) -> bool:
        """Whether an object was read already (no GET needed)."""
        if self.legacy:
            old = self.legacy.get(key)
            if old is not None and old.get("etag") == etag and old.get("done"):
                return True
        if self.hwm is None:
            return False
        if modified < self.hwm[0]:
            return True
        if modified == self.hwm[0]:
            return self.at_hwm.get(key) == etag
        return False

    def poll(self) -> Iterator[SourceBatch]:
        """Read new and changed objects in ``(LastModified, key)`` order, resuming a half-read one.

        Raises:
            RetriableError: S3 failed.
            FatalError: a row does not fit the value schema or lacks a key field (names object and row).
        """
        import time

        cfg = self.config
        listed = self._list()
        before = set(self.listed)
        self.listed = {o["Key"]: o for o in listed}
        if before - set(self.listed):
            self._reconcile_due = True  # an object was deleted
        now = time.time()
        complete = True
        for obj in sorted(listed, key=lambda o: (o["LastModified"], o["Key"])):
            key, etag, modified = obj["Key"], obj["ETag"], obj["LastModified"]
            if cfg.min_age_s and now - modified.timestamp() < cfg.min_age_s:
                complete = False
                break  # every later object is younger still
            if self._done(key, etag, modified):
                continue
            skip = 0
            if self.reading and self.reading.get("key") == key and self.reading.get("etag") == etag:
                skip = int(self.reading.get("rows", 0))
            try:
                yield from self._read_object(key, etag, modified, skip)
            except ObjectChanged:
                log.info("source=%s s3://%s/%s changed while being read; next cycle", self.name, cfg.bucket, key)
                complete = False
                break  # the mark must not pass an object not read
        if self.legacy and complete:
            # an old-format position converted: every listed object is read, the mark goes past them all
            for obj in listed:
                mark = (obj["LastModified"], obj["Key"])
                hwm = mark if self.hwm is None or mark > self.hwm else self.hwm
                if self.hwm is None or hwm[0] > self.hwm[0]:
                    self.at_hwm = {}
                self.hwm = hwm
                if obj["LastModified"] == hwm[0]:
                    self.at_hwm[obj["Key"]] = obj["ETag"]
            if self.hwm is not None:  # None when nothing is listed: no mark yet, nothing to keep at it
                modified = self.hwm[0]
                self.at_hwm = {k: e for k, e in self.at_hwm.items() if self.listed[k]["LastModified"] == modified}
            self.legacy = {}
            yield SourceBatch([], self._position())

    def _read_object(self, key: str, etag: str, modified: dt.datetime, skip: int) -> Iterator[SourceBatch]:
        cfg = self.config
        headers = [(OBJECT_HEADER, key.encode())]
        self.reading = {"key": key, "etag": etag, "rows": skip}
        records: list[Any] = []
        keys: set[tuple[Any, ...]] = set()
        n = 0
        for n, row in enumerate(self._rows(key, etag), start=1):
            if n <= skip:
                continue
            record = self._record(row, key, n)
            keys.add(tuple(record[0].values()))
            records.append(record)
            if len(records) >= cfg.batch_records:
                self.reading["rows"] = n
                yield SourceBatch(records, self._position(), headers)
                records = []
        self.read_here[key] = len(keys) if not skip else -1  # -1: not all keys seen here
        self.reading = None
        mark = (modified, key)
        if self.hwm is None or mark > self.hwm:
            if self.hwm is None or modified > self.hwm[0]:
                self.at_hwm = {}
            self.hwm = mark
        if modified == self.hwm[0]:
            self.at_hwm[key] = etag
        if self.reconciled is not None or self.legacy:
            self._reconcile_due = True  # it may have replaced an older version: reconcile its keys
        yield SourceBatch(records, self._position(), headers)
        log.info("source=%s read s3://%s/%s rows=%d etag=%s", self.name, cfg.bucket, key, max(n, skip), etag)

    def _record(self, row: Mapping[str, Any], key: str, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            value = self.coerce(row)
        except CoercionError as exc:
            raise FatalError(f"source {self.name!r}: s3://{self.config.bucket}/{key} row {n}: {exc}") from exc
        k = {f: value[f] for f in self.key_fields}
        if any(v is None for v in k.values()):
            raise FatalError(f"source {self.name!r}: s3://{self.config.bucket}/{key} row {n}: key {k} has a null "
                             "field")
        return k, value

    # -- reconcile --------------------------------------------------------------------------------------

    def wants_reconcile(self) -> bool:
        """After a start, when an object was deleted, and when one was read again (it may have changed)."""
        return self._reconcile_due

    def reconcile(self, state: TopicState) -> Iterator[SourceBatch]:
        """Tombstones for keys a changed object no longer holds, and for every key of a deleted object.

        Deleted: live keys tagged with an object the last listing does not hold.
        Changed: objects read since the last reconciliation (above the
        ``reconciled`` mark) whose tagged live keys may outnumber what they hold
        now are read again and their vanished keys tombstoned. Memory: one
        object's keys (the worker's key set is on disk, read grouped by object).

        Raises:
            RetriableError: S3 failed.
        """
        if not self.listed:
            self.listed = {o["Key"]: o for o in self._list()}
        live = state.live
        if isinstance(live, BoundedLiveKeys):
            groups: Iterator[tuple[str, list[bytes]]] = live.by_tag()  # one object's keys at a time, from disk
        else:
            by_object: dict[str, list[bytes]] = {}
            for kb, tag in live.items():
                if tag is not None:
                    by_object.setdefault(tag, []).append(kb)
            groups = iter(sorted(by_object.items()))
        for key, tagged in groups:
            obj = self.listed.get(key)
            if obj is None:
                gone = tagged if self.config.tombstones_on_delete else []
                yield SourceBatch([(kb, None) for kb in gone], None)
                log.info("source=%s object s3://%s/%s deleted: %d tombstones", self.name, self.config.bucket, key,
                         len(gone))
                continue
            if not self._done(key, obj["ETag"], obj["LastModified"]):
                continue  # not read yet: its turn comes after it is read
            if self.reconciled is not None and (obj["LastModified"], key) <= self.reconciled:
                continue  # not read again since the last reconciliation
            if 0 <= len(tagged) <= self.read_here.get(key, -1):
                continue  # read here whole: every tagged key is one it holds now
            try:
                current = {state.encode_key(k) for k, _v in
                           (self._record(row, key, n) for n, row in enumerate(self._rows(key, obj["ETag"]), 1))}
            except ObjectChanged:
                continue  # changed again: the next cycle re-reads it and comes back here
            gone = [kb for kb in tagged if kb not in current]
            if gone:
                yield SourceBatch([(kb, None) for kb in gone], None)
            log.info("source=%s object s3://%s/%s changed: %d keys gone", self.name, self.config.bucket, key,
                     len(gone))
        self.reconciled = self.hwm
        self._reconcile_due = False
        yield SourceBatch([], self._position())

    def describe_key(self, key: Any) -> str:
        """E.g. ``s3://reference/regions/ key {'region_id': 'EU'}``."""
        return f"{self.where} key {dict(key) if isinstance(key, Mapping) else key!r}"


def _mark(doc: Any) -> tuple[dt.datetime, str] | None:
    """A stored mark ``{"modified": iso, "key": k}`` as ``(datetime, key)``."""
    if not doc:
        return None
    return dt.datetime.fromisoformat(doc["modified"]), doc["key"]


def _mark_json(mark: tuple[dt.datetime, str] | None) -> dict[str, str] | None:
    return None if mark is None else {"modified": mark[0].isoformat(), "key": mark[1]}


