"""Decode a job's messages for one sink: keys and headers per record, values in columns per writer schema.

Keys, headers and fingerprints are read per record (in columns when every message has the
common shape); values are decoded in columns, one Arrow table per writer schema
(:mod:`schemas.columnar`), and fastavro decodes a value only when a sink asks for it as a
dict. A message that does not decode becomes a dead letter (stage ``decode``) of the job.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from typing import Any

from connectors.api.sink_records import SinkBatch, SinkRecord, records_from_columns
from kernel.exceptions import SkippableRecordError
from kernel.updates import _INT64, SOURCE_TS_HEADER, VERSION_HEADER, version_of
from schemas.columnar import ColumnarDecodeError, ColumnarDecoder
from schemas.exceptions import SerdeError
from schemas.serde import HEADER_BYTES, MARKER, split
from sync_service.batching import RECORD_OVERHEAD_BYTES, Job

log = logging.getLogger(__name__)

_NO_SOURCE_TS = 2**63 - 1


def _encoded(record: SinkRecord) -> bytes:
    """The record's value as consumed (only upserts are decoded: theirs is never ``None``)."""
    assert record.encoded is not None
    return record.encoded


def _versions_and_headers(
    header_lists: list[list[tuple[str, bytes]]],
) -> tuple[list[bytes], list[dict[str, Any]]] | None:
    """Each message's 8-byte ``version`` header, and its headers as a dict when there are others.

    Returns:
        ``(versions, headers)``: ``headers`` is empty in the common shape (the version header
        alone); ``None`` when a message is off the shape: a header name twice (the per-message
        path keeps the first version header), no version header, or one of another length.
    """
    headers: list[dict[str, Any]] = []
    if set(map(len, header_lists)) == {1} and {h[0][0] for h in header_lists} == {VERSION_HEADER}:
        versions: list[Any] = [h[0][1] for h in header_lists]  # the common shape: the version header alone
    else:
        headers = [dict(h) for h in header_lists]
        if sum(map(len, headers)) != sum(map(len, header_lists)):
            return None
        versions = [h.get(VERSION_HEADER) for h in headers]
    try:
        if set(map(len, versions)) != {8}:
            return None
    except TypeError:  # a message without a version header (or with a null one)
        return None
    return versions, headers


class JobDecoder:
    """Decodes the jobs of one sink.

    Args:
        sink_name: the sink's name, for logs.
        topics: the sink's topics.
        deserializer: decodes keys and values (``AvroDeserializer``).
        columnar: the columnar value decoder (shared by the service's writers).

    Attributes:
        decode_dlq_topics: the topics whose undecodable records this sink dead-letters: when
            several sinks read a topic, one of them does, so each bad record reaches the dead
            letter topic once (the service removes the others' topics).
    """

    def __init__(self, sink_name: str, topics: Iterable[str], deserializer: Any, columnar: ColumnarDecoder):
        self.sink_name = sink_name
        self.deserializer = deserializer
        self.columnar = columnar
        self.decode_dlq_topics: set[str] = set(topics)

    def decode(self, job: Job) -> SinkBatch:
        """Decode the job's messages; undecodable ones join ``job.dead`` (stage ``decode``).

        Keys, headers and fingerprints are read per record; values are decoded in
        columns, one Arrow table per writer schema (:mod:`schemas.columnar`), and
        fastavro decodes a value only when a sink asks for it as a dict. A block
        that does not decode as a whole is decoded record by record to find the
        bad bodies (dead letters); the others are decoded in columns again.

        Returns:
            The batch of decodable records, with ``tables`` holding the columnar values.
        """
        batch = SinkBatch(job.topic, job.partition, job.first_offset, job.last_offset)
        batch.records, by_schema = self._decode_heads(job)
        bad: list[tuple[SinkRecord, BaseException]] = []
        for fp, records in by_schema.items():
            bad += self._decode_values(batch, fp, records)
        if bad:
            by_offset = {m.offset(): m for m in job.raw}
            dropped = set()
            for record, error in bad:
                dropped.add(record.offset)
                self._skip(job, by_offset[record.offset], error)
            batch.records = [r for r in batch.records if r.offset not in dropped]
        return batch

    def _skip(self, job: Job, msg: Any, exc: BaseException) -> None:
        if msg.topic() in self.decode_dlq_topics:
            job.dead.append((msg, exc, "decode"))
        else:
            log.debug("sink=%s skips %s (dead-lettered by another sink of the topic)", self.sink_name, exc)

    def _decode_values(
        self, batch: SinkBatch, fp: bytes, records: list[SinkRecord]
    ) -> list[tuple[SinkRecord, BaseException]]:
        """Decode the values of one writer schema; returns the records whose body does not decode, with why."""
        if self.columnar.supports(fp):
            try:
                table = self.columnar.decode(fp, [_encoded(r)[HEADER_BYTES:] for r in records])
            except ColumnarDecodeError as exc:
                log.warning("sink=%s topic=%s partition=%d: %s; decoding that block record by record",
                            self.sink_name, batch.topic, batch.partition, exc)
                bad = self._decode_each(fp, records)
                failed = {id(r) for r, _error in bad}
                records = [r for r in records if id(r) not in failed]
                try:
                    table = self.columnar.decode(fp, [_encoded(r)[HEADER_BYTES:] for r in records])
                except ColumnarDecodeError:
                    return bad  # the rest keep the values fastavro decoded
            else:
                bad = []
            for i, record in enumerate(records):
                record.row = i
            batch.tables[fp] = table
            return bad
        return self._decode_each(fp, records)

    @staticmethod
    def _decode_each(fp: bytes | None, records: list[SinkRecord]) -> list[tuple[SinkRecord, BaseException]]:
        """fastavro, one record at a time (the exact per-record path); returns the undecodable ones, with why."""
        bad: list[tuple[SinkRecord, BaseException]] = []
        for record in records:
            try:
                value = record.value
            except Exception as exc:  # fastavro raises many kinds; the dead letter names it
                schema = fp.hex() if fp is not None else "?"
                bad.append((record, SerdeError(f"{record.where()}: cannot decode Avro body with writer schema "
                                               f"{schema}: {exc}")))
                continue
            if not isinstance(value, dict):
                bad.append((record, SkippableRecordError(
                    f"{record.where()}: value is Avro {type(value).__name__}, a record is expected"
                )))
        return bad

    def _decode_heads(self, job: Job) -> tuple[list[SinkRecord], dict[bytes, list[SinkRecord]]]:
        """The records of a job with keys, versions and value fingerprints decoded; values stay Avro.

        A job of well-formed update records (every key and value single-object
        encoded, one key writer schema, one 8-byte ``version`` header each, no header
        name twice) is read in columns (:meth:`_decode_heads_columns`); any other job
        message by message (:meth:`_decode_heads_each`), which names what is wrong
        with a message and dead-letters it. Both give the same records.

        Returns:
            ``(records in offset order, value fingerprint -> its upserts)``.
        """
        heads = self._decode_heads_columns(job)
        if heads is None:
            records = self._decode_heads_each(job)
            groups: dict[bytes, list[SinkRecord]] = {}
            for record in records:
                if record.encoded is not None and record.value_fingerprint is not None:
                    groups.setdefault(record.value_fingerprint, []).append(record)
            return records, groups
        return heads

    def _decode_heads_columns(self, job: Job) -> tuple[list[SinkRecord], dict[bytes, list[SinkRecord]]] | None:
        """:meth:`_decode_heads` for a job of well-formed messages, in columns.

        A few list comprehensions per job and one C call per column (versions and
        source timestamps unpacked in one ``struct`` call), no Python statement per message.

        Returns:
            As :meth:`_decode_heads`; ``None`` when a message is off the common shape.
        """
        raw = job.raw
        if not raw:
            return [], {}
        keys = [m.key() for m in raw]
        values = [m.value() for m in raw]
        found = _versions_and_headers([m.headers() or [] for m in raw])
        if found is None:
            return None
        versions_raw, headers = found
        key_head = _single_key_head(keys)
        if key_head is None:
            return None
        value_heads = [v[:HEADER_BYTES] if v is not None else None for v in values]
        schemas = self._value_schemas(value_heads)
        if schemas is None:
            return None
        try:
            decoded_keys = self.columnar.decode_objects(key_head[2:], [k[HEADER_BYTES:] for k in keys])
        except (ColumnarDecodeError, SkippableRecordError):
            decoded_keys = None
        n = len(raw)
        if decoded_keys is None or len(decoded_keys) != n:
            return None  # the per-message path decodes the keys with fastavro and names a bad one
        versions = struct.unpack(f">{n}q", b"".join(versions_raw))
        job.oldest_source_ts_ms = _oldest_source_ts_ms(headers)
        fingerprints: dict[bytes | None, bytes | None] = {h: (h[2:] if h is not None else None) for h in schemas}
        sizes = [RECORD_OVERHEAD_BYTES + len(k) + (len(v) if v is not None else 0)
                 for k, v in zip(keys, values, strict=True)]
        records = records_from_columns(
            job.topic, job.partition, [m.offset() for m in raw], decoded_keys, versions,
            [m.timestamp()[1] for m in raw], sizes, map(schemas.__getitem__, value_heads),
            map(fingerprints.__getitem__, value_heads), values,
        )
        groups: dict[bytes, list[SinkRecord]] = {}
        if len(schemas) == 2:  # one writer schema: its upserts are the records with a value
            (head,) = (h for h in schemas if h is not None)
            groups[head[2:]] = [r for r in records if r.encoded is not None]
        else:
            for record in records:
                if record.encoded is not None and record.value_fingerprint is not None:
                    groups.setdefault(record.value_fingerprint, []).append(record)
        return records, groups

    def _value_schemas(self, value_heads: list[bytes | None]) -> dict[bytes | None, Any] | None:
        """Single-object header -> writer schema (``None`` -> ``None``: tombstones); ``None`` when one is off shape.

        A head that is not a single-object header, or names a writer schema the store does not
        know, sends the job down the per-message path, which names the record.
        """
        schemas: dict[bytes | None, Any] = {None: None}
        for head in set(value_heads):
            if head is None:
                continue
            if len(head) != HEADER_BYTES or head[:2] != MARKER:
                return None
            try:
                schemas[head] = self.deserializer.resolver.get(head[2:])
            except SkippableRecordError:
                return None
        return schemas

    def _decode_heads_each(self, job: Job) -> list[SinkRecord]:
        """The records of a job decoded message by message; values stay Avro (the exact path).

        The common case costs a few attribute reads per message: keys are decoded in
        columns per key writer schema (:meth:`ColumnarDecoder.decode_objects`), writer
        schemas are resolved once per batch. A message off that path (no key, no or a
        bad ``version`` header, no single-object header, an unknown schema, a key
        block that does not decode) goes through :meth:`_decode_head`, which names the
        problem, and to the dead letter topic.
        """
        resolver = self.deserializer.resolver
        schemas: dict[bytes, Any] = {}
        records: list[SinkRecord] = []
        slow: list[Any] = []  # messages for _decode_head, with their place in records
        keys: dict[bytes, list[tuple[int, Any]]] = {}  # key fingerprint -> (index in records, body)
        oldest_source_ts = _NO_SOURCE_TS  # the batch's oldest threes.source_ts header, epoch ms
        for msg in job.raw:
            key, value, headers = msg.key(), msg.value(), msg.headers()
            version = None
            size = RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
            for name, hvalue in headers or ():
                if version is None and name == VERSION_HEADER and hvalue is not None and len(hvalue) == 8:
                    version = _INT64.unpack(hvalue)[0]
                elif name == SOURCE_TS_HEADER and hvalue is not None and len(hvalue) == 8:
                    source_ts = _INT64.unpack(hvalue)[0]
                    if source_ts < oldest_source_ts:
                        oldest_source_ts = source_ts
            if (
                version is None
                or key is None
                or len(key) < HEADER_BYTES
                or key[:2] != MARKER
                or (value is not None and (len(value) < HEADER_BYTES or value[:2] != MARKER))
            ):
                slow.append((len(records), msg))
                records.append(None)  # type: ignore[arg-type]  # filled below
                continue
            fp = schema = None
            if value is not None:
                fp = value[2:HEADER_BYTES]
                schema = schemas.get(fp)
                if schema is None:
                    try:
                        schema = schemas[fp] = resolver.get(fp)
                    except SkippableRecordError:
                        slow.append((len(records), msg))
                        records.append(None)  # type: ignore[arg-type]
                        continue
            keys.setdefault(key[2:HEADER_BYTES], []).append((len(records), memoryview(key)[HEADER_BYTES:]))
            records.append(SinkRecord(msg.topic(), msg.partition(), msg.offset(), None, None, version,
                                      msg.timestamp()[1], size, schema, fp, encoded=value))
        self._decode_keys(job, records, keys, slow)
        job.oldest_source_ts_ms = oldest_source_ts if oldest_source_ts != _NO_SOURCE_TS else None
        return self._decode_slow(job, records, slow)

    def _decode_keys(self, job: Job, records: list[SinkRecord], keys: dict[bytes, list[tuple[int, Any]]],
                     slow: list[Any]) -> None:
        """Decode the keys in columns, one call per key writer schema; a block that fails goes to ``slow``."""
        for key_fp, entries in keys.items():
            try:
                decoded = self.columnar.decode_objects(key_fp, [body for _i, body in entries])
            except (ColumnarDecodeError, SkippableRecordError):
                decoded = None
            if decoded is None:  # per record: the exact fastavro path, and the errors it names
                slow.extend((i, job.raw[i]) for i, _body in entries)
                continue
            for (i, _body), value in zip(entries, decoded, strict=True):
                records[i].key = value

    def _decode_slow(self, job: Job, records: list[SinkRecord], slow: list[Any]) -> list[SinkRecord]:
        """Decode the messages off the common path one by one (:meth:`_decode_head`); the bad ones are skipped."""
        failed: set[int] = set()
        for i, msg in slow:
            try:
                records[i] = self._decode_head(msg)
            except SkippableRecordError as exc:
                self._skip(job, msg, exc)
                failed.add(i)
        return [r for i, r in enumerate(records) if i not in failed]

    def _decode_head(self, msg: Any) -> SinkRecord:
        """Decode a message's key, version header and value fingerprint; the value stays an Avro body.

        Raises:
            SkippableRecordError: the key is not decodable Avro, the value has no
                single-object header or an unknown writer schema, or the
                ``version`` header is missing or malformed; the message names the record.
        """
        where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
        try:
            version = version_of(msg.headers())
        except ValueError as exc:
            raise SkippableRecordError(f"{where}: {exc}") from exc
        if version is None:
            raise SkippableRecordError(f"{where}: no 'version' header (update-topic contract, kernel/updates.py)")
        if msg.key() is None:
            raise SkippableRecordError(f"{where}: no key (update records are keyed by the target key)")
        # serde errors propagate as they are: their class names the problem in the dead letter
        key = self.deserializer(msg.key())
        raw_value = msg.value()
        schema = fp = None
        if raw_value is not None:
            fp, _body = split(raw_value)
            schema = self.deserializer.resolver.get(fp)
        return SinkRecord(
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            key=key,
            value=None,
            version=version,
            timestamp_ms=msg.timestamp()[1],
            size_bytes=RECORD_OVERHEAD_BYTES + len(msg.key()) + len(raw_value or b""),
            value_schema=schema,
            value_fingerprint=fp,
            encoded=raw_value,
        )

    def decode_one(self, msg: Any) -> SinkRecord:
        """Decode one message into a :class:`SinkRecord`, its value as a dict (the per-record path).

        Raises:
            SkippableRecordError: the key or value is not decodable Avro, or the
                ``version`` header is missing or malformed; the message names the record.
        """
        record = self._decode_head(msg)
        if record.encoded is not None:
            bad = self._decode_each(record.value_fingerprint, [record])
            if bad:
                raise bad[0][1]
        return record


def _single_key_head(keys: list[Any]) -> bytes | None:
    """The single-object header all ``keys`` share; ``None`` when one is missing or off shape, or they differ."""
    try:
        key_heads = {k[:HEADER_BYTES] for k in keys}
    except TypeError:  # a message without a key
        return None
    if len(key_heads) != 1:
        return None  # key schemas changed within the batch: per message
    (key_head,) = key_heads
    if len(key_head) != HEADER_BYTES or key_head[:2] != MARKER:
        return None
    return bytes(key_head)


def _oldest_source_ts_ms(headers: list[dict[str, bytes]]) -> int | None:
    """The oldest ``threes.source_ts`` of the messages' headers (epoch ms); ``None`` when none carries one."""
    source_ts = [ts for ts in (h.get(SOURCE_TS_HEADER) for h in headers) if ts is not None and len(ts) == 8]
    return min(struct.unpack(f">{len(source_ts)}q", b"".join(source_ts))) if source_ts else None
