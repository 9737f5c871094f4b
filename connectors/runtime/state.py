"""The live keys of a compacted state topic (for key-set reconciliation), on disk and kept up to date.

A source without change data capture learns about deletes by comparing the keys
its system holds with the keys it emitted. The keys it emitted are exactly the
live keys of its compacted topic (latest record per key not a tombstone), so
the topic itself is the memory: nothing survives a restart that the topic does
not hold, and a second worker sees the same set.

:class:`LiveKeys` holds that set in a SQLite file (a temporary file of the
worker), not in Python objects: memory stays at SQLite's page cache
(``CACHE_KIB``) whatever the number of keys, and the disk holds about
``len(key) + len(tag) + 30`` bytes per key. The worker keeps one per task and
reads the topic only *from where the previous reconciliation stopped* to the
current end (``read_committed``); the whole topic is read once per process.

A task compares its system's keys in chunks (:meth:`LiveKeys.split` marks the
keys it found as seen) and then streams the keys never seen
(:meth:`LiveKeys.unseen`): a merge of two key streams through an index, in
bounded memory on both sides.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kernel.kafka.committed import high_watermarks, read_committed

log = logging.getLogger(__name__)

CACHE_KIB = 16 * 1024
"""SQLite page cache of one key set, KiB: the memory reconciliation needs, however many keys."""

_CHUNK = 5_000


class LiveKeys:
    """The live keys of one state topic: encoded key bytes -> tag (a header's value, or ``None``).

    Reads like a mapping (``in``, ``len``, iteration, ``items``, ``get``), so a
    task written against a ``dict`` still works, and adds bounded-memory
    comparison: :meth:`split` / :meth:`unseen` and :meth:`by_tag`.

    Args:
        header: the header whose latest value per key is kept as its tag; ``None`` for none.
        directory: where the SQLite file goes (default: the system's temporary directory).
    """

    def __init__(self, header: str | None = None, directory: str | None = None):
        self.header = header
        fd, self.path = tempfile.mkstemp(prefix="threes-live-", suffix=".sqlite", dir=directory)
        os.close(fd)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.executescript(
            f"PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-{CACHE_KIB}; "
            "PRAGMA temp_store=MEMORY;"
            "CREATE TABLE live (k BLOB PRIMARY KEY, tag TEXT, seen INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;"
            "CREATE INDEX live_tag ON live (tag);"
            "CREATE TEMP TABLE probe (k BLOB PRIMARY KEY) WITHOUT ROWID;"
        )
        self.offsets: dict[int, int] = {}

    # -- loading --------------------------------------------------------------------------------------

    def catch_up(self, kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 30.0) -> dict[int, int]:
        """Apply the topic's records from the offsets read last time to its current end (``read_committed``).

        A partition whose end is below the offset read last time (the topic was
        deleted and created again) is read from its start, after its keys are
        forgotten... which means all keys: the set is rebuilt.

        Returns:
            The end offsets read to.

        Raises:
            RetriableError: the end was not reached in time.
            SetupError: the topic does not exist.
        """
        ends = high_watermarks(kafka_config, topic, timeout_s)
        if any(ends.get(p, 0) < off for p, off in self.offsets.items()):
            log.warning("topic=%s is shorter than when last read (recreated?): reading it again whole", topic)
            self._db.execute("DELETE FROM live")
            self.offsets = {}
        starts = {p: self.offsets.get(p, 0) for p in ends}
        db, header = self._db, self.header
        db.execute("BEGIN")
        try:
            for msgs in read_committed(kafka_config, topic, ends, starts, timeout_s):
                upserts: list[tuple[bytes, str | None]] = []
                deletes: list[tuple[bytes]] = []
                for msg in msgs:
                    if msg.value() is None:
                        if upserts:  # keep the order of a key's records within the batch
                            db.executemany("INSERT OR REPLACE INTO live (k, tag) VALUES (?, ?)", upserts)
                            upserts = []
                        deletes.append((msg.key(),))
                        continue
                    if deletes:
                        db.executemany("DELETE FROM live WHERE k = ?", deletes)
                        deletes = []
                    tag = None
                    if header is not None:
                        for name, val in msg.headers() or ():
                            if name == header and val is not None:
                                tag = val.decode()
                    upserts.append((msg.key(), tag))
                if upserts:
                    db.executemany("INSERT OR REPLACE INTO live (k, tag) VALUES (?, ?)", upserts)
                if deletes:
                    db.executemany("DELETE FROM live WHERE k = ?", deletes)
            db.execute("UPDATE live SET seen = 0 WHERE seen <> 0")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.offsets = dict(ends)
        return ends

    # -- mapping-like reads ---------------------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return self._db.execute("SELECT 1 FROM live WHERE k = ?", (key,)).fetchone() is not None

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM live").fetchone()[0])

    def __iter__(self) -> Iterator[bytes]:
        for k, _tag in self.items():
            yield k

    def get(self, key: bytes, default: Any = None) -> Any:
        """The tag of ``key`` (``default`` when the key is not live)."""
        row = self._db.execute("SELECT tag FROM live WHERE k = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def items(self) -> Iterator[tuple[bytes, str | None]]:
        """``(key, tag)`` of every live key, in key order, streamed in chunks."""
        yield from self._scan("SELECT k, tag FROM live WHERE k > ? ORDER BY k LIMIT ?")

    def _scan(self, sql: str) -> Iterator[Any]:
        last = b""
        while True:
            rows = self._db.execute(sql, (last, _CHUNK)).fetchall()
            yield from rows
            if len(rows) < _CHUNK:
                return
            last = rows[-1][0]

    # -- bounded-memory comparison --------------------------------------------------------------------

    def split(self, keys: Iterable[bytes]) -> list[bytes]:
        """Mark the live ones among ``keys`` as seen; return the others (keys the topic lacks), in input order.

        Call it with chunks of the system's keys (thousands), then :meth:`unseen`.
        """
        chunk = list(keys)
        if not chunk:
            return []
        db = self._db
        db.execute("BEGIN")  # one transaction per chunk: SQLite's autocommit syncs per statement
        try:
            db.execute("DELETE FROM probe")
            db.executemany("INSERT OR IGNORE INTO probe VALUES (?)", ((k,) for k in chunk))
            found = {r[0] for r in db.execute("UPDATE live SET seen = 1 WHERE k IN (SELECT k FROM probe) RETURNING k")}
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return [k for k in chunk if k not in found]

    def unseen(self) -> Iterator[bytes]:
        """Live keys no :meth:`split` call marked as seen (their entity is gone), in key order, streamed."""
        for k, _seen in self._scan("SELECT k, seen FROM live WHERE k > ? ORDER BY k LIMIT ?"):
            if not _seen:
                yield k

    def by_tag(self) -> Iterator[tuple[str, list[bytes]]]:
        """``(tag, keys)`` per tag (keys without a tag left out), in tag order; one tag's keys at a time."""
        current: str | None = None
        group: list[bytes] = []
        for k, tag in self._db.execute("SELECT k, tag FROM live WHERE tag IS NOT NULL ORDER BY tag"):
            if tag != current and group:
                yield current, group  # type: ignore[misc]
                group = []
            current = tag
            group.append(k)
        if group:
            yield current, group  # type: ignore[misc]

    def close(self) -> None:
        """Close and delete the SQLite file."""
        self._db.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def live_keys(
    kafka_config: Mapping[str, Any],
    topic: str,
    header: str | None = None,
    timeout_s: float = 30.0,
) -> tuple[LiveKeys, dict[int, int]]:
    """Read ``topic`` from its start to its current end into a new :class:`LiveKeys` (close it when done).

    Args:
        kafka_config: librdkafka properties.
        topic: the compacted state topic.
        header: a header whose latest value per key is kept as the key's tag (UTF-8), e.g. the S3 object a row
            came from; ``None`` for none.
        timeout_s: the longest wait without progress, seconds.

    Returns:
        ``(live, ends)``: the live keys and the end offsets read to.

    Raises:
        RetriableError: the end was not reached in time (the broker is slow or away).
    """
    live = LiveKeys(header)
    try:
        ends = live.catch_up(kafka_config, topic, timeout_s)
    except BaseException:
        live.close()
        raise
    log.debug("read live keys topic=%s keys=%d ends=%s", topic, len(live), ends)
    return live, ends
