"""Config model of the Iceberg sink."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernel.config.fields import StrictModel
from kernel.config.models import SinkConnectorConfig


class IcebergPartitionField(StrictModel):
    """One field of the table's partition spec: a source column and an Iceberg transform.

    ``identity`` keeps the value, ``day``/``hour`` take a timestamp's (or date's) day or hour,
    ``bucket`` hashes into ``buckets`` buckets (Iceberg's Murmur3 bucket transform).
    """

    field: str = Field(min_length=1, description="the source column")
    transform: Literal["identity", "day", "hour", "bucket"] = "identity"
    buckets: int | None = Field(None, ge=1, description="number of buckets (transform: bucket only)")

    @model_validator(mode="after")
    def _buckets_with_bucket(self) -> IcebergPartitionField:
        if (self.transform == "bucket") != (self.buckets is not None):
            raise ValueError("buckets: required with transform bucket, and only with it")
        return self


class IcebergSinkConfig(SinkConnectorConfig):
    """``iceberg_sink``: update topics into an Apache Iceberg table, one catalog commit per batch.

    ``mode: upsert`` applies the update contract (upsert or delete by ``key`` when the record's
    version is newer than the row's ``version_column``) as copy-on-write row-level changes;
    ``mode: append`` appends every record as a row (event tables; tombstones are skipped).
    Each commit records the Kafka offsets it covers in its snapshot's summary
    (``threes.kafka.offsets.<sink name>``), and a record at or below them is skipped: a batch
    written again after a crash writes no row twice.

    Example::

        - name: flights-lake
          type: iceberg_sink
          connection: lake
          topics: [updates.flights]
          table: analytics.flights
          key: [year, month, day, carrier, flight, origin, sched_dep_time]
          partition_by:
            - {field: time_hour, transform: day}
            - {field: flight, transform: bucket, buckets: 16}
    """

    implementation = "connectors.iceberg.sink:IcebergSink"
    connection_type = "iceberg"

    type: Literal["iceberg_sink"]
    table: str = Field(pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$", description="namespace.table")
    mode: Literal["upsert", "append"] = Field(
        "upsert", description="upsert: upsert/delete by key with the version guard; append: every record is a row"
    )
    key: list[str] = Field(default_factory=list, description="key column(s) (upsert mode): the record key's fields")
    version_column: str = Field("_version", description="column holding each row's version header")
    composite_key_column: str = Field(
        "_key",
        description="upsert mode with a key of several columns: the column holding the key as one canonical string "
        "(the JSON array of its values), on which rows are found and deleted",
    )
    tombstone_table: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$",
        description="upsert mode: Iceberg table keeping the key and version of every applied delete (created at the "
        "first delete), so an update older than a delete never recreates the row; default <table>__deleted",
    )
    create_table: bool = Field(True, description="create the namespace and table from the first batch if missing")
    evolve_table: bool = Field(
        True,
        description="add an optional column for a new field of the writer schema, and promote a column Iceberg "
        "can widen (int -> long, float -> double, decimal(p,s) -> decimal(P,s) with P > p); a change the table "
        "cannot hold exactly (another decimal scale, a narrower or different type) blocks the sink with an error "
        "naming the column",
    )
    partition_by: list[IcebergPartitionField] = Field(
        default_factory=list, description="the partition spec of a table this sink creates"
    )
    commit_retries: int = Field(
        10, ge=1, description="attempts of a commit another writer overtook (refreshed and re-checked each time)"
    )

    @model_validator(mode="after")
    def _key_in_upsert_mode(self) -> IcebergSinkConfig:
        if self.mode == "upsert" and not self.key:
            raise ValueError("iceberg_sink in mode upsert needs `key`: the column(s) identifying a row")
        return self

    @property
    def tombstone_table_name(self) -> str:
        """The tombstone table: ``tombstone_table``, default ``<table>__deleted``."""
        return self.tombstone_table or f"{self.table}__deleted"
