"""Config of an update topic the stream job writes for the sync service (``stream.updates[]``).

:class:`UpdateConfig` is a ``projection`` (an upsert per enriched event) or an
``aggregation`` (per group and event-time window), with the validators of its
windows (tumbling, hopping, session), watermark and the fields each kind needs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from kernel.config.fields import StrictModel, TopicName
from stream_app.aggregation_specs import AggregationText
from stream_app.durations import duration_s

SESSION = "session"


class UpdateConfig(StrictModel):
    """An update topic the job writes for the sync service (``kernel.updates`` contract).

    ``projection``: one upsert per enriched event, keyed by ``key``; its
    ``version`` is the event's Kafka offset (monotonic per key when the event
    topic is keyed by the same entity), its Kafka timestamp in ms, or a numeric
    event field. ``aggregation``: per ``group_by`` and event-time ``window``
    (tumbling; hopping with ``slide``; ``session`` with ``gap``), the
    ``aggregations``, in Spark's state store (RocksDB); the key is ``group_by`` +
    ``window_start``, the version the group's event count, which grows with
    every change and is the same when a micro-batch is replayed. Tumbling and
    hopping windows are emitted as upserts whenever they change (Spark's
    ``update`` output mode); a session once, when the watermark passes its end
    (``append``: Spark refuses ``update`` for session windows, as a session's
    start, hence its key, may still move while it is open).
    """

    topic: TopicName
    kind: Literal["projection", "aggregation"] = "projection"
    key: list[str] | None = Field(None, min_length=1, description="projection: key field(s) of the update records")
    fields: list[str] | None = Field(None, min_length=1, description="projection: fields to keep (default all)")
    version: str = Field("offset", description="projection: 'offset' | 'timestamp' (Kafka, ms) | a numeric event field")
    group_by: list[str] | None = Field(None, min_length=1, description="aggregation: grouping fields")
    aggregations: dict[str, AggregationText] | None = Field(
        None,
        description="aggregation: output field -> 'count' | 'mean(f)' | 'sum(f)' | 'min(f)' | 'max(f)' | "
        "'count_distinct(f)' (exact: the state keeps every distinct value per window) | 'approx_count_distinct(f)' "
        "(HyperLogLog++, 5% relative standard deviation) | 'first(f)' | 'last(f)' (the value at the earliest / "
        "latest event time) | 'stddev(f)' (sample) | 'percentile(f, p)' (approximate, p in (0, 1))",
    )
    event_time: str | None = Field(None, description="aggregation: event-time field (an Avro timestamp)")
    where: str | None = Field(
        None,
        description="a Spark SQL boolean expression over the enriched event: only events for which it is true "
        "reach this update topic (null counts as false)",
    )
    delete_when: str | None = Field(
        None,
        description="projection: a Spark SQL boolean expression over the enriched event; when true the event "
        "emits a tombstone (a null value) for its key, with the event's version, and the sinks delete the row, "
        "document or archived key",
    )
    window: str = Field(
        "1 day",
        description="aggregation: window length, e.g. '1 day', '15 minutes' (tumbling, or hopping with slide), or "
        "'session' (with gap)",
    )
    slide: str | None = Field(
        None,
        description="aggregation: hopping windows: a window starts every slide (at most window; need not divide "
        "it); each event is in about window/slide windows. Not with window: session",
    )
    gap: str | None = Field(
        None,
        validate_default=True,
        description="aggregation, window: session (and only then): a group's session ends after this long without "
        "an event, e.g. '30 minutes'",
    )
    watermark: str = Field("1 hour", description="aggregation: how late an event may arrive, e.g. '1 hour'")

    @field_validator("aggregations", mode="before")
    @classmethod
    def _cut_at_a_comma(cls, value: object) -> object:
        # {p95: percentile(f, 0.95)} in a flow mapping parses as {p95: "percentile(f", "0.95)": null}
        if isinstance(value, dict):
            for name, spec in value.items():
                if spec is None and isinstance(name, str) and name.rstrip().endswith(")"):
                    raise ValueError(f"key {name!r} with no spec is the end of a spec cut at a comma: in a YAML "
                                     "flow mapping ({...}) quote specs with a comma, e.g. "
                                     "p95: \"percentile(dep_delay, 0.95)\"")
        return value

    @field_validator("watermark")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_s(value)
        return value.strip()

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        if value.strip() == SESSION:
            return SESSION
        if duration_s(value) == 0:
            raise ValueError("a window lasts more than 0 seconds")
        return value.strip()

    @field_validator("slide")
    @classmethod
    def _slide(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if duration_s(value) == 0:
            raise ValueError("a slide lasts more than 0 seconds")
        window = info.data.get("window")  # absent when the window itself is invalid (reported there)
        if window == SESSION:
            raise ValueError("slide does not apply to window: session (sessions do not hop; their `gap` ends them)")
        if window is not None and duration_s(value) > duration_s(window):
            # Spark's window(ts, window, slide) refuses a slide longer than its window (events would fall between
            # windows); a slide that does not divide the window is fine
            raise ValueError(f"slide {value.strip()!r} is longer than window {window!r}: it must be at most the window")
        return value.strip()

    @field_validator("gap")
    @classmethod
    def _gap(cls, value: str | None, info: ValidationInfo) -> str | None:
        window = info.data.get("window")
        if value is None:
            if window == SESSION:
                raise ValueError("window: session needs a gap, e.g. gap: 30 minutes")
            return None
        if window is not None and window != SESSION:
            raise ValueError("gap applies to window: session only (a tumbling or hopping window has a fixed length)")
        if duration_s(value) == 0:
            raise ValueError("a gap lasts more than 0 seconds")
        return value.strip()

    @model_validator(mode="after")
    def _kind_fields(self) -> UpdateConfig:
        if self.kind == "projection":
            if not self.key:
                raise ValueError("a projection needs `key` (the update records' key fields)")
            aggregation_only = ("group_by", "aggregations", "event_time", "slide", "gap")
            extra = [n for n in aggregation_only if getattr(self, n) is not None]
        else:
            missing = [n for n in ("group_by", "aggregations", "event_time") if not getattr(self, n)]
            if missing:
                raise ValueError(f"an aggregation needs {', '.join(missing)}")
            extra = [n for n in ("key", "fields", "delete_when") if getattr(self, n) is not None]
        if extra:
            raise ValueError(f"{', '.join(extra)} not allowed for kind {self.kind}")
        return self
