"""The job's plan: the YAML config resolved against its Avro schemas, checked once at start-up.

Everything the config can only be checked against the schemas for (event and
key fields of lookups, update keys, aggregation fields) is checked here, and
every problem is reported at once as a :class:`~kernel.exceptions.ConfigError`
with its path in the file (``stream.lookups[1].on.dest``). The output schemas
(enriched events, update keys and values) are derived here too.

:func:`build_plan` runs the steps, each in a module of this package: the reader schemas
(:mod:`~stream_app.plan.readers`, writers matched by :mod:`~stream_app.plan.writer_match`),
the lookups (:mod:`~stream_app.plan.lookups`), the derive/where/lookup order
(:mod:`stream_app.stages`), ``stream.transform`` (:mod:`~stream_app.plan.transformed`) and the
update topics (:mod:`~stream_app.plan.update_schemas`); the plan it returns is
:mod:`~stream_app.plan.model`'s, with Spark types (:mod:`~stream_app.plan.spark_types`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernel.exceptions import ConfigError, ConfigProblem
from stream_app.avro_schemas import JoinedFields, enriched_schema, fields_of, with_derived
from stream_app.config import StreamJobConfig
from stream_app.plan.lookups import check_as_of, plan_lookups
from stream_app.plan.model import JobPlan, SnapshotPlan, UpdatePlan, schema_of
from stream_app.plan.readers import ReaderSchemas, snapshot_plan
from stream_app.plan.spark_types import spark_type, spark_typer
from stream_app.plan.transformed import apply_transform
from stream_app.plan.update_schemas import update_plan
from stream_app.plan.writer_match import WriterVersions
from stream_app.realtime import realtime_problems
from stream_app.stages import Step, order_steps
from stream_app.transform import Transform, load_transform

Problem = Callable[[str, str], None]
"""Reports a problem: ``(path under stream, message)``."""


def build_plan(
    config: StreamJobConfig,
    spark: Any | None = None,
    base_dir: Path | None = None,
    writer_versions: WriterVersions | None = None,
) -> JobPlan | None:
    """Resolve the config against its schemas.

    Args:
        config: the ``stream:`` section.
        spark: a SparkSession to derive Spark types with; ``None`` skips them
            (``threes validate`` needs no JVM).
        base_dir: where relative schema paths start (the config file's folder;
            the config loader already made them absolute); the current directory
            when ``None``, the shipped schemas next.
        writer_versions: the schema store's subject versions
            (:meth:`schemas.store.SchemaStore.version_schemas`): snapshots without
            reader schemas read with the latest writer schema of their topics, and
            every writer schema is matched to the reader (:func:`~stream_app.plan.writer_match.match_writers`).
            ``None`` (``threes validate``, no connection): what needs the topics'
            schemas is not checked.

    A ``transform`` is imported here; with ``spark`` it runs once on an empty DataFrame
    and the enriched event is what it returns (:func:`stream_app.transform.output_type`),
    so the updates are checked against its output. Without ``spark`` its output is
    unknown: a field the updates read that is not in the enriched event is accepted.

    Returns:
        The plan; ``None`` when ``writer_versions`` is ``None`` and a snapshot has
        no reader schema, or when a ``transform`` is set and ``spark`` is ``None``
        (every check that could be made passed).

    Raises:
        ConfigError: every problem found, with its path under ``stream``.
    """
    problems: list[ConfigProblem] = []

    def problem(path: str, message: str) -> None:
        problems.append(ConfigProblem(f"stream.{path}", message))

    for path, message in realtime_problems(config):  # what Spark's real-time mode cannot run (mode: realtime)
        problem(path, message)
    readers = ReaderSchemas(base_dir, writer_versions, problem)
    transform = _load_transform(config, base_dir, problem)
    event = _event_schema(config, readers, problem)
    snaps, unknown = readers.snapshots(config)
    joins, joined, open_prefixes = plan_lookups(config, event, snaps, problem)
    steps, enriched = _enriched(config, spark, event, (joins, joined, open_prefixes), transform, problem)
    updates, enriched = _update_plans(config, enriched, open_prefixes, problem)
    if problems:
        raise ConfigError(problems)
    if unknown or enriched is None:
        return None  # only without writer versions: a snapshot's schemas are known at start-up
    assert event is not None and enriched is not None  # no problems: both were loaded
    snapshot_plans = _snapshot_plans(config, snaps, readers.envelopes)
    job_plan = JobPlan(config, schema_of(event), snapshot_plans, schema_of(enriched), updates, steps, transform)
    if spark is not None:
        _add_spark_types(spark, job_plan)
    return job_plan


def _snapshot_plans(
    config: StreamJobConfig,
    snaps: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    envelopes: dict[str, dict[str, Any]],
) -> dict[str, SnapshotPlan]:
    """Each snapshot's plan from its key and value reader schemas (and its Debezium envelope reader)."""
    snapshot_plans = {snap.name: snapshot_plan(snap, *snaps[snap.name]) for snap in config.snapshots}
    for name, envelope in envelopes.items():
        snapshot_plans[name].envelope = schema_of(envelope)
    return snapshot_plans


def _load_transform(config: StreamJobConfig, base_dir: Path | None, problem: Problem) -> Transform | None:
    """``stream.transform`` imported; ``None`` without one, or after a problem."""
    if config.transform is None:
        return None
    try:
        return load_transform(config.transform, base_dir)
    except ValueError as exc:
        problem("transform", str(exc))
        return None


def _event_schema(config: StreamJobConfig, readers: ReaderSchemas, problem: Problem) -> dict[str, Any] | None:
    """The events' reader schema (``events.value_schema``), whose field names may not start with ``__``."""
    event = readers.load(config.events.value_schema, "events.value_schema")
    if event is not None:
        internal = [f["name"] for f in event["fields"] if f["name"].startswith("__")]
        if internal:
            problem("events.value_schema", f"field names starting with '__' are reserved: {internal}")
    return event


def _enriched(
    config: StreamJobConfig,
    spark: Any | None,
    event: dict[str, Any] | None,
    lookups: tuple[list[JoinedFields], dict[int, dict[str, Any] | None], list[str]],
    transform: Transform | None,
    problem: Problem,
) -> tuple[list[Step], dict[str, Any] | None]:
    """The steps in order (derive columns, lookups, where) and the enriched event's schema.

    Args:
        config: the ``stream:`` section.
        spark: types derive columns (Spark's analyzer) and runs the transform; ``None``: neither.
        event: the events' reader schema (``None`` after a problem).
        lookups: :func:`~stream_app.plan.lookups.plan_lookups`' joins, joined columns and open prefixes.
        transform: ``stream.transform``, imported.
        problem: reports a problem.

    Returns:
        The steps, and the enriched schema after ``stream.transform`` (``None`` without an event
        schema or after a problem).
    """
    joins, joined, open_prefixes = lookups
    if event is None:
        return [], None
    typer = spark_typer(spark) if spark is not None and not open_prefixes else None
    steps, derived, failed = order_steps(
        config, {n: f["type"] for n, f in fields_of(event).items()}, joined, problem, typer
    )
    # the columns of a step that failed: reported once at their root, not again by each update reading them
    open_prefixes.extend(name for name in failed if name not in open_prefixes)
    check_as_of(config, {n: f["type"] for n, f in fields_of(event).items()}, derived, joined, problem)
    try:
        enriched: dict[str, Any] | None = with_derived(enriched_schema(event, joins), derived)
    except ValueError as exc:
        problem("lookups", str(exc))
        return steps, None
    if enriched is not None and config.transform is not None:
        enriched = apply_transform(config, spark, transform, enriched, open_prefixes, problem)
    return steps, enriched


def _update_plans(
    config: StreamJobConfig, enriched: dict[str, Any] | None, open_prefixes: list[str], problem: Problem
) -> tuple[list[UpdatePlan], dict[str, Any] | None]:
    """Each update topic's plan, and the enriched schema (``None`` when a lookup's columns are unknown here).

    With open prefixes every problem is still reported at once: the updates are checked against what
    is known, a field under the prefix of a lookup that could not be joined is accepted (its schema
    is unknown here), and no update is planned.
    """
    if enriched is not None and open_prefixes:
        for j, update in enumerate(config.updates):
            try:
                update_plan(update, enriched, lambda path, msg, j=j: problem(f"updates[{j}].{path}", msg),
                            open_prefixes)
            except ValueError:
                pass  # a field of a lookup not joined: reported with the lookup, or derived at start-up
        return [], None
    updates: list[UpdatePlan] = []
    if enriched is not None:
        for j, update in enumerate(config.updates):
            plan = update_plan(update, enriched, lambda path, msg, j=j: problem(f"updates[{j}].{path}", msg))
            if plan is not None:
                updates.append(plan)
    return updates, enriched


def _add_spark_types(spark: Any, job_plan: JobPlan) -> None:
    """Give every schema of the plan the Spark type ``from_avro`` reads it as."""
    job_plan.events.spark_type = spark_type(spark, job_plan.events)
    job_plan.enriched.spark_type = spark_type(spark, job_plan.enriched)
    for snapshot in job_plan.snapshots.values():
        snapshot.key.spark_type = spark_type(spark, snapshot.key)
        snapshot.value.spark_type = spark_type(spark, snapshot.value)
        if snapshot.envelope is not None:
            snapshot.envelope.spark_type = spark_type(spark, snapshot.envelope)
