"""``threes check``: reach every system a pipeline names, without side effects.

Each check is read-only: Kafka metadata here, then each connection's own
:meth:`~kernel.config.models.ConnectionConfig.check` (``SELECT 1``, Elasticsearch
cluster health, S3 ``head_bucket`` for every bucket a connector names...). A failure says
what failed and what to do, in one line per system (no traceback, no client
library's log lines); it never prints a secret (:func:`kernel.redact.redact`
runs over every detail).

Then the pipeline itself, against what Kafka knows: the checks of ``threes validate``
run again with the writer schemas recorded in the schema topic
(:func:`threes.schemas_check.schema_problems` with ``writer_versions``, what the stream
job does at start-up), so a typo in a lookup's ``fields``, in a snapshot key, in an
expression reading a looked-up column or in a sink's key shows here, each as
``file:line: path: message``, instead of when the job or the sync service starts.
The schema topic is only read: when it does not exist, that is the check's result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from connectors import registry
from kernel.config.models import CheckResult
from kernel.exceptions import SetupError
from kernel.redact import redact
from threes.config import PipelineBase

log = logging.getLogger(__name__)


def _kafka(pipeline: PipelineBase) -> CheckResult:
    from kernel.kafka.topics import cluster_metadata

    kafka = pipeline.kafka
    try:
        # a refused login or an unverifiable certificate fails at once, not after the timeout
        md = cluster_metadata(kafka.librdkafka_config(), kafka.request_timeout_s)
    except SetupError as exc:
        message = str(exc)
        if exc.hint and message.endswith(f". {exc.hint}"):
            message = message[: -len(exc.hint) - 2]
        return CheckResult("kafka", kafka.bootstrap_servers, False, message, exc.hint or "")
    return CheckResult("kafka", kafka.bootstrap_servers, True, f"{len(md.brokers)} broker(s), {len(md.topics)} topics")


def one_line(text: str, limit: int = 400) -> str:
    """The first non-empty line of ``text``, secrets masked, at most ``limit`` characters."""
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    line = redact(line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


@contextmanager
def quiet_client_logs() -> Iterator[None]:
    """Silence the clients' own loggers while checking: each failure is reported once, as one result line.

    elasticsearch-py logs every failed attempt with a traceback at WARNING; urllib3 and
    botocore log their retries. Each connection model names its clients' loggers
    (``client_loggers``).
    """
    names = sorted({name for model in registry.connection_models().values() for name in model.client_loggers})
    saved = {name: logging.getLogger(name).level for name in names}
    try:
        for name in names:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _pipeline(pipeline: PipelineBase, config_file: str | Path) -> list[CheckResult]:
    """The schema checks of ``validate``, with the writer schemas of the schema topic (read-only).

    Returns:
        One failed result per problem (target ``file:line``, detail ``path: message``), or one
        ok result; a missing schema topic is a failed result when a snapshot needs its schemas.
    """
    from kernel.kafka.topics import cluster_metadata
    from schemas.store import SchemaStore
    from threes.schemas_check import needs_writer_schemas, schema_problems

    kafka = pipeline.kafka
    conf = kafka.librdkafka_config()
    topic = kafka.schema_topic
    needing = needs_writer_schemas(pipeline.stream)
    try:
        exists = topic in cluster_metadata(conf, kafka.request_timeout_s).topics
        store = SchemaStore(conf, topic, kafka.request_timeout_s, create=False) if exists else None
    except SetupError as exc:
        return [CheckResult("schemas", topic, False, str(exc), exc.hint or "")]
    if store is None and needing:
        names = [pipeline.stream.snapshots[i].name for i in needing]  # type: ignore[union-attr]
        return [CheckResult(
            "schemas", topic, False,
            f"schema topic {topic!r} does not exist: no writer schemas for snapshot(s) {names}",
            "start the sources that write their topics first (they create it and record their schemas), "
            "or give the snapshots key_schema and value_schema",
        )]
    versions: dict[str, list[str]] = {}

    def writer_versions(subject: str) -> list[str]:
        # each SchemaStore.version_schemas reads the whole (shared) topic again: once per subject is enough
        if subject not in versions:
            versions[subject] = store.version_schemas(subject) if store is not None else []
        return versions[subject]

    problems = schema_problems(pipeline, config_file, writer_versions)
    if problems:
        return [CheckResult("config", f"{p.file}:{p.line}" if p.line else str(p.file), False,
                            f"{p.path}: {p.message}" if p.path else p.message) for p in problems]
    what = f"{len(versions)} subject(s) in {topic!r}" if store is not None else f"no schema topic {topic!r} needed"
    later = ""
    if pipeline.stream is not None and pipeline.stream.transform is not None:
        later = "; what reads stream.transform's output is checked when the job starts (Spark's types)"
    return [CheckResult("config", str(config_file), True,
                        f"lookups, expressions, updates and sink keys match the schemas ({what}){later}")]


def run_checks(
    pipeline: PipelineBase,
    on_result: Callable[[CheckResult], None] | None = None,
    config_file: str | Path | None = None,
) -> list[CheckResult]:
    """Check Kafka and every connection of a pipeline, then the pipeline against the schema topic.

    Args:
        pipeline: a validated pipeline.
        on_result: called with each result as soon as it is known.
        config_file: the YAML the pipeline was loaded from: its stream job and sinks are checked
            against the writer schemas in the schema topic, problems with file and line
            (``None``: not checked).

    Returns:
        One result per system checked (one per bucket for S3), then one per problem of the
        pipeline (or one ok result).
    """
    results: list[CheckResult] = []

    def emit(r: CheckResult) -> None:
        r = replace(r, target=redact(r.target), detail=one_line(r.detail), hint=one_line(r.hint))
        results.append(r)
        if on_result:
            on_result(r)

    with quiet_client_logs():
        _run(pipeline, emit)
        kafka_ok = bool(results) and results[0].ok
        if config_file is not None and kafka_ok and (pipeline.stream is not None or pipeline.sync):
            for result in _pipeline(pipeline, config_file):
                emit(result)
    return results


def _run(pipeline: PipelineBase, emit: Callable[[CheckResult], None]) -> None:
    emit(_kafka(pipeline))
    connectors = list(pipeline.sources) + [
        sink for svc in pipeline.sync for sink in svc.sinks
    ]
    for name, conn in pipeline.connections.items():
        for result in conn.check(name, [c for c in connectors if c.connection == name]):
            emit(result)
