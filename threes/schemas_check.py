"""Checks of a loaded pipeline against its Avro schemas, without connecting to anything.

``threes validate`` runs them after the config loaded: every schema a source,
the stream job or a sink names is resolved (relative paths start at the config
file's folder, :func:`connectors.config.models.resolve_config_path`) and
parsed; the stream job's lookups, projections and aggregations are checked with
the job's own planner (:func:`stream_app.plan.build_plan`, types included); a
sink's key columns are checked against the update topic it applies. Every
problem is reported at once, as ``file:line: path: message``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from connectors.config.loader import locate
from connectors.exceptions import ConfigError, ConfigProblem


def schema_problems(pipeline: Any, config_file: str | Path) -> list[ConfigProblem]:
    """Every problem of ``pipeline`` that only its schemas reveal.

    Args:
        pipeline: the validated pipeline model.
        config_file: the YAML it was loaded from (for file, line and the folder
            relative paths start at).

    Returns:
        Problems with file and line, sorted by line; empty when all is well.
        A snapshot without reader schemas is checked on the event side only (its
        schemas are the ones its topics carry, known at start-up).
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
            plan = build_plan(pipeline.stream, None, base)
        except ConfigError as exc:
            problems.extend(exc.problems)
    updates: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    if plan is not None:
        updates = {u.config.topic: (u.key.avro, u.value.avro) for u in plan.updates}
    for i, svc in enumerate(pipeline.sync):
        for j, sink in enumerate(svc.sinks):
            where = f"sync[{i}].sinks[{j}]"
            value = load(sink.value_schema, f"{where}.value_schema") if getattr(sink, "value_schema", None) else None
            for topic in sink.topics:
                if topic not in updates:
                    continue
                key_fields = [f["name"] for f in updates[topic][0]["fields"]]
                value_fields = [f["name"] for f in updates[topic][1]["fields"]]
                for name in getattr(sink, "key", None) or []:
                    if name not in key_fields:
                        problems.append(ConfigProblem(
                            f"{where}.key", f"no field {name!r} in the key of update topic {topic!r} "
                                            f"(have: {key_fields})"))
                if value is not None:
                    missing = [n for n in value_fields if n not in {f["name"] for f in value["fields"]}]
                    if missing:
                        problems.append(ConfigProblem(
                            f"{where}.value_schema", f"fields {missing} of update topic {topic!r} are not in "
                                                     f"{sink.value_schema}"))
    return locate(problems, config_file)
