"""What ``threes run`` starts and what each part waits for, derived from the config alone (no I/O).

The three parts of a pipeline and their start-up dependencies:

* **sources** need nothing; each creates its compacted state topic. They are
  *ready* when every source connector finished its first cycle (the initial
  snapshot of its system, read until caught up), read from the
  ``threes_source_cycle_seconds`` histogram of their metrics endpoint.
* **stream** (the stream job) needs its snapshot topics complete: the sources
  ready when they run here, otherwise the topics present and every source of
  this config that writes one with a stored position (it has written). It also
  needs the events topic: ``threes run`` creates it from
  ``stream.events.topic_spec`` when it is missing. The job creates its enriched,
  dead letter and update topics itself, then loads its snapshots; it is *ready*
  when its metrics endpoint answers (served once every snapshot is loaded).
* **sync** (every sync service, one process) needs the topics its sinks read:
  update topics are created by the stream job, state topics by the sources;
  a topic nothing in the config creates is awaited from an outside producer.

Kafka is the buffer between the parts, so none needs another *running*:
``--only`` splits them over deployments, and each waits for what it needs in
Kafka, not for a process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.exceptions import ConfigError

COMPONENTS: tuple[str, ...] = ("sources", "stream", "sync")
"""The parts of a pipeline, in start order (stopped in reverse)."""


def parse_only(values: Iterable[str] | None) -> tuple[str, ...]:
    """The parts chosen with ``--only`` (repeatable, or comma-separated), in start order.

    Args:
        values: e.g. ``["sources,stream"]`` or ``["sync", "stream"]``; empty or ``None``: every part.

    Returns:
        A subset of :data:`COMPONENTS` in their order.

    Raises:
        ConfigError: a value is not one of ``sources``, ``stream``, ``sync``.
    """
    chosen: set[str] = set()
    for value in values or []:
        for item in value.split(","):
            name = item.strip().lower()
            if not name:
                continue
            if name not in COMPONENTS:
                raise ConfigError(f"--only {item.strip()!r}: expected one of {', '.join(COMPONENTS)}")
            chosen.add(name)
    if not chosen:
        return COMPONENTS
    return tuple(c for c in COMPONENTS if c in chosen)


@dataclass(frozen=True)
class TopicNeed:
    """A topic a part waits for.

    Attributes:
        topic: the topic's name.
        creator: who creates it, for the message shown while waiting
            (``source airports``, ``the stream job``, ``an outside producer``).
    """

    topic: str
    creator: str


@dataclass
class Part:
    """One part of the run: a ``threes`` command and what it waits for.

    Attributes:
        name: ``sources``, ``stream`` or ``sync``.
        args: the ``threes`` arguments that run it.
        wait_sources_ready: start only once the sources of this run are ready.
        topics: topics that must exist first.
        positions: source connectors (run elsewhere) whose stored position must exist first.
        create_events: ``(topic, TopicSpec)`` of the events topic to create when missing.
        metrics_ports: where its metrics endpoints answer once it is ready (empty: ready once started).
        stop_timeout_s: how long its clean stop may take before its group is killed, seconds.
    """

    name: str
    args: list[str]
    wait_sources_ready: bool = False
    topics: list[TopicNeed] = field(default_factory=list)
    positions: list[str] = field(default_factory=list)
    create_events: tuple[str, Any] | None = None
    metrics_ports: list[int] = field(default_factory=list)
    stop_timeout_s: float = 60.0


def topic_creators(pipeline: Any) -> dict[str, str]:
    """Who creates each topic the config names: topic -> ``source <name>`` / ``the stream job``."""
    creators: dict[str, str] = {}
    for source in pipeline.sources:
        creators.setdefault(source.topic, f"source {source.name}")
    stream = pipeline.stream
    if stream is not None:
        for topic in (stream.enriched_topic, stream.dead_letter_topic, *(u.topic for u in stream.updates)):
            creators.setdefault(topic, "the stream job")
    return creators


def plan_run(
    pipeline: Any,
    config: Path,
    only: Sequence[str] = COMPONENTS,
    *,
    offsets_topic: str = "_threes_offsets",
    sources_metrics_port: int | None = None,
    stream_metrics_port: int | None = None,
) -> list[Part]:
    """The parts to run, in start order, each with what it waits for.

    Args:
        pipeline: the validated pipeline.
        config: the YAML path the children read.
        only: the parts chosen (:func:`parse_only`).
        offsets_topic: where the sources keep their positions.
        sources_metrics_port: the port the sources' metrics are served on (their readiness).
        stream_metrics_port: the stream job's metrics port when the config sets none.

    Returns:
        The parts the config has among ``only`` (a config without a ``stream:`` has no stream part).

    Raises:
        ConfigError: none of the chosen parts is in the config.
    """
    sources = list(pipeline.sources)
    services = list(pipeline.sync)
    stream = pipeline.stream
    creators = topic_creators(pipeline)
    path = str(config)
    parts: list[Part] = []
    if "sources" in only and sources:
        args = ["source", "run", path, "--offsets-topic", offsets_topic]
        if sources_metrics_port is not None:
            args += ["--metrics-port", str(sources_metrics_port)]
        parts.append(Part("sources", args, metrics_ports=[p for p in [sources_metrics_port] if p]))
    if "stream" in only and stream is not None:
        parts.append(_stream_part(pipeline, path, "sources" in only and bool(sources), creators, stream_metrics_port))
    if "sync" in only and services:
        topics = list(dict.fromkeys(t for svc in services for sink in svc.sinks for t in sink.topics))
        parts.append(Part(
            "sync", ["sync", "run", path],
            topics=[TopicNeed(t, creators.get(t, "an outside producer")) for t in topics],
            metrics_ports=[svc.metrics_port for svc in services if svc.metrics_port],
        ))
    if not parts:
        have = [c for c, present in zip(COMPONENTS, (sources, stream is not None, services), strict=True) if present]
        raise ConfigError(f"{config}: nothing to run: --only {','.join(only)} but the config has "
                          f"{', '.join(have) or 'no sources, stream job or sync services'}")
    return parts


def _stream_part(pipeline: Any, path: str, with_sources: bool, creators: dict[str, str],
                 stream_metrics_port: int | None) -> Part:
    """The stream job's part: it waits for the sources' first snapshot when they run here, else for positions.

    Args:
        pipeline: the validated pipeline (it has a ``stream:``).
        path: the YAML path the child reads.
        with_sources: the sources run in this run too.
        creators: topic -> who creates it (:func:`topic_creators`).
        stream_metrics_port: the stream job's metrics port when the config sets none.
    """
    stream, sources = pipeline.stream, list(pipeline.sources)
    snapshot_topics = list(dict.fromkeys(t for snap in stream.snapshots for t in snap.topics))
    port = stream.metrics_port or stream_metrics_port
    args = ["stream", "run", path]
    if stream.metrics_port is None and stream_metrics_port is not None:
        args += ["--metrics-port", str(stream_metrics_port)]
    part = Part(
        "stream", args, metrics_ports=[port] if port else [],
        create_events=(stream.events.topic, stream.events.topic_spec),
        # the running micro-batch (up to 30 s), the queries' last events (up to 30 s), the checkpoint
        stop_timeout_s=120.0,
    )
    if with_sources:
        part.wait_sources_ready = True
        part.topics = [TopicNeed(t, creators.get(t, "an outside producer")) for t in snapshot_topics
                       if t not in {s.topic for s in sources}]
    else:
        part.topics = [TopicNeed(t, creators.get(t, "an outside producer")) for t in snapshot_topics]
        part.positions = sorted(s.name for s in sources if s.topic in snapshot_topics)
    return part
