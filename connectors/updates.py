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

In Spark the header value is ``unhex(lpad(hex(version), 16, '0'))`` (``hex`` of
a long is its two's complement, so this holds for negative versions too).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

VERSION_HEADER = "version"
_INT64 = struct.Struct(">q")


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
    return _INT64.unpack(value)[0]


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
