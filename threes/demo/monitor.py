"""Watch a running pipeline: counts per stage and sink, consumer lag, sampled event -> sink latencies.

Everything here reads (Kafka watermarks and committed offsets, index counts,
``SELECT``s) about once a second, and lists the archive's objects at most every
``ProgressProbe.list_every_s`` seconds (a listing of thousands of keys costs
the S3 server and this process far more than the other readings), so the
watching costs the pipeline little on a small machine.

Latency is measured on a sample of the events (every ``every``-th replayed
flight): the time from its produce call to the first poll that finds it in
a sink. For Elasticsearch that is the document (``mget`` of the sampled ids);
for S3 the archived row (the ``key`` column of each new object); for the
PostgreSQL ``route_stats`` row, the moment the row of its route and day
counts at least as many flights as had been replayed for that group when the
sampled one was. The resolution is the polling interval (about 1 s).

A pipeline without the PostgreSQL sink (no ``route_stats``: for example one in real-time
mode, which runs no aggregation) is watched and sampled on its other two sinks only.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
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


def doc_id(row: dict[str, Any], key: Sequence[str]) -> str:
    """The Elasticsearch ``_id`` of a flight (``ElasticsearchSink``: key fields joined by ``|``)."""
    return "|".join(str(row[k]) for k in key)


def key_id(row: dict[str, Any], key: Sequence[str]) -> str:
    """The archived ``key`` of a flight (``SinkRecord.key_id``: the key as sorted compact JSON)."""
    return json.dumps({k: row[k] for k in key}, sort_keys=True, default=str, separators=(",", ":"))


@dataclass
class Sample:
    """One sampled event and when each sink first showed it.

    Attributes:
        produced: ``time.time()`` of its produce call.
        doc_id: its Elasticsearch ``_id``.
        key_id: its archived key.
        group: its route_stats key.
        group_count: flights of that group replayed up to and including it.
        seen: sink -> ``time.time()`` it was first seen there.
    """

    produced: float
    doc_id: str
    key_id: str
    group: tuple[Any, ...]
    group_count: int
    seen: dict[str, float] = field(default_factory=dict)


class LatencySampler:
    """Sample replayed events and find them in the sinks (see the module docstring).

    Args:
        probe: the sinks' clients (its targets say which sinks are sampled; all of :attr:`SINKS`
            when ``None``).
        key: the flights' key fields.
        group_by: the route_stats key fields.
        every: sample one event in this many.
    """

    SINKS = ("elasticsearch", "postgres", "s3")

    def __init__(self, probe: ProgressProbe, key: Sequence[str], group_by: Sequence[str], every: int = 500):
        self.probe = probe
        self.key = list(key)
        self.group_by = list(group_by)
        self.every = max(1, every)
        self.sinks: tuple[str, ...] = self.SINKS if probe is None else probe.targets.sinks
        self.samples: list[Sample] = []
        self._groups: Counter[tuple[Any, ...]] = Counter()
        self._lock = threading.Lock()
        self._read_objects: set[str] = set()

    def on_produce(self, index: int, row: dict[str, Any]) -> None:
        """Replay hook: count the row's group, and sample it every ``every`` rows (cheap)."""
        group = tuple(row[g] for g in self.group_by)
        self._groups[group] += 1
        if index % self.every == 0:
            sample = Sample(time.time(), doc_id(row, self.key), key_id(row, self.key), group, self._groups[group])
            with self._lock:
                self.samples.append(sample)

    def _pending(self, sink: str) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if sink not in s.seen]

    def poll(self) -> None:
        """Look for the pending samples in each sink once (the archive as the probe last listed it)."""
        self._poll_es()
        self._poll_pg()
        self._poll_s3()

    def _poll_es(self) -> None:
        from elasticsearch import NotFoundError

        pending = self._pending("elasticsearch")[:2000]
        if not pending:
            return
        try:
            docs = self.probe._es.mget(index=self.probe.targets.es[1], ids=[s.doc_id for s in pending],
                                       source=False)["docs"]
        except NotFoundError:
            return
        now = time.time()
        found = {d["_id"] for d in docs if d.get("found")}
        for s in pending:
            if s.doc_id in found:
                s.seen["elasticsearch"] = now

    def _poll_pg(self) -> None:
        from sqlalchemy import select, tuple_

        if "postgres" not in self.sinks:
            return
        pending = self._pending("postgres")
        if not pending:
            return
        tbl = self.probe.pg_table()
        if tbl is None or self.probe._engine is None:
            return
        groups = sorted({s.group for s in pending})
        cols = [tbl.c[g] for g in self.group_by]
        counts: dict[tuple[Any, ...], int] = {}
        with self.probe._engine.connect() as db:
            for i in range(0, len(groups), 500):
                stmt = select(*cols, tbl.c.flights).where(tuple_(*cols).in_(groups[i:i + 500]))
                for row in db.execute(stmt):
                    counts[tuple(row[:-1])] = int(row[-1])
        now = time.time()
        for s in pending:
            if counts.get(s.group, 0) >= s.group_count:
                s.seen["postgres"] = now

    def _poll_s3(self) -> None:
        from threes.demo.sinks import read_parquet_objects

        pending = self._pending("s3")
        if not pending:
            return
        new = [k for k in self.probe.s3_keys() if k.endswith(".parquet") and k not in self._read_objects]
        if not new:
            return
        conn, bucket, _ = self.probe.targets.s3
        table = read_parquet_objects(conn, bucket, new, columns=["key"], client=self.probe._s3)
        self._read_objects.update(new)
        now = time.time()
        archived = set(table.column("key").to_pylist()) if table is not None else set()
        for s in pending:
            if s.key_id in archived:
                s.seen["s3"] = now

    def latencies(self) -> dict[str, dict[str, float | int | None]]:
        """Per sink the pipeline has: samples seen, p50 and p99 latency in seconds (``None`` without samples)."""
        import numpy as np

        out: dict[str, dict[str, float | int | None]] = {}
        with self._lock:
            samples = list(self.samples)
        for sink in self.sinks:
            values = np.array([s.seen[sink] - s.produced for s in samples if sink in s.seen])
            out[sink] = {
                "samples": int(len(values)),
                "of": len(samples),
                "p50_s": round(float(np.percentile(values, 50)), 2) if len(values) else None,
                "p99_s": round(float(np.percentile(values, 99)), 2) if len(values) else None,
            }
        return out
