"""``threes check``: reach every system a pipeline names, without side effects.

Each check is read-only: Kafka metadata here, then each connection's own
:meth:`~connectors.config.models.ConnectionConfig.check` (``SELECT 1``, Elasticsearch
cluster health, S3 ``head_bucket`` for every bucket a connector names...). A failure says
what failed and what to do, in one line per system (no traceback, no client
library's log lines); it never prints a secret (:func:`connectors.redact.redact`
runs over every detail).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from connectors import registry
from connectors.config.models import CheckResult
from connectors.exceptions import SetupError
from connectors.redact import redact
from threes.config import PipelineBase

log = logging.getLogger(__name__)


def _kafka(pipeline: PipelineBase) -> CheckResult:
    from connectors.topics import cluster_metadata

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


def run_checks(pipeline: PipelineBase, on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Check Kafka and every connection of a pipeline.

    Args:
        pipeline: a validated pipeline.
        on_result: called with each result as soon as it is known.

    Returns:
        One result per system checked (one per bucket for S3).
    """
    results: list[CheckResult] = []

    def emit(r: CheckResult) -> None:
        r = replace(r, target=redact(r.target), detail=one_line(r.detail), hint=one_line(r.hint))
        results.append(r)
        if on_result:
            on_result(r)

    with quiet_client_logs():
        _run(pipeline, emit)
    return results


def _run(pipeline: PipelineBase, emit: Callable[[CheckResult], None]) -> None:
    emit(_kafka(pipeline))
    connectors = list(pipeline.sources) + [
        sink for svc in pipeline.sync for sink in svc.sinks
    ]
    for name, conn in pipeline.connections.items():
        for result in conn.check(name, [c for c in connectors if c.connection == name]):
            emit(result)
