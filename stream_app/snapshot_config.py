"""Config of a GlobalKTable-like snapshot of compacted topics (``stream.snapshots[]``): :class:`SnapshotConfig`.

The record formats of its keys and values, its reader schemas, the sizes that
choose where its base lives (broadcast, indexed, partitioned), its checkpoint
interval and, with ``retention``, the versions ``as_of`` lookups join.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kernel.config.fields import Name, SchemaRef, StrictModel, TopicName
from stream_app.durations import duration_s


class SnapshotConfig(StrictModel):
    """A GlobalKTable-like snapshot: the latest value per key of compacted topics.

    A key is expected in one partition of one topic (Kafka's key partitioning);
    when several topics hold the same key, the record read last wins (topics
    in list order, then partition, then offset).
    """

    name: Name
    topics: list[TopicName] = Field(min_length=1)
    key_format: Literal["avro", "string", "confluent_avro", "connect_json"] = Field(
        "avro",
        description="how record keys are encoded: 'avro' (single-object Avro, read with key_schema), 'string' "
        "(plain UTF-8, as Kafka Streams' Serdes.String() writes them; the key is one string field named key_field), "
        "'confluent_avro' (Confluent's wire format, writer schemas from kafka.schema_registry, subject <topic>-key) "
        "or 'connect_json' (Kafka Connect's JsonConverter with schemas.enable=true: a struct key is read with "
        "key_schema, which is then required)",
    )
    value_format: Literal["avro", "confluent_avro", "connect_json"] = Field(
        "avro",
        description="how record values are encoded: 'avro' (single-object Avro), 'confluent_avro' (Confluent's "
        "wire format, writer schemas from kafka.schema_registry, subject <topic>-value) or 'connect_json' (Kafka "
        "Connect's JsonConverter with schemas.enable=true, read with value_schema, which is then required)",
    )
    envelope: Literal["none", "debezium"] = Field(
        "none",
        description="'debezium': each value is a Debezium change event (before/after/source/op/ts_ms); the "
        "snapshot keeps `after` (value_schema is the row record, default: the `after` type of the latest writer "
        "schema), `op: d` and tombstones delete the key, `op: t` is skipped, and a column holding "
        "__debezium_unavailable_value (a TOASTed column an UPDATE left out) keeps the key's previous value",
    )
    key_schema: SchemaRef | None = Field(
        None,
        description="Avro reader schema of the record keys (a record); default: the latest key schema the topics "
        "carry (schema store subject <topic>-key)",
    )
    key_field: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="key_format string: the name lookups join on (`on: {event_field: <key_field>}`), default 'key'",
    )
    value_schema: SchemaRef | None = Field(
        None,
        description="Avro reader schema of the record values (a record), for projection or evolution; default: the "
        "latest value schema the topics carry (schema store subject <topic>-value), writer schemas matched by field "
        "names",
    )
    index_min_rows: int | None = Field(
        None,
        ge=0,
        description="opt-in: from this many keys (up to broadcast_max_rows) keep the snapshot as a hash index in "
        "the executors' Python workers (a copy per worker, outside the JVM's memory accounting) instead of "
        "broadcasting it; off by default: above broadcast_max_rows the snapshot is partitioned on the executors",
    )
    broadcast_max_rows: int = Field(
        100_000,
        ge=0,
        description="above this many keys the snapshot is partitioned by key on the executors (never collected to "
        "the driver, versioned as bucketed Parquet in the checkpoint location) and joined by a shuffle of the events",
    )
    overlay_max_rows: int = Field(
        50_000,
        ge=1,
        description="changes kept beside the broadcast base before they are merged into a new base (records); "
        "topics holding at most this many records are also bootstrapped that way, read and decoded on the driver",
    )
    checkpoint_interval_s: float = Field(
        300.0, gt=0, description="the snapshot (data + offsets) is checkpointed at most this often, seconds"
    )
    partitioned_join: Literal["lookup", "sort_merge"] = Field(
        "lookup",
        description="how micro-batches join a partitioned snapshot: lookup (each version also written as Arrow files "
        "sorted by key hash, memory-mapped by the Python workers and searched per event: the cost follows the "
        "events, not the snapshot; needs a checkpoint location on a file system the executors read locally, "
        "file:, else sort_merge is used) or sort_merge (Spark's join of the events, shuffled, with the whole base)",
    )
    partitions: int | None = Field(
        None,
        ge=1,
        description="partitions (and Parquet buckets) of a partitioned snapshot (default spark.sql.shuffle.partitions; "
        "keep it at least that, or Spark reshuffles the snapshot instead of the events)",
    )

    retention: str | None = Field(
        None,
        description="keep the snapshot's versions per key whose validity reaches back this long (e.g. '7 days'), "
        "counted back from the newest source timestamp the snapshot has seen: lookups with `as_of` then get the "
        "version valid at the event's time (a versioned state store, like Kafka Streams' KIP-889 stores)",
    )

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        if value is not None and duration_s(value) == 0:
            raise ValueError("a retention lasts more than 0 seconds")
        return None if value is None else value.strip()

    @property
    def retention_ms(self) -> int | None:
        """``retention`` in milliseconds (``None``: not versioned)."""
        return None if self.retention is None else duration_s(self.retention) * 1000

    max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="mode realtime and threes serve: the heap the in-heap table of the latest values may take in each "
        "JVM, bytes (key and value bodies plus 112 bytes per key); a snapshot that needs more is served from the "
        "RocksDB state store alone (0: never keep the table)",
    )

    @model_validator(mode="after")
    def _key_format(self) -> SnapshotConfig:
        if self.key_format != "string":
            if self.key_field is not None:
                raise ValueError("key_field applies to key_format string only (an Avro key names its own fields)")
        elif self.key_schema is not None:
            raise ValueError("key_schema does not apply to key_format string (the key is one string: key_field)")
        # Connect's JSON carries its own schema in each record but no schema topic or registry keeps it:
        # the reader schema is given
        if self.key_format == "connect_json" and self.key_schema is None:
            raise ValueError("key_format connect_json needs key_schema (the key's fields, as an Avro record)")
        if self.value_format == "connect_json" and self.value_schema is None:
            raise ValueError("value_format connect_json needs value_schema (the row's fields, as an Avro record)")
        if self.envelope == "debezium" and self.retention is not None:
            raise ValueError("envelope debezium keeps the latest value per key only: retention (versions) is not "
                             "supported with it")
        return self

    @property
    def registry_formats(self) -> list[str]:
        """The fields of this snapshot that read the Confluent wire format (``key_format``/``value_format``)."""
        return [n for n in ("key_format", "value_format") if getattr(self, n) == "confluent_avro"]
