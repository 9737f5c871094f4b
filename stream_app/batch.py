"""The plan of one enrichment micro-batch: decode, enrich, route every output record.

Building a plan has a fixed cost per micro-batch (every Column is a call into
the JVM, every DataFrame step is analyzed) that a small machine feels in every
micro-batch when the plan is rebuilt each time. So the column expressions are
built once (again only when new writer schemas appear) and only what changes
per batch - the snapshot views and their offsets header - is made per batch.

Columns of the decoded frame: the event's fields, plus ``__key``,
``__headers``, ``__partition``, ``__offset`` (and ``__timestamp`` when a
projection's version is the Kafka timestamp), ``__error`` (why the event is
dead-lettered, ``null`` when it is fine), and ``__value``, the original bytes,
kept only on rows that may be dead-lettered (the others do not carry them
through the Python workers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stream_app.avro import decode_avro, framed, from_confluent
from stream_app.avro_schemas import is_optional, same_encoding
from stream_app.columns import ColumnCache
from stream_app.enrich import BoundLookup
from stream_app.kafka_io import offsets_json
from stream_app.plan.model import JobPlan, UpdatePlan
from stream_app.plan.writer_match import writers_for
from stream_app.records import RECORD_FIELDS, dead_letter_fields, header, no_headers, record_of, record_rows
from stream_app.run_stages import apply_steps
from stream_app.snapshot.data import ERROR
from stream_app.snapshot.decoding import decode_error_reason
from stream_app.snapshot.view import SnapshotView
from stream_app.updates import projection_records

SOURCE_HEADER = "source"  # on enriched events: "topic:partition:offset" of the event they enrich
BODY = "__body"  # the enriched event's Avro body, encoded once per event


class BatchPlan:
    """Column expressions of the enrichment micro-batches of one job.

    Args:
        plan: the job's plan.
        jvm_decoder: real-time mode: the names of the JVM decode and reason functions
            (:func:`stream_app.realtime.register_event_decoder`), which resolve writer schemas
            themselves; ``None`` decodes with the writer schemas given to :meth:`frame`.
    """

    def __init__(self, plan: JobPlan, jvm_decoder: tuple[str, str] | None = None):
        from pyspark.sql import functions as f

        self.plan = plan
        cfg = plan.config
        self.events_topic = cfg.events.topic
        projections = [u for u in plan.updates if u.config.kind == "projection"]
        event_fields = [fld["name"] for fld in plan.events.avro["fields"]]
        self.timestamp = any(u.config.version == "timestamp" for u in projections)
        key_fields = {k for u in projections for k in (u.config.key or [])}
        # a projection key of joined fields can be null only after the join: keep every raw value then
        self._raw_always = bool(key_fields - set(event_fields))
        self._raw_when_null = sorted(key_fields & set(event_fields))
        self._writers: frozenset[Any] | None = None
        self._registry = cfg.events.value_format == "confluent_avro"
        self._jvm_decoder = jvm_decoder
        self._decode: tuple[list[Any], list[Any], list[Any]] | None = None
        self._cache = ColumnCache()
        self._snapshot_headers: tuple[tuple[tuple[str, str], ...], Any] | None = None
        self._record_kept = f.col("topic").isNotNull()  # the rows of record_rows that are records

        ok = f.col(ERROR).isNull()
        self._ok = ok
        self._source_header = header(
            SOURCE_HEADER, f.concat_ws(":", f.lit(self.events_topic), f.col("__partition"), f.col("__offset"))
        )
        self._event_headers = f.coalesce(f.col("__headers"), no_headers())
        from pyspark.sql.avro.functions import to_avro

        # Encoding is most of a batch's per-event cost: the enriched body is encoded once, in a projection
        # of its own (so the optimizer keeps it one expression), and every projection whose value has the
        # same field types reuses it under its own fingerprint.
        self._body = f.when(
            ok, to_avro(f.struct(*[fld["name"] for fld in plan.enriched.avro["fields"]]), plan.enriched.json)
        ).alias(BODY)
        self._value = framed(f.col(BODY), plan.enriched.fingerprint)
        self._updates = self._projection_records(projections, ok)
        self._dead_letter_fields = self._decode_dead_letter_fields()
        self._dead_letter = f.when(~ok, record_of(*self._dead_letter_fields))

    def _projection_records(self, projections: list[UpdatePlan], ok: Any) -> list[Any]:
        """The update records of the projections; one whose value encodes as the enriched body reuses it."""
        from pyspark.sql import functions as f

        plan, cfg = self.plan, self.plan.config
        return [
            r
            for u in projections
            for r in projection_records(
                u,
                cfg.dead_letter_topic,
                cfg.name,
                ok,
                cfg.events.topic,
                body=f.col(BODY) if same_encoding(u.value.avro, plan.enriched.avro) else None,
            )
        ]

    def _decode_dead_letter_fields(self) -> tuple[Any, Any, Any, Any]:
        """The record fields of an event's dead letter (stage ``decode``): its bytes, key and headers untouched."""
        from pyspark.sql import functions as f

        cfg = self.plan.config
        return dead_letter_fields(
            cfg.dead_letter_topic,
            "decode",
            "SkippableRecordError",
            f.col(ERROR),
            cfg.name,
            source_topic=f.lit(self.events_topic),
            partition=f.col("__partition"),
            offset=f.col("__offset"),
            key=f.col("__key"),
            value=f.col("__value"),
            headers=f.col("__headers"),
        )

    def _decode_columns(
        self, writers: Mapping[bytes, str], headers: Mapping[bytes, bytes] | None = None
    ) -> tuple[list[Any], list[Any], list[Any]]:
        """The three projections that decode events, rebuilt when the writer schemas change."""
        from pyspark.sql import functions as f
        from pyspark.sql.avro.functions import from_avro

        relevant = writers_for(dict(writers), self.plan.events.avro)
        # confluent_avro: the registry ids of the relevant writers (the others would not decode either)
        ids = {p: h for p, h in (headers or {}).items() if h[2:] in relevant} if self._registry else {}
        known = frozenset([*relevant, *ids])
        if self._decode is not None and self._writers == known:
            return self._decode

        def single_object(col: Any) -> Any:
            return from_confluent(col, ids) if self._registry else col

        def decode(col: Any) -> Any:
            if self._jvm_decoder is None:
                return decode_avro(single_object(col), relevant, self.plan.events.json)
            body = f.call_function(self._jvm_decoder[0], col)
            return from_avro(body, self.plan.events.json, {"mode": "PERMISSIVE"})

        def reason(col: Any) -> Any:
            if self._jvm_decoder is None:
                return decode_error_reason(single_object(col), relevant, "value")
            return f.call_function(self._jvm_decoder[1], col)

        meta = ["__key", "__headers", "__partition", "__offset"] + (["__timestamp"] if self.timestamp else [])
        first = [
            f.col("key").alias("__key"),
            f.col("value").alias("__value"),
            f.col("headers").alias("__headers"),
            f.col("partition").alias("__partition"),
            f.col("offset").alias("__offset"),
            *([f.col("timestamp").alias("__timestamp")] if self.timestamp else []),
            decode(f.col("value")).alias("__v"),
        ]
        second = [*self._cache.cols([*meta, "__value", "__v"]), self._decoded().alias("__decoded")]
        error = f.when(f.col("__value").isNull(), f.lit("event has no value (null)")).when(
            ~f.col("__decoded"), reason(f.col("__value"))
        )
        third = [*self._cache.cols(meta), f.when(self._keep_raw(), f.col("__value")).alias("__value"),
                 error.alias(ERROR), self._cache.col("__v.*")]
        self._writers, self._decode = known, (first, second, third)
        return self._decode

    def _decoded(self) -> Any:
        """Whether ``__v`` decoded: PERMISSIVE ``from_avro`` gives a struct of nulls for a corrupt body."""
        from pyspark.sql import functions as f

        # a required field is then null
        required = [fld["name"] for fld in self.plan.events.avro["fields"] if not is_optional(fld["type"])]
        decoded = f.col("__v").isNotNull()
        if required:
            all_null = f.lit(True)
            for name in required:
                all_null = all_null & f.col("__v")[name].isNull()
            decoded = decoded & ~all_null
        return decoded

    def _keep_raw(self) -> Any:
        """Whether a row keeps its original bytes ``__value``: it may be dead-lettered (here or after the join)."""
        from pyspark.sql import functions as f

        # the error is set exactly when the value is null or did not decode (a null value never decodes):
        # ~__decoded, not a second copy of the error's expression tree
        keep_raw = ~f.col("__decoded")
        if self._raw_always:
            keep_raw = f.lit(True)
        for name in self._raw_when_null:
            keep_raw = keep_raw | f.col("__v")[name].isNull()
        return keep_raw

    def frame(self, batch: Any, writers: Mapping[bytes, str], headers: Mapping[bytes, bytes] | None = None) -> Any:
        """The decoded events of a micro-batch (Spark's Kafka rows), bad ones marked in ``__error``.

        Args:
            batch: Spark's Kafka rows.
            writers: known writer schemas, fingerprint -> JSON.
            headers: ``events.value_format: confluent_avro``: Confluent prefix -> single-object header
                (:meth:`stream_app.writers.WriterSchemas.headers`).
        """
        first, second, third = self._decode_columns(writers, headers)
        select = self._cache.select
        return select(select(select(batch, first), second), third)

    def records(
        self, frame: Any, lookups: list[BoundLookup], views: Mapping[str, SnapshotView], filtered: Any = None
    ) -> Any:
        """Every output record of the batch: ``topic, key, value, headers``.

        Args:
            frame: from :meth:`frame`.
            lookups: the lookups bound to this batch's snapshot views (every lookup of the job, by index).
            views: the views, whose offsets go in the ``snapshot.<name>`` headers.
            filtered: an ``Observation`` that receives ``filtered``, the events ``where`` dropped.

        ``stream.transform`` runs on the enriched events, after the lookups, derive columns
        and ``where``, before the records are built.
        """
        steps = apply_steps(frame, self.plan.steps, lookups, passthrough=ERROR, cache=self._cache, observation=filtered)
        if self.plan.transform is not None:
            # the user's stream.transform, on the enriched events with the internal columns (checked at start-up:
            # its output has every column the records below read)
            steps = self.plan.transform(steps)
        enriched = self._cache.select(steps, [self._cache.col("*"), self._body])
        if self.one_record_per_event:
            return enriched.select(*self._record_rows(views))
        return enriched.select(self._record_rows(views)).filter(self._record_kept)

    @property
    def one_record_per_event(self) -> bool:
        """Whether every event gives exactly one output record (enriched or dead letter): no update records."""
        return not self._updates

    @property
    def drops_events(self) -> bool:
        """Whether some events may give no record at all: the stream's ``where`` or an inner lookup drops them.

        Then the records written do not count the events read, even with :attr:`one_record_per_event`.
        """
        cfg = self.plan.config
        return cfg.where is not None or any(lookup.how == "inner" for lookup in cfg.lookups)

    def _record_rows(self, views: Mapping[str, SnapshotView]) -> Any:
        """The generator of every output record (:func:`~stream_app.records.record_rows`).

        Without update records (:attr:`one_record_per_event`), the columns of the
        one record of each event instead (the enriched event or its dead letter).
        No generator then, which would make a second, empty row per event and
        filter it out again. Rebuilt only when a snapshot's offsets (a header of
        every enriched event) changed since the last batch.
        """
        from pyspark.sql import functions as f

        offsets = tuple((name, offsets_json(view.offsets)) for name, view in sorted(views.items()))
        if self._snapshot_headers is None or self._snapshot_headers[0] != offsets:
            cfg = self.plan.config
            ours = [self._source_header] + [header(f"snapshot.{name}", f.lit(text)) for name, text in offsets]
            headers = f.concat(self._event_headers, f.array(*ours))
            enriched_fields = (f.lit(cfg.enriched_topic), f.col("__key"), self._value, headers)
            if self.one_record_per_event:
                # one CASE per field: a CASE of the two record structs, taken apart field by field, would
                # repeat both whole records in each of the four columns (each analyzed, optimized and
                # generated again every micro-batch)
                rows = [
                    f.when(self._ok, mine).otherwise(dead).alias(name)
                    for name, mine, dead in zip(RECORD_FIELDS, enriched_fields, self._dead_letter_fields, strict=True)
                ]
            else:
                rows = record_rows([f.when(self._ok, record_of(*enriched_fields)), *self._updates, self._dead_letter])
            self._snapshot_headers = (offsets, rows)
        return self._snapshot_headers[1]
