"""Reading a snapshot's changes from Kafka: offset ranges to decoded overlay log rows.

A :class:`ChangeReader` reads a range of a snapshot's compacted topics and
decodes it, by the cheapest path that reproduces Spark's decoding: a few
records through one long-lived consumer on the driver, decoded by fastavro
(:mod:`stream_app.snapshot.delta`) or, when fastavro cannot, in the JVM; many
through Spark's Kafka source (:mod:`stream_app.snapshot.decoding`), kept as the
latest per key. Undecodable records go to the dead letter topic. The result is
an overlay log table (:meth:`ChangeReader.empty_log`), what
:class:`~stream_app.snapshot.runtime.Snapshot` keeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kernel.config.models import KafkaConfig
from stream_app.columns import rows_where
from stream_app.kafka_io import Offsets, RangeReader, read_range
from stream_app.plan import SnapshotPlan
from stream_app.plan.writer_match import writers_for
from stream_app.snapshot.arrow_tables import arrow_schema, nullable_schema, nullable_table
from stream_app.snapshot.data import (
    DELETED,
    ERROR,
    LH,
    LK,
    OFFSET,
    PARTITION,
    RANK,
    TOPIC,
    latest_per_key,
    unavailable_columns,
)
from stream_app.snapshot.decoding import RecordFormats, record_decoder
from stream_app.snapshot.delta import DriverDecoder, simple_key_field, supported_schema
from stream_app.snapshot.engines import DeadLetterProducer
from stream_app.snapshot.version_intervals import TS


class ChangeReader:
    """Reads and decodes the records of one snapshot's topics (see module docstring).

    Args:
        spark: the SparkSession.
        kafka: the pipeline's Kafka config.
        plan: the snapshot's config and schemas.
        writers: returns the known writer schemas (fingerprint -> JSON).
        dead_letters: where undecodable records go.
        headers: returns the registry's Confluent prefixes -> single-object headers
            (``key_format``/``value_format: confluent_avro``).
    """

    def __init__(
        self,
        spark: Any,
        kafka: KafkaConfig,
        plan: SnapshotPlan,
        writers: Callable[[], dict[bytes, str]],
        dead_letters: DeadLetterProducer,
        headers: Callable[[], Mapping[bytes, bytes]] | None = None,
    ):
        self.spark, self.kafka, self.plan, self.writers = spark, kafka, plan, writers
        self.headers = headers or dict
        self.cfg = plan.config
        self.name = self.cfg.name
        self.dead_letters = dead_letters
        self.debezium = self.cfg.envelope == "debezium"
        # Debezium: the value columns that may hold the unavailable-value placeholder
        self.unavailable = unavailable_columns(plan.value.spark_type) if self.debezium else []
        self.rank = {t: i for i, t in enumerate(self.cfg.topics)}
        self._ranges = RangeReader(kafka)
        self._decoder: tuple[frozenset[bytes], Callable[[Any], Any]] | None = None
        self._driver: tuple[frozenset[bytes], DriverDecoder] | None = None
        self._log_schema: pa.Schema | None = None
        # who decoded the last read (a refresh, or a bootstrap from the topics): "driver" (fastavro) or "spark"
        self.decoded_by = ""

    def _relevant_writers(self) -> dict[bytes, str]:
        """The known writer schemas that resolve to the key or the value reader schema (fingerprint -> JSON)."""
        writers = self.writers()
        avro_keys = self.cfg.key_format in ("avro", "confluent_avro")
        keys = writers_for(writers, self.plan.key.avro) if avro_keys else {}
        if self.cfg.value_format == "connect_json":
            return keys
        value = self.plan.envelope if self.plan.envelope is not None else self.plan.value
        return {**keys, **writers_for(writers, value.avro)}

    def _formats(self, relevant: Mapping[bytes, str]) -> RecordFormats:
        """How the records are framed; the registry ids of the relevant writer schemas."""
        return RecordFormats(
            value_format=self.cfg.value_format,
            headers={p: h for p, h in self.headers().items() if h[2:] in relevant} if self.cfg.registry_formats
            else {},
            debezium=self.debezium,
            envelope_json=self.plan.envelope.json if self.plan.envelope is not None else None,
            value_type=self.plan.value.spark_type,
        )

    def decode(self, raw: Any) -> Any:
        """Spark's Kafka rows decoded (:func:`~stream_app.snapshot.decoding.record_decoder`, kept per writers)."""
        relevant = self._relevant_writers()
        formats = self._formats(relevant)
        known = frozenset([*relevant, *formats.headers])
        if self._decoder is None or self._decoder[0] != known:
            decode = record_decoder(
                relevant,
                self.plan.key.json,
                self.plan.value.json,
                self.plan.key.spark_type,
                self.rank,
                self.cfg.key_format,
                formats=formats,
            )
            self._decoder = (known, decode)
        return self._decoder[1](raw)

    def versions_decoder(self) -> Callable[[Any], Any]:
        """The record decoder of the versioned store: the snapshot's, carrying the records' time (``__ts``)."""
        relevant = self._relevant_writers()
        return record_decoder(relevant, self.plan.key.json, self.plan.value.json, self.plan.key.spark_type,
                              self.rank, self.cfg.key_format, carry=(TS,), formats=self._formats(relevant))

    def empty_base(self) -> pa.Table:
        """An empty base table: ``__lk, __lh`` + value columns."""
        from pyspark.sql import types as T

        spark_type = T.StructType(
            [T.StructField(LK, T.StringType()), T.StructField(LH, T.LongType()), *self.plan.value.spark_type.fields]
        )
        return nullable_table(arrow_schema(spark_type).empty_table())

    def dead_letter_errors(self, decoded: Any, stage: str = "snapshot") -> int:
        """Send the decoded records that have an ``__error`` to the dead letter topic; how many were sent."""
        # not a filter, which Spark pushed below the decode: every record decoded again per check of the reason
        bad = rows_where(decoded, decoded[ERROR].isNotNull(), [TOPIC, PARTITION, OFFSET, ERROR, "key", "value"])
        return self.dead_letters.send(bad.toArrow(), stage)

    def empty_log(self) -> pa.Table:
        """An empty overlay log table: ``__lk, __lh, __deleted, __topic, __partition, __offset`` + values."""
        if self._log_schema is None:
            base = list(self.empty_base().schema)
            extra = [(DELETED, pa.bool_()), (TOPIC, pa.string()), (PARTITION, pa.int32()), (OFFSET, pa.int64())]
            self._log_schema = nullable_schema(pa.schema([*base[:2], *extra, *base[2:]]))
        return self._log_schema.empty_table()

    def _driver_decoder(self) -> DriverDecoder | None:
        """The fastavro decoder of small deltas, ``None`` when the schemas need the JVM's decoding."""
        key_field = simple_key_field(self.plan.key.spark_type)
        if key_field is None or not supported_schema(self.plan.value.avro) or not supported_schema(self.plan.key.avro):
            return None
        if self.debezium or "connect_json" in (self.cfg.key_format, self.cfg.value_format):
            return None  # envelopes and Connect JSON are decoded by the JVM path only
        relevant = self._relevant_writers()
        if self._driver is None or self._driver[0] != frozenset(relevant):
            decoder = DriverDecoder(
                relevant,
                self.plan.key.json,
                self.plan.value.json,
                key_field,
                self.empty_log().schema,
                self.rank,
                self.cfg.key_format,
            )
            self._driver = (frozenset(relevant), decoder)
        return self._driver[1]

    def read_changes(self, start: Offsets, ends: Offsets, pending: int) -> pa.Table:
        """Records in ``[start, ends)``: the whole log when small, else the latest per key (tombstones kept).

        A few records are read on the driver by one long-lived consumer and
        decoded there by fastavro (:mod:`stream_app.snapshot.delta`: no Spark
        job), or in the JVM when fastavro cannot reproduce Spark's decoding;
        many are read and decoded by Spark.
        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        self.decoded_by = "spark"
        if pending > self.cfg.overlay_max_rows:
            raw = read_range(self.spark, self.kafka, start, ends)
        else:
            records = self._ranges.read(start, ends)
            if records.num_rows:
                records = self._single_object(records)
                decoder = self._driver_decoder()
                table = decoder.decode(records) if decoder is not None else None
                if table is not None:
                    self.decoded_by = "driver"
                    return table
            raw = self.spark.createDataFrame(records) if records.num_rows else None
        if raw is None:  # every offset in the range was compacted away
            return self.empty_log()
        decoded = self.decode(raw)
        if pending > self.cfg.overlay_max_rows:
            seen = Observation(f"snapshot-{self.name}-{uuid.uuid4().hex[:8]}")
            observed = decoded.observe(seen, f.count_if(f.col(ERROR).isNotNull()).alias("errors"))
            changes = latest_per_key(observed, keep_deleted=True, unavailable=self.unavailable, unresolved="keep")
            changes = changes.toArrow()
            if seen.get["errors"]:
                self.dead_letter_errors(decoded)
            order = [(TOPIC, "ascending"), (PARTITION, "ascending"), (OFFSET, "ascending")]
            return self._as_log(changes.sort_by(order))
        rows = decoded.select(LK, LH, DELETED, TOPIC, PARTITION, OFFSET, RANK, ERROR, "key", "value", "__v.*")
        table = rows.toArrow().sort_by([(RANK, "ascending"), (PARTITION, "ascending"), (OFFSET, "ascending")])
        errors = table.column(ERROR).is_valid()
        if pc.any(errors).as_py():
            self.dead_letters.send(table.filter(errors), "snapshot")
            table = table.filter(pc.invert(errors))
        return self._as_log(table)

    def _single_object(self, records: pa.Table) -> pa.Table:
        """Records read on the driver with their Confluent prefixes swapped for single-object headers."""
        if not self.cfg.registry_formats:
            return records
        headers = self.headers()

        def swap(data: bytes | None) -> bytes | None:
            if data is None or len(data) < 5:
                return data
            header = headers.get(bytes(data[:5]))
            return data if header is None else header + data[5:]

        for name in ("key", "value"):
            if f"{name}_format" in self.cfg.registry_formats:
                column = pa.array([swap(v) for v in records.column(name).to_pylist()], records.schema.field(name).type)
                records = records.set_column(records.column_names.index(name), name, column)
        return records

    def _as_log(self, table: pa.Table) -> pa.Table:
        """A table from Spark as an overlay log table (the one schema both decoders give)."""
        schema = self.empty_log().schema
        return table.select(schema.names).cast(schema)


    def close(self) -> None:
        """Close the driver's consumer."""
        self._ranges.close()
