"""Reconciliation of an RDS source: deleted rows become tombstones, rows the topic lacks are emitted again.

The table's keys are streamed and compared (as encoded key bytes) with the live keys of the state topic, so
deletes are found without CDC privileges, and a row the topic lacks (an ``incrementing`` row committed late, a
row with a ``NULL`` timestamp) is read again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError

from connectors.api.source import BoundedLiveKeys, SourceBatch, TopicState, tombstone_batches
from connectors.rds.read_errors import db_reason, read_error
from connectors.rds.source_state import RdsSourceBase
from kernel.exceptions import RetriableError

# the source's log lines keep the logger name they always had
log = logging.getLogger("connectors.rds.source")

_RECONCILE_CHUNK = 1_000


class KeyReconciliation(RdsSourceBase):
    """The table's keys against the topic's live keys (a mixin of ``RdsSource``)."""

    def reconcile(self, state: TopicState) -> Iterator[SourceBatch]:
        """Compare the table's keys with the topic's live keys (as encoded bytes), in bounded memory.

        The table's keys are streamed (server-side cursor) and looked up in
        chunks in the worker's on-disk key set, which marks them seen; the live
        keys never seen are the deleted rows. Memory: one chunk of keys, plus
        the keys of rows the topic lacks (normally none).

        Yields:
            Tombstones for live keys whose row is gone, then the rows the topic lacks.

        Raises:
            RetriableError: the connection failed.
        """
        self._scan_finished = False
        key_sel = select(*self.key_cols)
        try:
            with self.engine.connect() as conn:
                gone_keys, missing = self._compare_keys(conn, key_sel, state)
                yield from tombstone_batches(gone_keys, self.config.batch_records)
                if missing:
                    log.info(
                        "source=%s reconcile: %d row(s) of %s missing from the topic, emitting them",
                        self.name,
                        len(missing),
                        self.where,
                    )
                yield from self._missing_rows(conn, missing)
        except DisconnectionError as exc:
            raise RetriableError(f"source {self.name!r}: reconciling {self.where} failed: {db_reason(exc)}") from exc
        except SQLAlchemyError as exc:
            message = f"source {self.name!r}: reconciling {self.where} failed: {db_reason(exc)}"
            raise read_error(exc, self.engine.dialect.name, message) from exc

    def _compare_keys(
        self, conn: Any, key_sel: Any, state: TopicState
    ) -> tuple[Iterable[bytes], list[tuple[Any, ...]]]:
        """Stream the table's keys (``key_sel``) against the topic's live keys.

        Returns:
            ``(the live keys no row has (encoded), the key values of the rows the topic lacks)``.
        """
        live, encode = state.live, state.encode_key
        # a LiveKeys (the worker's) compares on disk in chunks; a plain dict (tests) in memory
        seen: set[bytes] = set()
        missing: list[tuple[Any, ...]] = []

        def split(rows: list[tuple[Any, ...]], keys: list[bytes]) -> None:
            if isinstance(live, BoundedLiveKeys):
                absent = set(live.split(keys))
                missing.extend(r for r, kb in zip(rows, keys, strict=True) if kb in absent)
                return
            for r, kb in zip(rows, keys, strict=True):
                if kb in live:
                    seen.add(kb)
                else:
                    missing.append(r)

        result = conn.execution_options(stream_results=True, yield_per=10_000).execute(key_sel)
        rows: list[tuple[Any, ...]] = []
        keys: list[bytes] = []
        for row in result:
            rows.append(tuple(row))
            keys.append(encode(self.to_key(row)))
            if len(keys) >= _RECONCILE_CHUNK * 10:
                split(rows, keys)
                rows, keys = [], []
        split(rows, keys)
        result.close()
        conn.rollback()
        gone_keys = live.unseen() if isinstance(live, BoundedLiveKeys) else (kb for kb in live if kb not in seen)
        return gone_keys, missing

    def _missing_rows(self, conn: Any, missing: list[tuple[Any, ...]]) -> Iterator[SourceBatch]:
        """The rows of the keys ``missing`` read again, one batch per chunk (no position: a replay)."""
        for i in range(0, len(missing), _RECONCILE_CHUNK):
            chunk = missing[i : i + _RECONCILE_CHUNK]
            if len(self.key_cols) == 1:
                cond = self.key_cols[0].in_([k[0] for k in chunk])
            else:
                cond = tuple_(*self.key_cols).in_(chunk)
            rows = conn.execute(select(*self.columns).where(cond)).fetchall()
            conn.rollback()
            records = []
            for row in rows:
                v = self.to_value(row)
                if v is not None:
                    records.append(({k: v[k] for k in self.key_fields}, v))
            yield SourceBatch(records, None)
