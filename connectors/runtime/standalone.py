"""Run the source tasks of a pipeline in this process, one thread per task.

:class:`SourceWorker` starts and stops :class:`~connectors.runtime.worker.TaskRunner`
threads. ``threes source run`` uses it directly (standalone mode: every task of
the file) or through :mod:`connectors.runtime.distributed`, which lets Kafka's
consumer group protocol decide which worker runs which task.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from connectors.registry import load_implementation
from connectors.runtime import metrics
from connectors.runtime.offsets import OFFSETS_TOPIC, OffsetStore, offsets_key
from connectors.runtime.position_commits import TRANSACTION_TIMEOUT_MS
from connectors.runtime.runner_state import RunnerStats
from connectors.runtime.worker import TaskRunner
from kernel.config.models import ConnectionConfig, KafkaConfig, SourceConnectorConfig
from kernel.config.policies import RetryPolicy
from kernel.exceptions import ConfigError
from kernel.supervision import RestartBackoff

if TYPE_CHECKING:
    from connectors.api.source import SourceTask

log = logging.getLogger(__name__)


class SourcePipeline(Protocol):
    """What the source runtime reads of a pipeline document (:class:`threes.config.PipelineBase` is one).

    Attributes:
        kafka: the Kafka connection.
        sources: the source connector configs.
    """

    kafka: KafkaConfig
    sources: list[SourceConnectorConfig]

    def connection(self, name: str) -> ConnectionConfig:
        """Return the connection called ``name``."""
        ...


@dataclass(frozen=True)
class TaskSpec:
    """One task of one connector.

    Attributes:
        config: the connector config.
        task_id: task index.
        task_count: tasks of the connector.
    """

    config: SourceConnectorConfig
    task_id: int
    task_count: int

    @property
    def key(self) -> str:
        """The task's offsets key (connector name, ``name#i`` when split)."""
        return offsets_key(self.config.name, self.task_id, self.task_count)


def select_sources(pipeline: SourcePipeline, names: Iterable[str] | None = None) -> list[SourceConnectorConfig]:
    """The source configs of a pipeline, optionally only those named.

    Raises:
        ConfigError: a name is not a source of the pipeline.
    """
    sources = list(pipeline.sources)
    if not names:
        return sources
    wanted = list(names)
    known = {s.name for s in sources}
    missing = [n for n in wanted if n not in known]
    if missing:
        raise ConfigError(f"no source named {', '.join(map(repr, missing))} (have: {sorted(known)})")
    return [s for s in sources if s.name in wanted]


def task_specs(sources: Iterable[SourceConnectorConfig]) -> list[TaskSpec]:
    """Split each connector into its tasks (``task_count_for`` of its implementation), sorted by key."""
    specs: list[TaskSpec] = []
    for cfg in sources:
        impl: type[SourceTask] = load_implementation(cfg)
        count = max(1, int(impl.task_count_for(cfg)))
        specs.extend(TaskSpec(cfg, i, count) for i in range(count))
    return sorted(specs, key=lambda s: s.key)


class _FailedRunner:
    """Stands for a task whose runner could not even be built (its ``run`` reports the failure again)."""

    def __init__(self, stats: RunnerStats):
        self.stats = stats

    def run(self, _stop: threading.Event, _once: bool) -> RunnerStats:
        self.stats.state = "failed"
        return self.stats


class SourceWorker:
    """Runs source tasks in threads of this process, each supervised (restarted with backoff when it fails).

    Args:
        pipeline: the validated pipeline (Kafka config and connections).
        offsets_topic: the compacted offsets topic.
        offset_flush_interval_s: how often each task writes its position, seconds.
        producer_overrides: librdkafka producer properties (``.`` as ``_``), e.g. ``linger_ms``.
        retry: backoff of transient failures of every task (default :class:`RetryPolicy` ()).
        transactional: run every task with a transactional producer, whatever its
            ``exactly_once`` says (``--group`` mode sets it: zombie fencing).
    """

    def __init__(
        self,
        pipeline: SourcePipeline,
        *,
        offsets_topic: str = OFFSETS_TOPIC,
        offset_flush_interval_s: float = 1.0,
        producer_overrides: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        transactional: bool = False,
    ):
        from kernel.kafka.topics import internal_topic_options
        from schemas.store import SchemaStore

        self.pipeline = pipeline
        kconf = pipeline.kafka.librdkafka_config()
        internal = internal_topic_options(pipeline.kafka)
        # a task killed inside its transaction holds every read_committed read of the shared offsets
        # topic back until the transaction times out: a restart waits that out instead of failing
        self.offsets = OffsetStore(
            kconf,
            offsets_topic,
            timeout_s=max(TRANSACTION_TIMEOUT_MS / 1000 + 15, pipeline.kafka.request_timeout_s),
            **internal,
        )
        self.schema_store = SchemaStore(kconf, pipeline.kafka.schema_topic, **internal)
        self.offset_flush_interval_s = offset_flush_interval_s
        self.producer_overrides = dict(producer_overrides or {})
        self.retry = retry
        self.transactional = transactional
        self.runners: dict[str, TaskRunner] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stops: dict[str, threading.Event] = {}
        self.finished: dict[str, RunnerStats] = {}
        self.backoffs: dict[str, RestartBackoff] = {}
        metrics.TASK_STATES.workers.add(self)

    def _runner(self, spec: TaskSpec) -> TaskRunner:
        return TaskRunner(
            spec.config,
            self.pipeline.connection(spec.config.connection),
            kafka=self.pipeline.kafka,
            offsets=self.offsets,
            schema_store=self.schema_store,
            task_id=spec.task_id,
            task_count=spec.task_count,
            offset_flush_interval_s=self.offset_flush_interval_s,
            producer_overrides=self.producer_overrides,
            retry=self.retry,
            transactional=self.transactional,
        )

    def start(self, spec: TaskSpec, once: bool = False) -> TaskRunner:
        """Start one task in a new thread (no-op if it already runs here)."""
        if spec.key in self._threads and self._threads[spec.key].is_alive():
            return self.runners[spec.key]
        runner = self._runner(spec)
        stop = threading.Event()
        thread = threading.Thread(
            target=self._run_one, args=(spec, runner, stop, once), name=f"source-{spec.key}", daemon=True
        )
        self.runners[spec.key] = runner
        self._stops[spec.key] = stop
        self._threads[spec.key] = thread
        thread.start()
        log.info("started source task=%s", spec.key)
        return runner

    def _run_one(self, spec: TaskSpec, runner: TaskRunner | _FailedRunner, stop: threading.Event, once: bool) -> None:
        """Run a task and restart it with backoff each time it fails, until ``stop`` (the supervisor).

        A restarted task is a new :class:`TaskRunner` (new producer, new
        connector task), which resumes from the position stored in the offsets
        topic. With ``once`` (a backfill) a failed task is not restarted: the
        run ends and reports it. A task fenced by another worker (``--group``
        mode, a zombie) is not restarted either: its partition moved. Nor is a
        task stopped by a record that cannot be encoded (``stats.restartable``):
        it would stop on the same record again.
        """
        key = spec.key
        backoff = self.backoffs[key] = RestartBackoff(spec.config.errors)
        while True:
            stats = runner.run(stop, once)
            self.finished[key] = stats
            if stats.state != "failed" or stop.is_set() or once or getattr(runner, "_fenced", False):
                return
            if not stats.restartable:  # a record that cannot be encoded: its one error line said how to move on
                return
            if stats.commits or stats.cycles:
                backoff.succeeded()  # it made progress since the last restart: start the delays over
            delay = backoff.failed(stats.error or "failed")
            stats.state = "restarting"
            log.warning("source task=%s failed (%d in a row), restarting in %.1f s: %s", key, backoff.failures,
                        delay, stats.error)
            if not backoff.wait(stop, delay):
                stats.state = "failed"
                return
            backoff.restarting()
            metrics.TASK_RESTARTS.labels(spec.config.name, key).inc()
            try:
                runner = self._runner(spec)
            except Exception as exc:  # building the task failed: count it and back off again
                stats.state, stats.error = "failed", str(exc)
                runner = _FailedRunner(stats)
                continue
            self.runners[key] = runner
            log.info("source task=%s restarted (restart %d)", key, backoff.restarts)

    def stop(self, keys: Iterable[str] | None = None, timeout_s: float | None = 120.0) -> None:
        """Stop tasks (all when ``keys`` is ``None``) and wait until they stored their positions."""
        chosen = list(self._threads) if keys is None else [k for k in keys if k in self._threads]
        for key in chosen:
            self._stops[key].set()
        for key in chosen:
            self._threads[key].join(timeout_s)
            if self._threads[key].is_alive():
                log.error("source task=%s did not stop within %s s", key, timeout_s)
            else:
                del self._threads[key]
                del self._stops[key]

    def running(self) -> list[str]:
        """Keys of the tasks whose thread is alive."""
        return [k for k, t in self._threads.items() if t.is_alive()]

    def wait(self, stop: threading.Event, poll_s: float = 0.5) -> None:
        """Block until every task ended or ``stop`` is set (then stop them all)."""
        while self.running() and not stop.wait(poll_s):
            pass
        self.stop()

    def stats(self) -> dict[str, RunnerStats]:
        """Live stats of every task started here."""
        return {k: r.stats for k, r in list(self.runners.items())}

    def restarts(self) -> dict[str, int]:
        """Restarts per task key since this worker started."""
        return {k: b.restarts for k, b in self.backoffs.items()}
