"""Config models of the RDS connectors (PostgreSQL, MySQL/MariaDB, SQLite via SQLAlchemy)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernel.config.fields import SchemaRef
from kernel.config.models import SinkConnectorConfig, SourceConnectorConfig

DEFAULT_BULK_INTERVAL_S = 300.0
"""``poll_interval_s`` of a source whose ``mode`` was not given and has no column to read incrementally."""


class RdsSourceConfig(SourceConnectorConfig):
    """``rds_source``: a table (or query) into a compacted topic, keyed by primary key.

    Modes (Kafka Connect JDBC source's vocabulary): ``bulk`` re-reads the whole
    table every ``poll_interval_s``; ``incrementing`` reads rows whose
    ``incrementing_column`` grew; ``timestamp`` reads rows whose
    ``timestamp_column`` moved (ties broken by the key); ``timestamp+incrementing``
    breaks ties by ``incrementing_column``; ``query`` re-reads a custom SELECT
    (``key`` and ``value_schema`` required). Deletes become tombstones through a
    key-set reconciliation every ``reconcile_interval_s``. ``cdc`` streams every
    insert, update and delete after a consistent snapshot: on PostgreSQL from a
    logical replication slot (``pgoutput``, :mod:`connectors.rds.cdc`), on
    MySQL/MariaDB from the row-based binary log (:mod:`connectors.rds.binlog`).
    In ``cdc`` mode ``poll_interval_s`` defaults to
    0.2 s and ``reconcile_interval_s`` to null (deletes arrive as tombstones).

    Without ``mode`` the columns decide: ``timestamp_column`` and/or
    ``incrementing_column`` select the matching incremental mode, ``query``
    selects ``query``; with neither, ``bulk`` re-reads the table every 300 s
    (``poll_interval_s`` unless set), never every 5 s: a full re-publication of
    the table is something to ask for (``mode: bulk``), not a default.

    Example::

        - name: airports
          type: rds_source
          connection: postgres
          topic: state.airports
          table: airports
          mode: timestamp
          timestamp_column: updated_at
    """

    implementation = "connectors.rds.source:RdsSource"
    connection_type = "rds"

    type: Literal["rds_source"]
    table: str | None = None
    schema_name: str | None = Field(None, description="database schema of the table")
    query: str | None = Field(None, description="custom SELECT, for mode: query")
    mode: Literal["bulk", "incrementing", "timestamp", "timestamp+incrementing", "query", "cdc"] | None = Field(
        None,
        description="default: from the columns set (timestamp_column and/or incrementing_column: the matching "
        "incremental mode; query: query); with none, bulk re-reading the table every 300 s, not every "
        "poll_interval_s's 5 s",
    )
    slot_name: str | None = Field(
        None,
        pattern=r"^[a-z0-9_]{1,63}$",
        description="mode cdc: the logical replication slot (created if absent); default threes_<name>",
    )
    publication_name: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="mode cdc: the publication of the table (created if absent); default threes_<name>",
    )
    binlog_purged: Literal["stop", "snapshot"] = Field(
        "stop",
        description="mode cdc on MySQL/MariaDB: when the stored binlog position was purged from the server "
        "(the changes since are lost): stop with an error saying so, or take a new snapshot and tombstone the "
        "keys gone (intermediate changes are not recovered); never a silent gap",
    )
    binlog_server_id: int | None = Field(
        None,
        ge=1,
        le=4294967295,
        description="mode cdc on MySQL/MariaDB: the server id the binlog reader registers with, unique among the "
        "server's replicas; default 0x7E000000 plus a hash of the connector's name",
    )
    incrementing_column: str | None = None
    timestamp_column: str | None = None
    commit_delay_s: float = Field(5.0, ge=0, description="rows are read only once older than this; bounds late commits")
    hold_for_transactions: Literal["writers", "all", "none"] = Field(
        "writers",
        description="PostgreSQL: never read past the start of the oldest open transaction that has written "
        "(writers), of any open transaction (all), or rely on commit_delay_s alone (none); writers and all need a "
        "role that sees other roles' transactions (superuser or pg_read_all_stats), else the source refuses to start",
    )
    reconcile_interval_s: float | None = Field(
        300.0, gt=0, description="how often the key set is compared to emit tombstones for deletes; null: never"
    )
    decimal_handling: Literal["precise", "string", "double"] = Field(
        "precise",
        description="how numeric/decimal columns are written (Debezium's decimal.handling.mode): precise keeps "
        "every digit, numeric(p,s) as an Avro decimal(p,s) and an unbounded numeric (no scale to declare) as its "
        "exact decimal text (a string Spark casts to any DECIMAL); string: every numeric as its exact decimal "
        "text; double: every numeric as a double (lossy, about 15-17 significant digits)",
    )
    tasks: int = Field(
        1,
        ge=1,
        le=64,
        description="split the rows over this many tasks by abs(key % tasks) (single integer key); "
        "run them on several workers with `threes source run --group`",
    )

    @model_validator(mode="after")
    def _mode_needs(self) -> RdsSourceConfig:
        if self.mode is None:
            # never a full re-read every 5 s by default: an incremental mode when the columns say which
            if self.timestamp_column and self.incrementing_column:
                self.mode = "timestamp+incrementing"
            elif self.timestamp_column:
                self.mode = "timestamp"
            elif self.incrementing_column:
                self.mode = "incrementing"
            elif self.query:
                self.mode = "query"
            else:
                self.mode = "bulk"
                if "poll_interval_s" not in self.model_fields_set:
                    self.poll_interval_s = DEFAULT_BULK_INTERVAL_S
        if self.mode == "query":
            if not self.query:
                raise ValueError("mode 'query' needs `query`")
            if not self.key:
                raise ValueError("mode 'query' needs `key` (the key columns of the query)")
            if not self.value_schema:
                raise ValueError("mode 'query' needs `value_schema` (the Avro schema of the query's rows)")
        elif not self.table:
            raise ValueError(f"mode '{self.mode}' needs `table`")
        elif self.value_schema:
            raise ValueError("`value_schema` is derived from the table; set it only with mode 'query'")
        if self.mode == "cdc":
            if self.tasks != 1:
                raise ValueError("mode 'cdc' reads one replication slot: `tasks` must be 1")
            if self.incrementing_column or self.timestamp_column:
                raise ValueError("mode 'cdc' needs no `timestamp_column` / `incrementing_column`")
            # a replication stream is read as it comes; deletes arrive as tombstones (no key-set scans)
            if "poll_interval_s" not in self.model_fields_set:
                self.poll_interval_s = 0.2
            if "reconcile_interval_s" not in self.model_fields_set:
                self.reconcile_interval_s = None
        elif self.slot_name or self.publication_name:
            raise ValueError("`slot_name` / `publication_name` apply to mode 'cdc' only")
        elif self.binlog_server_id is not None or "binlog_purged" in self.model_fields_set:
            raise ValueError("`binlog_server_id` / `binlog_purged` apply to mode 'cdc' only")
        if "incrementing" in self.mode and not self.incrementing_column:
            raise ValueError(f"mode '{self.mode}' needs `incrementing_column`")
        if "timestamp" in self.mode and not self.timestamp_column:
            raise ValueError(f"mode '{self.mode}' needs `timestamp_column`")
        return self


class RdsSinkConfig(SinkConnectorConfig):
    """``rds_sink``: update topics into a table, conditional upsert by key and version.

    Example::

        - name: flights-db
          type: rds_sink
          connection: postgres
          topics: [updates.flights]
          table: flights_enriched
          key: [flight_id]
          create_table: true
    """

    implementation = "connectors.rds.sink:RdsSink"
    connection_type = "rds"

    type: Literal["rds_sink"]
    table: str
    schema_name: str | None = None
    key: list[str] = Field(min_length=1, description="primary key column(s)")
    version_column: str = Field("_version", description="column holding the applied version")
    create_table: bool = Field(False, description="create the table from the Avro schema if missing")
    evolve_table: bool = Field(
        False,
        description="evolve the table with the update topic's writer schemas, once per schema version: add a column "
        "for a new nullable field or one with a default (ALTER TABLE ... ADD COLUMN IF NOT EXISTS, typed as "
        "create_table does) instead of blocking the sink, and widen a numeric column whose precision or scale is "
        "smaller than the writer schema's decimal (ALTER TABLE ... ALTER COLUMN ... TYPE numeric(p,s)) instead of "
        "sending the values it cannot hold exactly to the dead letter queue; a new required field without a default "
        "blocks the sink (what would existing rows hold?), and so does a field whose type changed to one its column "
        "cannot take, or a required field dropped (an error naming the columns and the schemas); PostgreSQL and "
        "MySQL/MariaDB",
    )
    value_schema: SchemaRef | None = Field(
        None, description="Avro schema (.avsc path relative to the config file's folder, or shipped name) to create "
        "the table before the first record"
    )
    tombstone_table: str | None = Field(
        None,
        max_length=63,
        description="table keeping the key and version of every deleted row (created if missing), so an update "
        "older than a delete never recreates the row; default <table>__deleted",
    )
    max_concurrency: int = Field(4, ge=1, le=64, description="upper bound of concurrent transactions")
    lock_timeout_s: float = Field(
        5.0, gt=0, description="a lock wait longer than this is backpressure (the batch is retried later)"
    )
