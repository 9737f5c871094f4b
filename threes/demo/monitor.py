"""Watch a running pipeline: counts per stage and sink, consumer lag.

Everything here reads (Kafka watermarks and committed offsets, index counts,
``SELECT``s) about once a second, and lists the archive's objects at most every
``ProgressProbe.list_every_s`` seconds (a listing of thousands of keys costs
the S3 server and this process far more than the other readings), so the
watching costs the pipeline little on a small machine.

The sampled event -> sink latencies are measured in :mod:`threes.demo.latency`.

A pipeline without the PostgreSQL sink (no ``route_stats``: for example one in real-time
mode, which runs no aggregation) is watched and sampled on its other two sinks only.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from connectors.elasticsearch.connection import elasticsearch_client
from connectors.rds.connection import sql_engine
from connectors.s3.connection import s3_client
from kernel.kafka import clients

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Targets:
    """Where the example pipeline's stages and sinks are, read from its config.

    Attributes:
        pipeline: the validated pipeline.
        events_topic: flights in.
        enriched_topic: enriched flights out of the stream job.
        dead_letter_topics: the stream job's and the sync services' dead letter topics.
        es: ``(connection, index)`` of the Elasticsearch sink.
        pg: ``(connection, table, schema)`` of the RDS sink (``route_stats``); ``None`` when the pipeline
            has none (its stream has no aggregation update, e.g. in real-time mode).
        s3: ``(connection, bucket, prefix)`` of the S3 sink.
        groups: sync service name -> (consumer group, its topics).
    """

    pipeline: Any
    events_topic: str
    enriched_topic: str
    dead_letter_topics: tuple[str, ...]
    es: tuple[Any, str]
    pg: tuple[Any, str, str | None] | None
    s3: tuple[Any, str, str]
    groups: dict[str, tuple[str, tuple[str, ...]]]

    @classmethod
    def of(cls, pipeline: Any) -> Targets:
        """Find the stages and the sinks in a pipeline like the example's.

        The Elasticsearch and S3 sinks (the enriched flights) are required; the RDS sink
        (``route_stats``) is optional.

        Raises:
            ValueError: the pipeline lacks a stream job, an Elasticsearch sink or an S3 sink.
        """
        if pipeline.stream is None:
            raise ValueError("the pipeline has no stream job")
        sinks = {s.type: s for svc in pipeline.sync for s in svc.sinks}
        missing = {"elasticsearch_sink", "s3_sink"} - set(sinks)
        if missing:
            raise ValueError(f"the pipeline has no {', '.join(sorted(missing))}")
        es, pg, s3 = sinks["elasticsearch_sink"], sinks.get("rds_sink"), sinks["s3_sink"]
        conn = pipeline.connections
        return cls(
            pipeline=pipeline,
            events_topic=pipeline.stream.events.topic,
            enriched_topic=pipeline.stream.enriched_topic,
            dead_letter_topics=tuple(sorted({pipeline.stream.dead_letter_topic,
                                             *(s.dead_letter_topic for s in pipeline.sync)})),
            es=(conn[es.connection], es.index),
            pg=None if pg is None else (conn[pg.connection], pg.table, pg.schema_name),
            s3=(conn[s3.connection], s3.bucket, s3.prefix),
            groups={svc.name: (svc.consumer_group(), tuple(sorted({t for s in svc.sinks for t in s.topics})))
                    for svc in pipeline.sync},
        )

    @property
    def sinks(self) -> tuple[str, ...]:
        """The sinks this pipeline has, of ``("elasticsearch", "postgres", "s3")``, in that order."""
        return tuple(s for s in ("elasticsearch", "postgres", "s3") if s != "postgres" or self.pg is not None)


@dataclass
class Progress:
    """One reading of the pipeline.

    Attributes:
        at: ``time.time()`` of the reading.
        enriched_out: records in the enriched topic.
        dead_letters: records in the dead letter topics.
        es_docs: documents in the flights index (as of its last refresh).
        pg_rows: rows of route_stats (``None``: the pipeline has no such sink).
        pg_flights: ``SUM(flights)`` over route_stats (``None``: the pipeline has no such sink).
        s3_objects: objects under the archive prefix.
        committed: sync service -> records committed (durable in its targets).
        lag: sync service -> records not yet committed.
    """

    at: float
    enriched_out: int = 0
    dead_letters: int = 0
    es_docs: int = 0
    pg_rows: int | None = 0
    pg_flights: int | None = 0
    s3_objects: int = 0
    committed: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)


class ProgressProbe:
    """Reads :class:`Progress` from Kafka and the three sinks (clients kept open between readings).

    Args:
        targets: the stages and sinks.
        list_every_s: the archive's object listing is reused for this long, seconds.
    """

    def __init__(self, targets: Targets, list_every_s: float = 10.0):
        from kernel.kafka.topics import GroupOffsets

        self.targets = targets
        self.list_every_s = list_every_s
        self._listing: tuple[float, list[str]] | None = None
        self._ends: dict[tuple[str, int], int] = {}  # the last high watermark read of each partition
        self._table: Any = None
        kafka = targets.pipeline.kafka
        self._consumer = clients.kafka_consumer(kafka, f"threes-demo-probe-{uuid.uuid4().hex[:8]}")
        self._groups = GroupOffsets(kafka)  # one consumer per sync group, never subscribing
        self._es = elasticsearch_client(targets.es[0])
        self._engine = None if targets.pg is None else sql_engine(targets.pg[0], pool_size=1)
        self._s3 = s3_client(targets.s3[0])

    def end_offsets(self, topic: str) -> dict[int, int]:
        """High watermark per partition (empty when the topic does not exist yet).

        A partition whose watermarks cannot be read right now (``NOT_LEADER_FOR_PARTITION`` for a
        while after the topic was created, a broker restarting) keeps its last reading (0 before
        any): a reading is never an error and never goes backwards; the demo's deadline ends a
        Kafka that stays away.
        """
        from confluent_kafka import KafkaException, TopicPartition

        meta = self._consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        out = {}
        for p in meta.partitions:
            try:
                out[p] = self._ends[(topic, p)] = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=10
                )[1]
            except KafkaException as exc:
                log.debug("demo: end offset of %s[%d] not readable now: %s", topic, p, exc)
                out[p] = self._ends.get((topic, p), 0)
        return out

    def committed(self, group: str, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Committed offsets of a consumer group over ``partitions`` (empty while Kafka does not answer)."""
        from kernel.exceptions import SetupError

        try:
            return self._groups.read(group, partitions, 10)
        except SetupError as exc:
            log.debug("demo: committed offsets of %s not readable now: %s", group, exc)
            return {}

    def es_count(self, query: dict[str, Any] | None = None) -> int:
        """Documents of the flights index matching ``query`` (all when ``None``); 0 before it exists."""
        from elasticsearch import NotFoundError

        try:
            return int(self._es.count(index=self.targets.es[1], query=query or {"match_all": {}})["count"])
        except NotFoundError:
            return 0

    def pg_totals(self) -> tuple[int, int]:
        """``(rows, SUM(flights))`` of route_stats; ``(0, 0)`` before it exists or without such a sink."""
        from sqlalchemy import func, select

        tbl = self.pg_table()
        if tbl is None or self._engine is None:
            return 0, 0
        with self._engine.connect() as db:
            rows, flights = db.execute(select(func.count(), func.coalesce(func.sum(tbl.c.flights), 0))).one()
        return int(rows), int(flights)

    def es_refresh(self) -> None:
        """Refresh the flights index, so a count sees every document indexed so far."""
        self._es.indices.refresh(index=self.targets.es[1])

    def pg_table(self) -> Any:
        """The route_stats ``Table``, reflected once it exists (``None`` before, or without such a sink)."""
        from sqlalchemy import MetaData, Table
        from sqlalchemy.exc import NoSuchTableError

        if self.targets.pg is None:
            return None
        if self._table is None:
            _, table, schema = self.targets.pg
            try:
                self._table = Table(table, MetaData(), schema=schema, autoload_with=self._engine)
            except NoSuchTableError:
                return None
        return self._table

    def s3_keys(self, fresh: bool = False) -> list[str]:
        """Object keys under the archive prefix, as listed at most ``list_every_s`` ago (now when ``fresh``)."""
        from threes.demo.sinks import list_objects

        now = time.monotonic()
        if fresh or self._listing is None or now - self._listing[0] >= self.list_every_s:
            conn, bucket, prefix = self.targets.s3
            self._listing = (now, [o["Key"] for o in list_objects(conn, bucket, prefix, client=self._s3)])
        return self._listing[1]

    def read(self, fresh: bool = False) -> Progress:
        """One reading of every stage and sink (``fresh``: list the archive now, see :meth:`s3_keys`)."""
        p = Progress(at=time.time())
        p.enriched_out = sum(self.end_offsets(self.targets.enriched_topic).values())
        p.dead_letters = sum(sum(self.end_offsets(t).values()) for t in self.targets.dead_letter_topics)
        p.es_docs = self.es_count()
        if self.targets.pg is None:
            p.pg_rows = p.pg_flights = None
        else:
            p.pg_rows, p.pg_flights = self.pg_totals()
        p.s3_objects = len(self.s3_keys(fresh))
        for name, (group, topics) in self.targets.groups.items():
            ends = {(t, part): o for t in topics for part, o in self.end_offsets(t).items()}
            done = self.committed(group, ends)
            p.committed[name] = sum(done.values())
            p.lag[name] = sum(max(0, end - done.get(tp, 0)) for tp, end in ends.items())
        return p

    def close(self) -> None:
        """Close the clients."""
        self._consumer.close()
        self._groups.close()
        self._es.close()
        if self._engine is not None:
            self._engine.dispose()
