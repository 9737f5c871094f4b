"""A parser of PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

The message formats are PostgreSQL's "Logical Replication Message Formats"
(https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html):
every integer is big-endian, every string NUL-terminated, column values are in
their text form (``t``), SQL ``NULL`` (``n``) or "unchanged TOASTed value"
(``u``, sent for an update that left a large value alone unless the table has
``REPLICA IDENTITY FULL``). Only what :mod:`connectors.rds.cdc` needs is kept:
transactions (begin, commit), relations (names, column names and type OIDs,
key flags) and row changes (insert, update, delete, truncate). Origin, type and
message records are parsed and ignored.
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass
from typing import Any

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
"""PostgreSQL timestamps on the wire count microseconds from here."""
_PG_EPOCH_MS = int(PG_EPOCH.timestamp() * 1000)

UNCHANGED = object()
"""A column value that the server did not send (unchanged TOASTed value, ``u``)."""

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")


class ProtocolError(ValueError):
    """A message that does not follow the pgoutput format."""


@dataclass(frozen=True)
class Begin:
    """``B``: a transaction starts; ``final_lsn`` is its commit record's LSN, ``commit_ts_ms`` epoch ms."""

    final_lsn: int
    commit_ts_ms: int
    xid: int


@dataclass(frozen=True)
class Commit:
    """``C``: the transaction committed; ``end_lsn`` (just past the commit record) is where to resume after it."""

    commit_lsn: int
    end_lsn: int
    commit_ts_ms: int


@dataclass(frozen=True)
class Relation:
    """``R``: a table's shape, sent before its first change in a session and after every ``ALTER``.

    Attributes:
        relid: the table's OID.
        namespace: its schema (``pg_catalog`` is sent as an empty string).
        name: its name.
        replica_identity: ``d`` default (primary key), ``n`` nothing, ``f`` full, ``i`` index.
        columns: ``(name, type_oid, is_key)`` per column, in the order of the tuples.
    """

    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[tuple[str, int, bool], ...]


@dataclass(frozen=True)
class Change:
    """``I``/``U``/``D``: one row change.

    Attributes:
        op: ``insert``, ``update`` or ``delete``.
        relid: the table's OID.
        new: the new row's values (text bytes, ``None`` for NULL, :data:`UNCHANGED`), or ``None`` for a delete.
        old: the old row (``O``, with ``REPLICA IDENTITY FULL``) or its key columns only (``K``, other
            columns ``None``), or ``None`` when the server sent neither.
        old_is_key: ``old`` holds only the replica identity's columns.
    """

    op: str
    relid: int
    new: tuple[Any, ...] | None
    old: tuple[Any, ...] | None
    old_is_key: bool


@dataclass(frozen=True)
class Truncate:
    """``T``: the tables were truncated."""

    relids: tuple[int, ...]


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def take(self, st: struct.Struct) -> int:
        try:
            (v,) = st.unpack_from(self.buf, self.pos)
        except struct.error as exc:
            raise ProtocolError(f"message ends early at byte {self.pos}") from exc
        self.pos += st.size
        return v

    def byte(self) -> str:
        if self.pos >= len(self.buf):
            raise ProtocolError(f"message ends early at byte {self.pos}")
        c = chr(self.buf[self.pos])
        self.pos += 1
        return c

    def string(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError("unterminated string")
        s = self.buf[self.pos : end].decode()
        self.pos = end + 1
        return s

    def tuple_data(self) -> tuple[Any, ...]:
        n = self.take(_I16)
        values: list[Any] = []
        for _ in range(n):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind in ("t", "b"):
                size = self.take(_I32)
                values.append(bytes(self.buf[self.pos : self.pos + size]))
                self.pos += size
            else:
                raise ProtocolError(f"unknown tuple value kind {kind!r}")
        return tuple(values)


def ts_ms(pg_micros: int) -> int:
    """A PostgreSQL wire timestamp (µs since 2000-01-01 UTC) as epoch milliseconds."""
    return _PG_EPOCH_MS + pg_micros // 1000


def parse(payload: bytes) -> Begin | Commit | Relation | Change | Truncate | None:
    """One pgoutput message.

    Args:
        payload: the message bytes (a ``XLogData`` payload).

    Returns:
        The parsed message, or ``None`` for kinds the CDC source ignores (origin, type, logical message).

    Raises:
        ProtocolError: a malformed or unknown message.
    """
    r = _Reader(payload)
    kind = r.byte()
    if kind == "B":
        lsn = r.take(_U64)
        return Begin(lsn, ts_ms(r.take(_I64)), r.take(_U32))
    if kind == "C":
        r.take(_I8)
        commit_lsn = r.take(_U64)
        end_lsn = r.take(_U64)
        return Commit(commit_lsn, end_lsn, ts_ms(r.take(_I64)))
    if kind == "R":
        return _relation(r)
    if kind == "I":
        relid = r.take(_U32)
        if r.byte() != "N":
            raise ProtocolError("insert without a new tuple")
        return Change("insert", relid, r.tuple_data(), None, False)
    if kind == "U":
        return _update(r)
    if kind == "D":
        relid = r.take(_U32)
        tag = r.byte()
        if tag not in ("K", "O"):
            raise ProtocolError("delete without an old tuple")
        return Change("delete", relid, None, r.tuple_data(), tag == "K")
    if kind == "T":
        n = r.take(_I32)
        r.take(_I8)
        return Truncate(tuple(r.take(_U32) for _ in range(n)))
    if kind in ("O", "Y", "M"):
        return None
    raise ProtocolError(f"unknown pgoutput message kind {kind!r}")


def _relation(r: _Reader) -> Relation:
    """The body of a Relation message (``R``): the table's name, replica identity and columns."""
    relid = r.take(_U32)
    namespace = r.string()
    name = r.string()
    ident = chr(r.take(_I8) & 0xFF)
    cols = []
    for _ in range(r.take(_I16)):
        flags = r.take(_I8)
        col = r.string()
        oid = r.take(_U32)
        r.take(_I32)  # typmod
        cols.append((col, oid, bool(flags & 1)))
    return Relation(relid, namespace or "pg_catalog", name, ident, tuple(cols))


def _update(r: _Reader) -> Change:
    """The body of an Update message (``U``): the new tuple, after the old one or its key when sent."""
    relid = r.take(_U32)
    tag = r.byte()
    old = None
    old_is_key = False
    if tag in ("K", "O"):
        old = r.tuple_data()
        old_is_key = tag == "K"
        tag = r.byte()
    if tag != "N":
        raise ProtocolError("update without a new tuple")
    return Change("update", relid, r.tuple_data(), old, old_is_key)


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL prints it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_int(text: str) -> int:
    """``16/B374D848`` as an integer.

    Raises:
        ValueError: not an LSN.
    """
    hi, sep, lo = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)
