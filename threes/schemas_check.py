"""Checks of a loaded pipeline against its Avro schemas, without connecting to anything.

``threes validate`` runs them after the config loaded: every schema a source,
the stream job or a sink names is resolved (relative paths start at the config
file's folder, :func:`kernel.config.fields.resolve_config_path`) and
parsed; the stream job's lookups, projections and aggregations are checked with
the job's own planner (:func:`stream_app.plan.build_plan`, types included); a
sink's key columns are checked against the update topic it applies. Every
problem is reported at once, as ``file:line: path: message``.

Without a connection a snapshot without reader schemas has no known fields
(its schemas are the writer schemas its topics carry): ``validate`` checks
the event side and says what it left (:func:`left_to_check`); ``threes
check`` runs the same checks with the writer schemas recorded in the schema
topic (``writer_versions``), as the job does at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernel.config.loader import locate
from kernel.exceptions import ConfigError, ConfigProblem

WriterVersions = Callable[[str], list[str]]
"""subject (``<topic>-key`` / ``<topic>-value``) -> its writer schema versions' JSON, oldest first
(:meth:`schemas.store.SchemaStore.version_schemas`)."""


def needs_writer_schemas(stream: Any) -> list[int]:
    """The indexes of the snapshots whose fields only the schema topic knows (no reader key or value schema).

    Args:
        stream: the ``stream:`` section (``None``: no stream job).
    """
    if stream is None:
        return []
    return [i for i, snap in enumerate(stream.snapshots)
            if snap.value_schema is None or (snap.key_format == "avro" and snap.key_schema is None)]


def left_to_check(pipeline: Any) -> list[str]:
    """What ``threes validate`` cannot check without a connection or Spark, one line each (not errors).

    Args:
        pipeline: the validated pipeline model.

    Returns:
        One line per snapshot without reader schemas (its fields are checked by ``threes check``),
        one per lookup into such a snapshot (with ``fields``: its columns are checked by name here,
        their types by ``check``; without: what reads its columns is left to ``check``), and one
        for a ``transform`` (its output columns are Spark's, checked when the job starts).
    """
    stream = pipeline.stream
    unknown = needs_writer_schemas(stream)
    notes = [f"stream.snapshots[{i}] ({stream.snapshots[i].name}): its fields are checked by `threes check` "
             f"(schemas in the schema topic)" for i in unknown]
    names = {stream.snapshots[i].name for i in unknown}
    for i, lookup in enumerate(stream.lookups if stream is not None else []):
        if lookup.snapshot not in names:
            continue
        if lookup.fields:
            notes.append(f"stream.lookups[{i}]: its columns {lookup.prefix}{{{', '.join(lookup.fields)}}} are "
                         f"checked by name here; their types, and that {lookup.snapshot} has those fields, by "
                         "`threes check`")
        else:
            notes.append(f"stream.lookups[{i}] lists no fields: what reads a column under {lookup.prefix!r} "
                         "(lookups, expressions, update and sink keys) is checked by `threes check`; list "
                         "`fields` to check it here")
    if stream is not None and getattr(stream, "transform", None):
        notes.append(f"stream.transform ({stream.transform}): the columns it adds or drops, and what reads them "
                     f"(update keys, fields, sink keys), are checked when the job starts (they are Spark's types)")
    return notes


def schema_problems(
    pipeline: Any, config_file: str | Path, writer_versions: WriterVersions | None = None
) -> list[ConfigProblem]:
    """Every problem of ``pipeline`` that only its schemas reveal.

    Args:
        pipeline: the validated pipeline model.
        config_file: the YAML it was loaded from (for file, line and the folder
            relative paths start at).
        writer_versions: the schema topic's subject versions (``threes check``):
            snapshots without reader schemas are checked against their topics'
            writer schemas, as the job does at start-up; ``None`` (``threes
            validate``): they are checked on the event side only.

    Returns:
        Problems with file and line, sorted by line; empty when all is well.
    """
    from schemas import load_schema
    from schemas.exceptions import SchemaNotFoundError

    base = Path(config_file).parent
    problems: list[ConfigProblem] = []

    def load(ref: str, path: str) -> dict[str, Any] | None:
        try:
            schema = load_schema(ref, base)
        except SchemaNotFoundError as exc:
            problems.append(ConfigProblem(path, str(exc)))
            return None
        if not isinstance(schema, dict) or schema.get("type") != "record":
            problems.append(ConfigProblem(path, f"{ref}: the schema must be an Avro record"))
            return None
        return schema

    for i, source in enumerate(pipeline.sources):
        if getattr(source, "value_schema", None):
            load(source.value_schema, f"sources[{i}].value_schema")
    plan = None
    if pipeline.stream is not None:
        from stream_app.plan import build_plan

        try:
            plan = build_plan(pipeline.stream, None, base, writer_versions)
        except ConfigError as exc:
            problems.extend(exc.problems)
    updates: dict[str, tuple[list[str], list[str] | None]] = {}
    if plan is not None:
        updates = {u.config.topic: ([f["name"] for f in u.key.avro["fields"]],
                                    [f["name"] for f in u.value.avro["fields"]]) for u in plan.updates}
    elif pipeline.stream is not None and not any(p.path.startswith("stream.updates") for p in problems):
        # no plan (a snapshot only the topics know): an update's key is still known from the YAML
        updates = {u.topic: (_update_key(u), None) for u in pipeline.stream.updates}
    for i, svc in enumerate(pipeline.sync):
        for j, sink in enumerate(svc.sinks):
            where = f"sync[{i}].sinks[{j}]"
            value = load(sink.value_schema, f"{where}.value_schema") if getattr(sink, "value_schema", None) else None
            problems.extend(_sink_problems(where, sink, value, updates))
    return locate(problems, config_file)


def _update_key(update: Any) -> list[str]:
    """An update topic's key fields from its config (as :mod:`stream_app.plan.update_schemas` plans them).

    A projection's ``key``; an aggregation's ``group_by`` and ``window_start``.
    """
    if update.kind == "aggregation":
        return [*(update.group_by or []), "window_start"]
    return list(update.key or [])


def _sink_problems(where: str, sink: Any, value: dict[str, Any] | None,
                   updates: dict[str, tuple[list[str], list[str] | None]]) -> list[ConfigProblem]:
    """A sink's key fields missing from its update topics' keys, their value fields missing from its schema.

    Args:
        where: the sink's config path (``sync[i].sinks[j]``).
        sink: the sink's config.
        value: its loaded value schema (``None``: it has none, or it did not load).
        updates: update topic -> ``(key fields, value fields)`` of the stream job's plan; value fields
            ``None`` when only the key is known (no plan without the topics' schemas).
    """
    problems: list[ConfigProblem] = []
    for topic in sink.topics:
        if topic not in updates:
            continue
        key_fields, value_fields = updates[topic]
        for name in getattr(sink, "key", None) or []:
            if name not in key_fields:
                problems.append(ConfigProblem(
                    f"{where}.key", f"no field {name!r} in the key of update topic {topic!r} "
                                    f"(have: {key_fields})"))
        if value is not None and value_fields is not None:
            missing = [n for n in value_fields if n not in {f["name"] for f in value["fields"]}]
            if missing:
                problems.append(ConfigProblem(
                    f"{where}.value_schema", f"fields {missing} of update topic {topic!r} are not in "
                                             f"{sink.value_schema}"))
    return problems
