"""``IcebergSink``: update topics into an Apache Iceberg table through pyiceberg, exactly once per record."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pyarrow as pa

from connectors.api.sink import Sink
from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord, latest_per_key
from connectors.iceberg import table_schema
from connectors.iceberg.config import IcebergSinkConfig
from connectors.iceberg.connection import IcebergConnection, load_catalog, storage_client
from connectors.iceberg.offsets import offset_of, offsets_property, recorded_offsets, with_offset, without_rebase
from connectors.iceberg.rows import (
    KeyTuple,
    key_filter,
    key_tuple,
    match_columns,
    match_tuple,
    value_tables,
    versions_of,
)
from connectors.iceberg.tombstones import Decision, Tombstones, decide
from kernel.exceptions import BatchRefusedError, FatalError, SetupError, SinkBackpressureError, SinkBlockedError
from kernel.redact import redact

log = logging.getLogger(__name__)


class IcebergSink(Sink):
    """Write update topics into an Iceberg table: one catalog commit per batch, Kafka offsets in the snapshot.

    Delivery guarantee: exactly once per record in the table. Each commit records, in its
    snapshot's summary (``threes.kafka.offsets.<sink name>``), the last offset of every
    partition the table holds (:mod:`connectors.iceberg.offsets`); a batch first drops its
    records at or below its partition's offset there. A process killed between the Iceberg
    commit and the Kafka offset commit re-reads records the table already holds, and skips them.

    ``mode: upsert``: per key, the batch's newest update (:func:`latest_per_key`) is applied
    when its version is greater than the row's ``version_column``; the rows of the keys it
    replaces or deletes are removed with a copy-on-write delete (pyiceberg rewrites the data
    files holding them) and the new rows appended, both in one transaction (one catalog commit,
    two snapshots). pyiceberg 0.12 writes no merge-on-read (positional or equality) delete files.
    A tombstone removes its row, and its key and version go to the tombstone table
    (``<table>__deleted``, :mod:`connectors.iceberg.tombstones`), so an update older than a
    delete never brings the row back.
    ``mode: append``: every upsert is a new row, tombstones are skipped.

    Concurrency: commits to the table are serialised in the process; another writer's commit
    (a second replica after a rebalance, a compaction) makes ours fail with
    ``CommitFailedException``; the table is then refreshed, the batch's offsets and versions
    checked again and the commit made again, up to ``commit_retries`` times (then backpressure).

    Backpressure: a catalog or storage that cannot be reached blocks the sink (``SinkBlockedError``):
    its partitions pause and the batch is written again after a backoff, without bound; no
    record is dead-lettered. So does a writer schema the table cannot hold exactly
    (:mod:`connectors.iceberg.table_schema`).

    YAML: see :class:`~connectors.iceberg.config.IcebergSinkConfig`.
    """

    config: IcebergSinkConfig
    connection: IcebergConnection

    def __init__(self, config: Any, connection: Any, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.catalog: Any = None
        self.table: Any = None  # the pyiceberg Table, None until it exists
        self.tombstones: Tombstones | None = None
        self._lock = threading.Lock()
        self._prop = offsets_property(self.name)
        self._match = match_columns(self.config.key, self.config.composite_key_column)

    # -- life cycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Load the catalog and the table (created from the first batch when missing); create the bucket if told.

        Raises:
            SinkBlockedError: the catalog or the storage cannot be reached.
            FatalError: the table is missing and ``create_table`` is off.
        """
        from pyiceberg.exceptions import NoSuchTableError

        try:
            if self.connection.create_bucket:
                self._create_bucket()
            self.catalog = load_catalog(self.connection)
            try:
                self.table = self.catalog.load_table(self.config.table)
            except NoSuchTableError:
                if not self.config.create_table:
                    raise FatalError(
                        f"sink {self.name!r}: Iceberg table {self.config.table!r} does not exist "
                        "(create it, or set create_table: true)"
                    ) from None
                self.table = None
            if self.config.mode == "upsert":
                self.tombstones = Tombstones(
                    self.catalog, self.config.tombstone_table_name, self._match, self.config.version_column
                )
                self.tombstones.load()
        except (FatalError, SinkBlockedError):
            raise
        except Exception as exc:
            raise self._unreachable(exc) from exc

    def _create_bucket(self) -> None:
        client = storage_client(self.connection)
        try:
            client.head_bucket(Bucket=self.connection.bucket)
        except Exception:  # missing (or unreadable: create_bucket then says why)
            client.create_bucket(Bucket=self.connection.bucket)

    def check(self) -> None:
        """List the catalog's namespaces.

        Raises:
            SetupError: the catalog does not answer or refuses our credentials.
        """
        try:
            (self.catalog or load_catalog(self.connection)).list_namespaces()
        except Exception as exc:
            raise SetupError(str(self._unreachable(exc)), f"check connections.{self.config.connection}") from exc

    def close(self) -> None:
        """Drop the catalog (its SQLAlchemy engine's connections) and the table."""
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
        self.catalog = self.table = self.tombstones = None

    def _unreachable(self, exc: BaseException) -> SinkBlockedError:
        text = redact(f"{type(exc).__name__}: {exc}").splitlines()[0][:500] if str(exc) else type(exc).__name__
        return SinkBlockedError(f"sink {self.name!r}: Iceberg catalog or storage not usable: {text}")

    # -- write --------------------------------------------------------------------------------------

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        """Apply the batch in one Iceberg commit that also records its offsets; skip what the table holds.

        Returns:
            Always empty: a batch is applied whole or not at all.

        Raises:
            SinkBlockedError: the catalog or storage cannot be reached, the table is gone, or the
                writer schema cannot be held exactly (the error names the column).
            SinkBackpressureError: other writers overtook ``commit_retries`` commits in a row.
            BatchRefusedError: a value its column cannot hold exactly (the runtime bisects).
        """
        from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
        from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

        if self.catalog is None:
            self.open()
        retrying = Retrying(
            stop=stop_after_attempt(self.config.commit_retries),
            wait=wait_random_exponential(multiplier=0.05, max=2.0),
            retry=retry_if_exception_type(CommitFailedException),
            before_sleep=self._before_retry,
            reraise=True,
        )
        with self._lock:
            try:
                for attempt in retrying:
                    with attempt:
                        self._write_once(batch)
            except CommitFailedException as exc:
                raise SinkBackpressureError(
                    1.0, f"sink {self.name!r}: commits overtaken {self.config.commit_retries} times in a row: {exc}"
                ) from exc
            except table_schema.SchemaRefused as exc:
                raise SinkBlockedError(f"sink {self.name!r}: table {self.config.table}: {exc}") from exc
            except NoSuchTableError as exc:
                self.table = None
                raise SinkBlockedError(f"sink {self.name!r}: table {self.config.table} is gone: {exc}") from exc
            except (pa.ArrowInvalid, OverflowError) as exc:
                raise BatchRefusedError(f"sink {self.name!r}: a value its column cannot hold exactly: {exc}") from exc
            except (FatalError, SinkBlockedError, BatchRefusedError):
                raise
            except Exception as exc:  # the catalog's database, the REST server or S3: not the records
                raise self._unreachable(exc) from exc
        return []

    def _before_retry(self, state: Any) -> None:
        log.info(
            "sink=%s commit to %s overtaken by another writer (attempt %d): refreshing",
            self.name,
            self.config.table,
            state.attempt_number,
        )
        if self.table is not None:
            self.table.refresh()
        if self.tombstones is not None:
            self.tombstones.refresh()

    def _write_once(self, batch: SinkBatch) -> None:
        table = self.table
        offsets = recorded_offsets(table, self._prop) if table is not None else {}
        done = offset_of(offsets, batch.topic, batch.partition)
        records = [r for r in batch.records if r.offset > done]
        if len(records) < len(batch.records):
            log.info(
                "sink=%s %s[%d]: %d record(s) at or below offset %d already in %s, skipped",
                self.name,
                batch.topic,
                batch.partition,
                len(batch.records) - len(records),
                done,
                self.config.table,
            )
        if not records:
            return
        if self.config.mode == "append":
            decision = Decision(upserts=[r for r in records if not r.is_delete])
        else:
            decision = self._decide(table, records)
        rows = self._rows(batch, decision.upserts)
        if rows is not None and table is None:
            table = self.table = table_schema.create(
                self.catalog, self.config.table, rows.schema, self.config.partition_by
            )
            log.info("sink=%s created Iceberg table %s", self.name, self.config.table)
        if rows is not None and table is not None:
            rows = self._fit(table, rows)
        if decision.tombstones and self.tombstones is not None:  # first: a crash after it leaves the delete to do
            self.tombstones.record(decision, self._key_types(table))
        if table is None or (rows is None and not decision.replaced):
            return
        self._commit(table, batch, offsets, decision.replaced, rows)

    def _decide(self, table: Any, records: list[SinkRecord]) -> Decision:
        """The version guard: the batch's newest update per key against the table's rows and tombstones."""
        latest = latest_per_key(records)
        keys = [match_tuple(r, self.config.key) for r in latest]
        rows = versions_of(table, self._match, self.config.version_column, keys) if table is not None else {}
        tombs = self.tombstones.versions(keys) if self.tombstones is not None else {}
        return decide(latest, keys, rows, tombs)

    def _key_types(self, table: Any) -> list[pa.DataType | None]:
        if table is None:
            return [None] * len(self._match)
        schema = table.schema().as_arrow()
        return [schema.field(k).type if k in schema.names else None for k in self._match]

    def _rows(self, batch: SinkBatch, upserts: list[SinkRecord]) -> pa.Table | None:
        """The upserts' rows (values, key columns from the record keys where the value lacks them, version)."""
        if not upserts:
            return None
        parts = []
        for run, part in value_tables(batch, upserts, self.config.version_column):
            for i, column in enumerate(self.config.key):
                if column not in part.column_names:
                    part = part.add_column(i, column, pa.array([key_tuple(r, self.config.key)[i] for r in run]))
            if self._match != self.config.key and self.config.mode == "upsert":
                part = part.add_column(
                    0, self._match[0], pa.array([match_tuple(r, self.config.key)[0] for r in run], pa.string())
                )
            parts.append(part)
        if len(parts) == 1:
            return parts[0]
        return pa.concat_tables(parts, promote_options="permissive")

    def _fit(self, table: Any, rows: pa.Table) -> pa.Table:
        """Evolve the table for ``rows``' schema when needed and allowed, then align ``rows`` to it."""
        adds, promotes = table_schema.plan(table.schema().as_arrow(), rows.schema)
        if adds or promotes:
            if not self.config.evolve_table:
                raise table_schema.SchemaRefused(
                    f"the writer schema has new column(s) {[f.name for f in adds]} or wider type(s) "
                    f"{sorted(promotes)} and evolve_table is off"
                )
            table_schema.evolve(table, adds, promotes)
            log.info(
                "sink=%s evolved %s: added %s, promoted %s",
                self.name,
                self.config.table,
                [f.name for f in adds],
                {k: str(v) for k, v in promotes.items()},
            )
        return table_schema.align(rows, table.schema().as_arrow())

    def _commit(
        self, table: Any, batch: SinkBatch, offsets: Any, deletes: list[KeyTuple], rows: pa.Table | None
    ) -> None:
        """One transaction: delete the replaced keys' rows, append the new rows, record the offsets."""
        props = {self._prop: with_offset(offsets, batch.topic, batch.partition, batch.last_offset)}
        with without_rebase(table).transaction() as tx:
            if deletes:
                tx.delete(key_filter(self._match, deletes), snapshot_properties=props)
            if rows is not None and rows.num_rows:
                tx.append(rows, snapshot_properties=props)
        log.debug(
            "sink=%s %s[%d]@%d-%d: committed %d row(s), %d delete(s) to %s",
            self.name,
            batch.topic,
            batch.partition,
            batch.first_offset,
            batch.last_offset,
            0 if rows is None else rows.num_rows,
            len(deletes),
            self.config.table,
        )
