"""The update-topic contract between the stream job and the sync service.

An *update record* on an ``updates.<target>`` topic:

* **key**: the target key, Avro (single-object encoding, :mod:`schemas.serde`);
  a composite key is an Avro record.
* **value**: the new row/document, Avro; ``null`` deletes the key (a tombstone).
* **header** ``version``: a monotonic version per key (source commit time, LSN,
  event time in microseconds...) as an 8-byte **big-endian signed int64**.

Every sink applies an update only when its version is newer than the one the
target holds (SQL conditional upsert, Elasticsearch ``version_type=external``,
S3 deterministic object names), so replays and duplicates are harmless. One
contract, the same meaning in RDS, Elasticsearch and S3.

* **header** ``threes.source_ts`` (optional): when the change was committed in
  (or, when the source cannot tell, read from) the system of record, epoch
  milliseconds as an 8-byte big-endian int64. Sources put it on every state
  record, the stream job carries the event's to its update records, and the
  sync service measures source commit -> sink durable freshness from it.

In Spark the header value is ``unhex(lpad(hex(version), 16, '0'))`` (``hex`` of
a long is its two's complement, so this holds for negative versions too).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

VERSION_HEADER = "version"
SOURCE_TS_HEADER = "threes.source_ts"
_INT64 = struct.Struct(">q")


def with_source_ts(
    headers: list[tuple[str, bytes]] | None, source_ts_ms: int
) -> list[tuple[str, bytes]]:
    """Headers with a ``threes.source_ts`` header added (kept as is when one is there already).

    Args:
        headers: the record's headers, or ``None``.
        source_ts_ms: the source commit (or read) time, epoch milliseconds.

    Returns:
        A new list (the input is not changed).
    """
    out = list(headers or ())
    if not any(k == SOURCE_TS_HEADER for k, _v in out):
        out.append((SOURCE_TS_HEADER, _INT64.pack(int(source_ts_ms))))
    return out


def source_ts_of(headers: Iterable[tuple[str, bytes | None]] | None) -> int | None:
    """The ``threes.source_ts`` header of a consumed record, epoch ms; ``None`` when absent or malformed."""
    for key, value in headers or ():
        if key == SOURCE_TS_HEADER and value is not None and len(value) == 8:
            return int(_INT64.unpack(value)[0])
    return None


def encode_version(version: int) -> bytes:
    """Encode a version for the ``version`` header.

    Args:
        version: a signed 64-bit integer.

    Returns:
        8 bytes, big-endian.

    Raises:
        OverflowError: outside the int64 range.
    """
    try:
        return _INT64.pack(version)
    except struct.error as exc:
        raise OverflowError(f"version {version} does not fit a signed int64") from exc


def decode_version(value: bytes) -> int:
    """Decode a ``version`` header value.

    Raises:
        ValueError: not exactly 8 bytes.
    """
    if len(value) != 8:
        raise ValueError(f"version header must be 8 bytes (big-endian int64), got {len(value)}")
    return int(_INT64.unpack(value)[0])


def version_of(headers: Iterable[tuple[str, bytes | None]] | None) -> int | None:
    """Find and decode the ``version`` header of a consumed record.

    Args:
        headers: ``Message.headers()`` of confluent-kafka (list of ``(key, value)``) or ``None``.

    Returns:
        The version, or ``None`` when the record has no ``version`` header.

    Raises:
        ValueError: the header is present but malformed.
    """
    for key, value in headers or ():
        if key == VERSION_HEADER and value is not None:
            return decode_version(value)
    return None
