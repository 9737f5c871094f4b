"""The job's micro-batch streaming queries: Kafka reads, the enrich query, one query per aggregation update.

Both kinds run Kafka to Kafka in the job's Spark application. The **enrich** query hands each
micro-batch to ``foreachBatch`` (:class:`stream_app.micro_batch.MicroBatches`); each
**aggregate** query reads the enriched topic and keeps per-key, per-window aggregates in Spark's
state store, writing changed groups as update records.
"""

from __future__ import annotations

import uuid
from typing import Any

from schemas.serde import schema_json
from stream_app import expressions
from stream_app.avro_schemas import subset_schema
from stream_app.batch import SOURCE_HEADER
from stream_app.kafka_io import source_options
from stream_app.micro_batch import MicroBatches
from stream_app.plan.model import JobPlan
from stream_app.plan.writer_match import full_name, writers_for
from stream_app.spark_checkpoint import child
from stream_app.spark_kafka_options import sink_options
from stream_app.updates import aggregate, aggregation_input, aggregation_input_fields, aggregation_records, output_mode


class JobQueries(MicroBatches):
    """The query wiring of :class:`stream_app.job.StreamJob`: ``readStream`` and ``writeStream``."""

    plan: JobPlan | None

    def _read_stream(self, topic: str, starting: str) -> Any:
        reader = self.spark.readStream.format("kafka")
        for key, value in source_options(self._options).items():
            reader = reader.option(key, value)
        return reader.option("subscribe", topic).option("startingOffsets", starting)

    def _trigger(self, writer: Any, available_now: bool) -> Any:
        if available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")

    def _start_enrich(self, available_now: bool) -> Any:
        events = self.config.events
        reader = (
            self._read_stream(events.topic, events.starting_offsets)
            .option("includeHeaders", "true")
            .option("failOnDataLoss", str(events.fail_on_data_loss).lower())
        )
        if events.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(events.max_offsets_per_trigger))
        writer = (
            reader.load()
            .writeStream.foreachBatch(self.process_batch)
            .option("checkpointLocation", child(self.config.checkpoint_location, "events"))
            .queryName(f"{self.config.name}-enrich-{uuid.uuid4().hex[:6]}")
        )
        return self._trigger(writer, available_now).start()

    def _start_aggregation(self, update: Any, available_now: bool) -> Any:
        # decode only the fields the aggregation reads: same record name, so every enriched writer resolves
        assert self.plan is not None and self._writers is not None  # set by start()
        enriched = self.plan.enriched
        names = [fld["name"] for fld in enriched.avro["fields"]]
        reader = subset_schema(enriched.avro, aggregation_input_fields(update, names), full_name(enriched.avro) or "")
        reader_json = schema_json(reader)
        stream = (
            self._read_stream(self.config.enriched_topic, "earliest")
            .option("failOnDataLoss", "false")
            .option("includeHeaders", "true")
            .load()
        )
        # earlier versions of the enriched schema (a lookup added since) resolve to the current one
        writers = {**writers_for(self._writers(), enriched.avro), enriched.fingerprint: enriched.json}
        # ours is appended after the event's own headers: the last one named so
        events = aggregation_input(stream, writers, reader_json, SOURCE_HEADER)
        if update.config.where is not None:  # this topic's own filter (null counts as false)
            events = events.filter(expressions.column(update.config.where))
        records = aggregation_records(aggregate(events, update, dedupe_on="__source"), update)
        writer = records.writeStream.format("kafka").outputMode(output_mode(update))
        for key, value in sink_options(self._options).items():
            writer = writer.option(key, value)
        writer = writer.option(
            "checkpointLocation", child(self.config.checkpoint_location, "aggregations", update.config.topic)
        ).queryName(f"{self.config.name}-aggregate-{update.config.topic}-{uuid.uuid4().hex[:6]}")
        return self._trigger(writer, available_now).start()
