"""Sync sinks against raw client baselines and quixstreams' sinks, side by side in one run, on the same data.

    python benchmarks/sync_sinks.py [--records 50000] [--quix-records 300000] [--rounds 3]
        [--only es|pg|s3|s3pq|quix|fetch|rss ...]

**Inputs come from the wire.** The sinks' input is update records as the stream
job writes them: keys and values single-object Avro (the project's serde,
``schemas.serde.AvroSerializer`` with an ``InMemorySchemaStore``) and a
``version`` header (``kernel.updates.encode_version``), held in message
objects with the ``confluent_kafka.Message`` methods the service reads. Sinks
are driven as the sync service drives them: batches of 10k messages of 4
partitions, each handed to ``BatchWriter.run`` in a worker thread, which
decodes it (``BatchWriter.decode``: keys and headers per record, values in
columns, one Arrow table per writer schema) and then calls ``sink.write``, up
to the sink's adaptive concurrency limit. The decode is inside the timed
region, as in the service. The one-partition figure (one batch at a time) is
printed below each sink's.

The raw library baselines (the "ceiling") start from pre-built Python rows,
docs or bytes and pay no decode at all, so a sink's ratio to them is conservative.

* Elasticsearch: docs/s of ``ElasticsearchSink`` (decode, external versions,
  newest-per-key, per-item results, adaptive concurrency up to 4) vs
  ``elasticsearch.helpers.parallel_bulk`` (4 threads, 500 per chunk) of the same docs as dicts.
* PostgreSQL: rows/s of ``RdsSink`` (decode, conditional upsert) vs raw psycopg:
  ``COPY`` of the rows as tuples into a temp table then ``INSERT ... SELECT ... ON
  CONFLICT DO UPDATE``, same rows, same 10k-row transactions.
* S3: MB/s of ``S3Sink`` in JSON Lines (decode, encoding, upload) vs boto3
  ``upload_fileobj`` of the same bytes already encoded. What bounds the ratio here: the
  sink's own work (keys, headers and records, the values in columns, the NDJSON bodies)
  takes longer than ``put_object`` of the finished bodies, on a machine whose other core
  runs the S3 server, so even fully overlapped with the uploads the sink stays near half
  the baseline, not 0.9 (the breakdown: ``sync_sinks/s3_breakdown`` in ``RESULTS.md``).
* S3 Parquet (``--only s3pq``): records/s on records shaped like the demo's (the
  51-field enriched flight), in small objects (~150 rows, 67 ``dt=`` folders per
  batch) and large ones (25k rows). "after" is the service now (values decoded in
  columns, Parquet written from the Arrow table); "before" is the service as it
  was: values decoded per record by fastavro (``BatchWriter``'s per-record path,
  which it took for every schema before the columnar decode) and the sink as it
  was (types inferred per object, objects uploaded one after another with
  ``upload_fileobj``), side by side in the same run.
* quixstreams (``--only quix``, targets ``--quix-targets es,pg,s3``): records/s of
  threes' real ``SyncService`` vs a quixstreams 3.28.1 ``Application`` with its own
  community sink, on the same update topic. ``--quix-records`` update records (300k: at
  50k, each side's last 1 s batch or commit interval was half of the run; distinct
  keys, version 1) are produced once to a fresh real Kafka topic of 4 partitions
  (writer schema in the real schema topic); then, per target and round, each
  system consumes the whole topic with a consumer group of its own, one after the
  other (alternating which goes first), each in its own process:

  - threes: ``SyncService`` built from the project's config models
    (``pipeline_from_dict``), one sink, its defaults (batches of 10k records or
    1 s, up to 4 concurrent writes or requests per sink), except the S3 sink's
    ``rotate_interval_s`` = 1 s (its default of 60 s would hold every object back
    a minute; an S3 object rotates on records, bytes and age only, as quixstreams'
    file sink writes at each 1 s commit) and ``format: jsonl``.
  - quixstreams: ``Application(auto_offset_reset="earliest", commit_interval=1.0)``
    (quixstreams' sinks flush at each checkpoint; 1 s matches threes' batch age,
    its default is 5 s), ``sdf.sink(...)`` of
    ``quixstreams.sinks.community.postgresql.PostgreSQLSink(primary_key_columns="id",
    upsert_on_primary_key=True, include_metadata=False)`` (an upsert by key like
    ``RdsSink``'s, without quixstreams' two metadata columns),
    ``...elasticsearch.ElasticsearchSink`` (its defaults: dynamic mapping, serial
    ``helpers.bulk`` chunks of 500, document id = the key as text, like threes'),
    or ``...file.s3.S3FileSink(format=JSONFormat(dumps=orjson))`` (JSON Lines; the
    default stdlib ``json`` writer refuses the ``datetime`` values, and orjson is
    the faster choice for quixstreams). quixstreams' ``ElasticsearchSink.setup()``
    calls ``GET /``, which the minimal integ-test Elasticsearch server answers
    405: a subclass replaces that one call by a cluster health check;
    the write path is quixstreams' own.
  - Values for quixstreams: it has no single-object Avro deserializer, so the
    quixstreams process uses a custom ``quixstreams.models.serializers.Deserializer`` that
    calls our ``schemas.serde.AvroDeserializer`` (fastavro, one record at a time,
    as quixstreams' own deserializers work), for keys (long -> int) and values,
    on the same bytes threes reads. JSON would have needed a second topic with
    other bytes; the same bytes compare the sinks, not the encodings. Its schema
    store is in memory, holding the benchmark's writer schemas.
  - quixstreams knows no ``version`` header: its upsert is last-write-wins and
    its Elasticsearch documents carry no external version, so threes does more
    work per record (version-guarded upsert, versioned index actions). Its
    PostgreSQL sink also takes a batch's columns from the batch's first row, whose
    null fields are then left out for the whole batch: less work for it, kept as it is.
  - Time: from the group's first partition assignment to the moment its committed
    offsets reach the topic's high watermarks (both commit only after their sink
    flushed, so the records are durable), polled every 50 ms; the target is then
    checked to hold every record (rows, docs, JSON lines). Process start to
    assignment (imports, connections, group join; the threes process imports
    polars and pyarrow there, not at its first batch) is reported apart
    (``*_startup_s``). Both rates include one batch age / checkpoint interval (1 s)
    of latency at the end, which weighs more the fewer the records. Ratio keys
    ``<target>_vs_quix`` = threes / quixstreams records/s; target >= 3.
  - quixstreams 3.28.1 requires ``confluent-kafka<2.13`` and threes ``>=2.16``: the
    two cannot share an environment. pyproject's ``bench`` extra declares the
    peer; this benchmark installs it into its own virtualenv
    (``.threes/bench-venv``, once, from that extra) and runs the quixstreams side
    there (``--quix-python`` points at another interpreter). A run that fails
    (a quixstreams error, a timeout) is reported with its reason, never as a figure.
* Fetching (``--only fetch``): seconds to drain a backlog of ``--quix-records`` update records (4
  partitions) with a bare ``confluent_kafka.Consumer`` (``consume(1000)`` in a loop, headers
  read), once with librdkafka's own ``fetch.queue.backoff.ms`` (1000 ms) and once with threes'
  consumer defaults (``kernel.kafka.clients.CONSUMER_DEFAULTS``), alternating, each with a new
  group; ``fetch_ratio_default_vs_threes`` = default seconds / threes seconds (> 1: threes
  drains faster). With the default, a consumer whose prefetch queue filled waited ~1 s
  before fetching that partition again.
* Memory: peak RSS of a sync service process (real consumer, batching,
  backpressure) whose sink is throttled to a tenth of the input rate, vs its
  configured ``buffer_max_bytes``.

Rounds alternate baseline and sink; the median of each is reported. Prints a
table, then one JSON line with every figure and ratio. Targets: every ratio to
a baseline >= 0.9, every ``*_vs_quix`` >= 3; peak RSS <= buffer bound + 150 MB.
Needs the local stack (``threes local up``).
"""

from __future__ import annotations

import argparse
import atexit
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fastavro

from connectors.elasticsearch.connection import elasticsearch_client
from connectors.rds.connection import sql_engine
from connectors.s3.connection import s3_client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# only modules both environments have at import time (the quixstreams child runs in its own virtualenv)
from bench_topics import BenchTopics  # noqa: E402

from schemas.serde import fingerprint  # noqa: E402

if TYPE_CHECKING:
    from connectors.api.sink_records import SinkBatch, SinkRecord
    from connectors.elasticsearch.connection import ElasticsearchConnection
    from connectors.rds.connection import RdsConnection
    from connectors.s3.connection import S3Connection
    from kernel.config.models import KafkaConfig
    from sync_service.batching import Job
    from sync_service.writer import BatchWriter
    from threes.local import Endpoints

SCHEMA = {
    "type": "record", "name": "Flight", "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "carrier", "type": "string"},
        {"name": "flight", "type": "int"},
        {"name": "origin", "type": "string"},
        {"name": "dest", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"], "default": None},
        {"name": "arr_delay", "type": ["null", "double"], "default": None},
        {"name": "distance", "type": "int"},
        {"name": "tailnum", "type": ["null", "string"], "default": None},
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}
PARSED = fastavro.parse_schema(SCHEMA)
FP = fingerprint(SCHEMA)
BATCH = 10_000
PARTITIONS = 4  # update-topic partitions: the service writes their batches concurrently
T0 = datetime(2013, 1, 1, tzinfo=UTC)
KAFKA_TS_MS = 1_700_000_000_000  # the wire messages' Kafka timestamp
QUIX_REQUIREMENT_EXTRA = "bench"  # pyproject's optional-dependencies entry holding the quixstreams peer


def row(i: int) -> dict[str, Any]:
    return {
        "id": i, "carrier": ("UA", "AA", "B6", "DL", "EV")[i % 5], "flight": 100 + i % 4000,
        "origin": ("JFK", "LGA", "EWR")[i % 3], "dest": f"D{i % 97:02d}",
        "dep_delay": float(i % 60 - 10), "arr_delay": None if i % 11 == 0 else float(i % 80 - 20),
        "distance": 200 + i % 2500, "tailnum": f"N{i % 3322:04d}", "time_hour": T0 + timedelta(hours=i % 8760),
    }


# -- the wire: encoded update messages, decoded by the service's BatchWriter ----------------------

class WireMessage:
    """An update record as consumed: the ``confluent_kafka.Message`` methods the sync service reads."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes, value: bytes | None,
                 headers: list[tuple[str, bytes]]):
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers = key, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, KAFKA_TS_MS)  # TIMESTAMP_CREATE_TIME

    def error(self) -> None:
        return None


class _PerRecordDecoder:
    """A columnar decoder that supports no schema: ``BatchWriter`` then decodes every value with fastavro
    (its per-record path, the only one the service had before the columnar decode)."""

    def supports(self, fingerprint: bytes) -> bool:
        return False

    def decode_objects(self, fingerprint: bytes, bodies: Any) -> None:
        return None  # keys too: per record


class Wire:
    """Update messages of one value schema, encoded with the project's serde, and writers that decode them.

    Args:
        schema: the value writer schema (keys are Avro ``long``).
    """

    def __init__(self, schema: dict[str, Any]):
        from schemas.columnar import ColumnarDecoder
        from schemas.serde import AvroSerializer
        from schemas.store import InMemorySchemaStore

        self.store = InMemorySchemaStore()
        self.key_ser = AvroSerializer("long", self.store)
        self.value_ser = AvroSerializer(schema, self.store)
        self.columnar = ColumnarDecoder(self.store)  # one per service, shared by its writers

    def messages(self, partition: int, items: Iterable[tuple[int, dict[str, Any]]], version: int = 1,
                 topic: str = "bench") -> list[WireMessage]:
        """Encode ``(key, value)`` pairs as consecutive messages of one partition; the offset is the key."""
        from kernel.updates import encode_version

        headers = [("version", encode_version(version))]
        return [WireMessage(topic, partition, key, self.key_ser(key), self.value_ser(value), headers)
                for key, value in items]

    def warm(self, raws: list[list[WireMessage]]) -> None:
        """Decode a few messages once, outside any timing: imports (polars, pyarrow) and the columnar plan,
        which a running service has paid long before."""
        from types import SimpleNamespace

        from sync_service.batching import Job

        stand_in = SimpleNamespace(name="warm", config=SimpleNamespace(topics=[raws[0][0].topic()]))
        head = raws[0][:100]
        self.writer(stand_in).decode(Job("warm", head[0].topic(), head[0].partition(), head, 0))

    def writer(self, sink: Any, columnar: bool = True) -> BatchWriter:
        """The service's ``BatchWriter`` of ``sink``: columnar values, or (``columnar=False``) fastavro per record."""
        from kernel.config.policies import RetryPolicy
        from schemas.serde import AvroDeserializer
        from sync_service.metrics import SyncMetrics
        from sync_service.writer import BatchWriter

        return BatchWriter("bench", sink, AvroDeserializer(self.store), producer=None,
                           dead_letter_topic="bench.dlq", retry=RetryPolicy(), metrics=SyncMetrics("bench"),
                           columnar=self.columnar if columnar else _PerRecordDecoder())  # type: ignore[arg-type]


def wire_batches(wire: Wire, n: int) -> list[list[WireMessage]]:
    """``n`` update records of :func:`row` in batches of 10k messages, the batches spread over 4 partitions."""
    return [wire.messages(b % PARTITIONS, ((i, row(i)) for i in range(start, min(n, start + BATCH))))
            for b, start in enumerate(range(0, n, BATCH))]


def jobs(sink_name: str, raws: list[list[WireMessage]]) -> list[Job]:
    """Fresh jobs (nothing decoded yet) of the raw batches, as the service cuts them from its buffers."""
    from sync_service.batching import Job, message_size

    return [Job(sink_name, raw[0].topic(), raw[0].partition(), raw, sum(map(message_size, raw))) for raw in raws]


def decoded(writer: BatchWriter, raws: list[list[WireMessage]]) -> list[SinkBatch]:
    """The raw batches decoded once, outside any timing (baselines' bytes, object counts)."""
    out = []
    for job in jobs(writer.sink.name, raws):
        batch = writer.decode(job)
        assert not job.dead, job.dead[:1]
        out.append(batch)
    return out


def drive(writer: BatchWriter, todo: list[Job], partitions: int) -> None:
    """Write jobs the way the sync service does: ``BatchWriter.run`` (decode, then ``sink.write``) in workers.

    ``partitions=1``: one partition, one batch at a time. Otherwise batches of
    ``partitions`` partitions in flight at once, up to the sink's adaptive
    concurrency limit (``sync_service.dispatch.BatchDispatch._dispatch``); ``run`` holds a
    limiter slot around each write unless the sink splits its own requests.

    Raises:
        RuntimeError: a batch was not written whole (an error, or dead letters).
    """
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    sink = writer.sink

    def write_one(job: Job) -> None:
        outcome = writer.run(job)
        if outcome.status != "done" or outcome.dead:
            raise RuntimeError(f"sink {sink.name}: batch {job.topic}[{job.partition}]@{job.first_offset} "
                               f"{outcome.status}, dead={outcome.dead}: {outcome.error or job.dead[:1]}")

    if partitions == 1:
        for job in todo:
            write_one(job)
        return
    with ThreadPoolExecutor(max_workers=partitions) as pool:
        pending: set[Any] = set()
        for job in todo:
            while len(pending) >= min(partitions, sink.limiter.limit):
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    f.result()
            pending.add(pool.submit(write_one, job))
        for f in pending:
            f.result()


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- Elasticsearch ------------------------------------------------------------------------------

def bench_es(conn: ElasticsearchConnection, n: int, rounds: int) -> dict[str, float]:
    from elasticsearch import helpers

    from connectors.elasticsearch.config import ElasticsearchSinkConfig
    from connectors.elasticsearch.sink import ElasticsearchSink
    from sync_service.concurrency import AdaptiveConcurrency

    es = elasticsearch_client(conn)
    docs = [row(i) for i in range(n)]
    wire = Wire(SCHEMA)
    raws = wire_batches(wire, n)
    wire.warm(raws)
    base_rates, sink_rates, seq_rates = [], [], []
    for _r in range(rounds):
        index = f"bench-base-{uuid.uuid4().hex[:8]}"

        def baseline(index: str = index) -> None:
            actions = ({"_index": index, "_id": str(d["id"]), "_source": d} for d in docs)
            for ok, info in helpers.parallel_bulk(es, actions, thread_count=4, chunk_size=500):
                assert ok, info

        base_rates.append(n / timed(baseline))
        es.indices.delete(index=index)
        for label, partitions, rates in (("sink", PARTITIONS, sink_rates), ("seq", 1, seq_rates)):
            index = f"bench-{label}-{uuid.uuid4().hex[:8]}"
            cfg = ElasticsearchSinkConfig(name="bench-es", type="elasticsearch_sink", connection="es",
                                          topics=["bench"], index=index, max_concurrency=4)
            sink = ElasticsearchSink(cfg, conn, limiter=AdaptiveConcurrency("bench-es", 4))
            sink.open()
            writer, todo = wire.writer(sink), jobs(sink.name, raws)
            rates.append(n / timed(lambda writer=writer, todo=todo, p=partitions: drive(writer, todo, p)))
            es.indices.refresh(index=index)
            assert es.count(index=index)["count"] == n
            sink.close()
            es.indices.delete(index=index)
    es.close()
    return {"es_baseline_docs_s": statistics.median(base_rates), "es_sink_docs_s": statistics.median(sink_rates),
            "es_sink_one_partition_docs_s": statistics.median(seq_rates)}


# -- PostgreSQL ---------------------------------------------------------------------------------

def bench_pg(conn: RdsConnection, n: int, rounds: int) -> dict[str, float]:
    import psycopg
    from psycopg import sql
    from sqlalchemy import MetaData, Table, text

    from connectors.api.sink_records import SinkBatch
    from connectors.rds.config import RdsSinkConfig
    from connectors.rds.sink import RdsSink
    from connectors.rds.sink_types import table_from_avro
    from sync_service.concurrency import AdaptiveConcurrency

    engine = sql_engine(conn)
    dsn = conn.sqlalchemy_url().set(drivername="postgresql").render_as_string(hide_password=False)
    rows = [row(i) for i in range(n)]
    cols = [f["name"] for f in SCHEMA["fields"]] + ["_version"]
    wire = Wire(SCHEMA)
    raws = wire_batches(wire, n)
    wire.warm(raws)
    base_rates, sink_rates, seq_rates = [], [], []
    for _r in range(rounds):
        name = f"bench_base_{uuid.uuid4().hex[:8]}"
        table_from_avro(name, SCHEMA, ["id"], "_version").create(engine)

        def baseline(name: str = name, version: int = 1) -> None:
            with psycopg.connect(dsn) as pgc:
                for start in range(0, n, BATCH):
                    with pgc.transaction(), pgc.cursor() as cur:
                        cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS stage (LIKE {} INCLUDING DEFAULTS) "
                                            "ON COMMIT DELETE ROWS").format(sql.Identifier(name)))
                        with cur.copy(sql.SQL("COPY stage ({}) FROM STDIN").format(
                                sql.SQL(", ").join(map(sql.Identifier, cols)))) as copy:
                            for d in rows[start:start + BATCH]:
                                copy.write_row([*d.values(), version])
                        sets = sql.SQL(", ").join(
                            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                            for c in cols if c != "id")
                        cur.execute(sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM stage ON CONFLICT (id) DO UPDATE "
                                            "SET {s}").format(t=sql.Identifier(name),
                                                              c=sql.SQL(", ").join(map(sql.Identifier, cols)), s=sets))

        base_rates.append(n / timed(baseline))
        Table(name, MetaData()).drop(engine)
        for label, partitions, rates in (("sink", PARTITIONS, sink_rates), ("seq", 1, seq_rates)):
            name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
            cfg = RdsSinkConfig(name="bench-pg", type="rds_sink", connection="pg", topics=["bench"], table=name,
                                key=["id"], create_table=True)
            sink = RdsSink(cfg, conn, limiter=AdaptiveConcurrency("bench-pg", cfg.max_concurrency))
            sink.open()
            writer = wire.writer(sink)
            # create the table outside the timing, from one record decoded per record
            sink.write(SinkBatch("bench", 0, 0, 0, [writer.decode_one(raws[0][0])]))
            todo = jobs(sink.name, raws)
            rates.append(n / timed(lambda writer=writer, todo=todo, p=partitions: drive(writer, todo, p)))
            sink.close()
            with engine.connect() as c:
                assert c.execute(text(f'SELECT count(*) FROM "{name}"')).scalar() == n
            Table(name, MetaData()).drop(engine)
    engine.dispose()
    return {"pg_baseline_rows_s": statistics.median(base_rates), "pg_sink_rows_s": statistics.median(sink_rates),
            "pg_sink_one_partition_rows_s": statistics.median(seq_rates)}


# -- S3 -----------------------------------------------------------------------------------------

def bench_s3(conn: S3Connection, n: int, rounds: int) -> dict[str, float]:
    from connectors.s3.config import S3SinkConfig
    from connectors.s3.sink import S3Sink, encode_jsonl
    from sync_service.concurrency import AdaptiveConcurrency

    s3 = s3_client(conn)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    wire = Wire(SCHEMA)
    raws = wire_batches(wire, n)
    wire.warm(raws)
    def config(prefix: str) -> S3SinkConfig:
        return S3SinkConfig(name="bench-s3", type="s3_sink", connection="s3", topics=["bench"], bucket=bucket,
                            prefix=prefix, format="jsonl")

    # the baseline uploads the very bytes the sink writes, encoded beforehand
    bodies = [encode_jsonl(b.records) for b in decoded(wire.writer(S3Sink(config(""), conn)), raws)]
    total_mb = sum(len(b) for b in bodies) / 1e6
    base_rates, sink_rates, seq_rates = [], [], []
    for r in range(rounds):
        def baseline(r: int = r) -> None:
            for i, body in enumerate(bodies):
                s3.upload_fileobj(io.BytesIO(body), bucket, f"base/{r}/{i}.jsonl")

        base_rates.append(total_mb / timed(baseline))
        for label, partitions, rates in (("sink", PARTITIONS, sink_rates), ("seq", 1, seq_rates)):
            cfg = config(f"{label}/{r}/")
            sink = S3Sink(cfg, conn, limiter=AdaptiveConcurrency("bench-s3", cfg.max_concurrency))
            sink.open()
            writer, todo = wire.writer(sink), jobs(sink.name, raws)
            rates.append(total_mb / timed(lambda writer=writer, todo=todo, p=partitions: drive(writer, todo, p)))
            sink.close()
    _empty_bucket(s3, bucket)
    return {
        "s3_baseline_mb_s": statistics.median(base_rates),
        "s3_sink_mb_s": statistics.median(sink_rates),
        "s3_sink_one_partition_mb_s": statistics.median(seq_rates),
        "s3_mb": total_mb,
    }


def _empty_bucket(s3: Any, bucket: str, delete: bool = True) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=o["Key"])
    if delete:
        s3.delete_bucket(Bucket=bucket)


# -- S3 Parquet: the demo's records, the service before and after the columnar decode -----------------------

ENRICHED = json.loads((ROOT / "schemas" / "nycflights13" / "enriched_flight.avsc").read_text())


def enriched_row(i: int) -> dict[str, Any]:
    """A value of the demo's enriched-flight schema (51 fields): deterministic, ~1 in 7 nullable fields null."""
    out: dict[str, Any] = {}
    for j, f in enumerate(ENRICHED["fields"]):
        typ = f["type"]
        nullable = isinstance(typ, list)
        base = typ[1] if nullable else typ
        if nullable and (i * 31 + j * 17) % 7 == 0:
            out[f["name"]] = None
        elif isinstance(base, dict):  # time_hour, timestamp-micros
            out[f["name"]] = T0 + timedelta(hours=i % 8760)
        elif base == "int":
            out[f["name"]] = (i * 7 + j) % 2400
        elif base == "double":
            out[f["name"]] = ((i * 13 + j) % 1000) / 7.0
        else:
            out[f["name"]] = ("UA", "AA", "JFK", "LGA", "America/New_York", "Boeing 737-800")[(i + j) % 6]
    return out


def enriched_batches(wire: Wire, n: int, per_object: int, objects_per_batch: int) -> list[list[WireMessage]]:
    """Raw batches of ``per_object * objects_per_batch`` records, ``per_object`` consecutive ones per ``dt`` day."""
    size = per_object * objects_per_batch
    out = []
    for start in range(0, n, size):
        items = []
        for i in range(start, min(n, start + size)):
            value = enriched_row(i)
            value["time_hour"] = T0 + timedelta(days=i // per_object % 365, hours=i % 24)
            items.append((i, value))
        out.append(wire.messages(len(out) % PARTITIONS, items))
    return out


def previous_s3_sink() -> type:
    """``S3Sink`` as it was before (reference for the Parquet figures): types inferred per object, dictionary
    encoding always, and one object after another through ``upload_fileobj`` (a TransferManager and thread
    pool per object)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from connectors.s3.formats import _arrow_safe, envelope
    from connectors.s3.sink import S3Sink

    def encode_parquet_inferred(records: list[SinkRecord]) -> bytes:
        rows = [envelope(r) for r in records]
        for row in rows:
            if row["value"] is not None:
                row["value"] = _arrow_safe(row["value"])
        out = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), out, compression="zstd")
        return out.getvalue()

    class PreviousS3Sink(S3Sink):
        def write(self, batch: SinkBatch) -> list[Any]:
            for obj in self.objects(batch):
                body = encode_parquet_inferred(obj.records)
                self.client.upload_fileobj(io.BytesIO(body), self.config.bucket, obj.key, Config=self._transfer)
            return []

    return PreviousS3Sink


def bench_s3_parquet(conn: S3Connection, n: int, rounds: int) -> dict[str, float]:
    """Records/s of the Parquet path, before vs after, on small (~150-row) and large (~25k-row) objects.

    "before": values decoded per record by fastavro, then :func:`previous_s3_sink`; "after": values decoded
    in columns, then ``S3Sink`` (Parquet from the Arrow table). Both decode inside the timing.
    """
    from connectors.s3.config import S3SinkConfig
    from connectors.s3.sink import S3Sink
    from sync_service.concurrency import AdaptiveConcurrency

    s3 = s3_client(conn)
    bucket = f"bench-pq-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    before = previous_s3_sink()
    wire = Wire(ENRICHED)
    figures: dict[str, float] = {}
    for label, per_object, per_batch in (("small", 150, 67), ("large", 25_000, 1)):
        raws = enriched_batches(wire, max(n, per_object * per_batch), per_object, per_batch)
        wire.warm(raws)
        total = sum(len(b) for b in raws)
        rates: dict[str, list[float]] = {"before": [], "after": []}
        sink: Any = None
        for r in range(rounds):
            for name, cls in (("before", before), ("after", S3Sink)):
                cfg = S3SinkConfig(
                    name=f"bench-pq-{name}",
                    type="s3_sink",
                    connection="s3",
                    topics=["bench"],
                    bucket=bucket,
                    prefix=f"{label}/{name}/{r}/",
                    format="parquet",
                    partition_by="time_hour",
                )
                sink = cls(cfg, conn, limiter=AdaptiveConcurrency("bench-pq", cfg.max_concurrency))
                sink.open()
                writer, todo = wire.writer(sink, columnar=name == "after"), jobs(sink.name, raws)
                rates[name].append(total / timed(lambda writer=writer, todo=todo: drive(writer, todo, PARTITIONS)))
                sink.close()
        figures[f"s3_parquet_{label}_before_rec_s"] = statistics.median(rates["before"])
        figures[f"s3_parquet_{label}_after_rec_s"] = statistics.median(rates["after"])
        figures[f"s3_parquet_{label}_ratio"] = (
            figures[f"s3_parquet_{label}_after_rec_s"] / figures[f"s3_parquet_{label}_before_rec_s"]
        )
        figures[f"s3_parquet_{label}_objects"] = sum(len(sink.objects(b)) for b in decoded(wire.writer(sink), raws))
    _empty_bucket(s3, bucket)
    return figures


# -- quixstreams: the same update topic through threes' SyncService and quixstreams' own sinks --------------

QUIX_TARGETS = {"es": ("Elasticsearch", "docs"), "pg": ("PostgreSQL", "rows"), "s3": ("S3 JSON Lines", "records")}


def emit(event: str) -> None:
    """A child's timing event on stdout, one JSON line (epoch seconds: parent and child share the clock)."""
    print(json.dumps({"event": event, "t": time.time()}), flush=True)


def quix_python(explicit: str | None) -> str:
    """The interpreter of the quixstreams peer.

    quixstreams 3.28.1 requires ``confluent-kafka<2.13`` and threes ``>=2.16``, so
    the peer lives in a virtualenv of its own: ``explicit``, or
    ``.threes/bench-venv``, made on first use from pyproject's ``bench`` extra.

    Raises:
        RuntimeError: the virtualenv cannot be made (the message says why).
    """
    if explicit:
        return explicit
    import tomllib

    venv = ROOT / ".threes" / "bench-venv"
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import quixstreams"],
                                          capture_output=True).returncode == 0:
        return str(python)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"][QUIX_REQUIREMENT_EXTRA]
    print(f"making {venv} for the quixstreams peer ({' '.join(extra)}), once", file=sys.stderr)
    base = getattr(sys, "_base_executable", sys.executable)
    for cmd in ([base, "-m", "venv", str(venv)], [str(python), "-m", "pip", "install", "-q", *extra]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-800:]}")
    return str(python)


def produce_updates(kafka: KafkaConfig, topic: str, n: int) -> dict[int, int]:
    """Produce ``n`` update records of :func:`row` (keys 0..n-1, version 1) to a new 4-partition topic.

    Returns:
        The high watermark of every partition (they sum to ``n``).
    """
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from kernel.kafka import clients
    from kernel.updates import encode_version
    from schemas.serde import AvroSerializer
    from schemas.store import SchemaStore

    conf = kafka.librdkafka_config()
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
    store = SchemaStore(conf, kafka.schema_topic)  # the service resolves writer schemas from the real store
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(SCHEMA, store)
    producer = clients.kafka_producer(kafka, linger_ms=50)
    headers = [("version", encode_version(1))]
    errors: list[Any] = []
    for i in range(n):
        while True:
            try:
                producer.produce(topic, key=key_ser(i), value=value_ser(row(i)), headers=headers,
                                 on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    consumer = Consumer({**conf, "group.id": f"bench-watermarks-{uuid.uuid4().hex[:8]}"})
    highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    consumer.close()
    assert sum(highs.values()) == n, highs
    return highs


def run_until_committed(cmd: list[str], kafka_conf: dict[str, Any], group: str, topic: str,
                        highs: dict[int, int], timeout_s: float) -> dict[str, float]:
    """Run one system's process until its consumer group has committed every record of ``topic``.

    The process prints ``start`` and ``assigned`` events (:func:`emit`); the group's
    committed offsets are polled every 50 ms (an OffsetFetch, without joining the
    group). Then the process gets SIGTERM and is awaited.

    Returns:
        Epoch seconds of ``start``, ``assigned`` and ``end`` (every offset committed).

    Raises:
        RuntimeError: the process exited early or the time ran out; with its last stderr lines.
    """
    import signal

    from confluent_kafka import Consumer, TopicPartition

    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    events: dict[str, float] = {}

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and "event" in ev:
                events.setdefault(ev["event"], ev["t"])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    watcher = Consumer({**kafka_conf, "group.id": group, "enable.auto.commit": False})
    tps = [TopicPartition(topic, p) for p in highs]
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the process exited with {proc.returncode} before committing every record")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every record committed after {timeout_s:.0f} s")
            committed = watcher.committed(tps, timeout=10)
            if all(tp.offset >= highs[tp.partition] for tp in committed):
                end = time.time()
                break
            time.sleep(0.05)
    except RuntimeError as exc:
        err.seek(0)
        tail = " | ".join(err.read().strip().splitlines()[-6:])
        raise RuntimeError(f"{exc}; stderr: {tail[-1200:]}") from None
    finally:
        watcher.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(5)
        err.close()
    start = events.get("start", end)
    return {"start": start, "assigned": events.get("assigned", start), "end": end}


def child_main(spec: dict[str, Any]) -> None:
    """A system's process: threes' ``SyncService`` or a quixstreams ``Application`` on the spec's topic."""
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if spec["system"] == "threes":
        threes_child(spec)
    else:
        quix_child(spec)


def threes_child(spec: dict[str, Any]) -> None:
    """threes' ``SyncService`` with one sink, its config built by the project's config models."""
    import signal

    from connectors.runtime.process import keep_pandas_out, tune_gc

    keep_pandas_out()  # as `threes sync run` does
    from sync_service.service import SyncService
    from threes.config import pipeline_from_dict

    tune_gc()  # as `threes sync run` does

    target, c = spec["target"], spec["conn"]
    connection = {
        "es": {"type": "elasticsearch", "hosts": [c["es_url"]]},
        "pg": {"type": "rds", "url": c["pg_url"]},
        "s3": {"type": "s3", "endpoint_url": c["s3_endpoint"], "region": c["s3_region"],
               "access_key_id": c["s3_key"], "secret_access_key": c["s3_secret"], "path_style": True},
    }[target]
    sink = {
        "es": {"type": "elasticsearch_sink", "index": spec.get("index")},
        "pg": {"type": "rds_sink", "table": spec.get("table"), "key": ["id"], "create_table": True},
        # rotate_interval_s: the default 60 s would hold every object back a minute
        "s3": {"type": "s3_sink", "bucket": spec.get("bucket"), "prefix": f"{spec.get('prefix')}/",
               "format": "jsonl", "rotate_interval_s": 1.0},
    }[target]
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": spec["bootstrap"]},
        "connections": {target: connection},
        "sync": [{"name": f"bench-{target}", "group_id": spec["group"], "dead_letter_topic": f"{spec['topic']}.dlq",
                  "sinks": [{"name": target, "connection": target, "topics": [spec["topic"]], **sink}]}],
    })
    assigned = threading.Event()

    class TimedSyncService(SyncService):
        def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
            if partitions and not assigned.is_set():
                assigned.set()
                emit("assigned")
            super()._on_assign(consumer, partitions)

    service = TimedSyncService(pipeline.kafka, pipeline.sync[0], dict(pipeline.connections))
    # imported at the first batch otherwise: a once-per-process cost, counted in startup like quixstreams' imports
    import polars  # noqa: F401
    import pyarrow  # noqa: F401
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    emit("start")
    service.run(stop)


def quix_child(spec: dict[str, Any]) -> None:
    """A quixstreams ``Application`` with its community sink; values decoded by our serde (same bytes)."""
    import orjson
    from quixstreams import Application
    from quixstreams.models.serializers import Deserializer

    from schemas.serde import AvroDeserializer
    from schemas.store import InMemorySchemaStore

    store = InMemorySchemaStore()
    store.register("long")
    store.register(SCHEMA)

    class SingleObjectAvroDeserializer(Deserializer):
        """Single-object Avro (threes' wire format) for quixstreams: ``schemas.serde.AvroDeserializer``."""

        def __init__(self) -> None:
            super().__init__()
            self._decode = AvroDeserializer(store)

        def __call__(self, value: bytes, ctx: Any) -> Any:
            return self._decode(value)

    target, c = spec["target"], spec["conn"]
    sink: Any
    if target == "pg":
        from quixstreams.sinks.community.postgresql import PostgreSQLSink

        sink = PostgreSQLSink(host=c["pg_host"], port=c["pg_port"], dbname=c["pg_db"], user=c["pg_user"],
                              password=c["pg_password"], table_name=spec["table"], primary_key_columns="id",
                              upsert_on_primary_key=True, include_metadata=False)
    elif target == "es":
        from elasticsearch import Elasticsearch
        from quixstreams.sinks.community.elasticsearch import ElasticsearchSink

        class MinimalServerElasticsearchSink(ElasticsearchSink):
            """quixstreams' sink, but ``setup()`` checks cluster health: ``GET /`` answers 405 on this server."""

            def setup(self) -> None:
                self._client = Elasticsearch(**self._client_kwargs)
                self._client.cluster.health(wait_for_status="yellow", timeout="30s")
                self._create_index()

        sink = MinimalServerElasticsearchSink(url=c["es_url"], index=spec["index"])
    else:
        from botocore.config import Config
        from quixstreams.sinks.community.file.formats import JSONFormat
        from quixstreams.sinks.community.file.s3 import S3FileSink

        sink = S3FileSink(bucket=spec["bucket"], aws_access_key_id=c["s3_key"], aws_secret_access_key=c["s3_secret"],
                          region_name=c["s3_region"], endpoint_url=c["s3_endpoint"], directory=spec["prefix"],
                          format=JSONFormat(dumps=lambda obj: orjson.dumps(obj).decode()),
                          config=Config(s3={"addressing_style": "path"}))
    assigned = threading.Event()

    class TimedApplication(Application):
        def _on_assign(self, consumer: Any, topic_partitions: list[Any]) -> None:
            if topic_partitions and not assigned.is_set():
                assigned.set()
                emit("assigned")
            super()._on_assign(consumer, topic_partitions)

    app = TimedApplication(broker_address=spec["bootstrap"], consumer_group=spec["group"],
                           auto_offset_reset="earliest", commit_interval=1.0, loglevel="WARNING",
                           state_dir=tempfile.mkdtemp(prefix="bench-quix-state-"))
    topic = app.topic(spec["topic"], key_deserializer=SingleObjectAvroDeserializer(),
                      value_deserializer=SingleObjectAvroDeserializer())
    app.dataframe(topic).sink(sink)
    emit("start")
    app.run()  # until SIGTERM: quixstreams then flushes, commits and leaves the group


class E2ETargets:
    """Where each run writes, how many records it holds, and cleaning it up (parent side)."""

    def __init__(self, ep: Endpoints):
        from sqlalchemy.engine import make_url

        from connectors.elasticsearch.connection import ElasticsearchConnection
        from connectors.rds.connection import RdsConnection

        self.ep = ep
        url = make_url(ep.postgres_url)
        self.conn = {
            "es_url": ep.elasticsearch_url, "pg_url": ep.postgres_url, "pg_host": url.host, "pg_port": url.port,
            "pg_db": url.database, "pg_user": url.username, "pg_password": url.password,
            "s3_endpoint": ep.s3_endpoint_url, "s3_region": ep.s3_region, "s3_key": ep.s3_access_key_id,
            "s3_secret": ep.s3_secret_access_key,
        }
        self.es = elasticsearch_client(ElasticsearchConnection(type="elasticsearch",
                                                                       hosts=[ep.elasticsearch_url]))
        self.engine = sql_engine(RdsConnection(type="rds", url=ep.postgres_url))
        self.s3 = s3_client(s3_connection(ep))
        self.bucket = f"bench-e2e-{uuid.uuid4().hex[:8]}"
        self.s3.create_bucket(Bucket=self.bucket)

    def spec(self, target: str, run: str) -> dict[str, Any]:
        """Target names of one run (``run``: a unique word of letters, digits and underscores)."""
        return {"es": {"index": f"bench-e2e-{run}"}, "pg": {"table": f"bench_e2e_{run}"},
                "s3": {"bucket": self.bucket, "prefix": f"e2e/{run}"}}[target]

    def count(self, target: str, spec: dict[str, Any]) -> int:
        """Records the target holds: docs, rows, or JSON lines in the objects under the prefix."""
        from sqlalchemy import text

        if target == "es":
            self.es.indices.refresh(index=spec["index"])
            return int(self.es.count(index=spec["index"])["count"])
        if target == "pg":
            with self.engine.connect() as c:
                return int(c.execute(text(f'SELECT count(*) FROM "{spec["table"]}"')).scalar())
        lines = 0
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=spec["prefix"] + "/"):
            for o in page.get("Contents", []):
                lines += self.s3.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read().count(b"\n")
        return lines

    def drop(self, target: str, spec: dict[str, Any]) -> None:
        from sqlalchemy import text

        if target == "es":
            self.es.indices.delete(index=spec["index"], ignore_unavailable=True)
        elif target == "pg":
            with self.engine.begin() as c:
                c.execute(text(f'DROP TABLE IF EXISTS "{spec["table"]}"'))
        else:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                          Prefix=spec["prefix"] + "/"):
                for o in page.get("Contents", []):
                    self.s3.delete_object(Bucket=self.bucket, Key=o["Key"])

    def close(self) -> None:
        _empty_bucket(self.s3, self.bucket)
        self.es.close()
        self.engine.dispose()


def bench_quix(ep: Endpoints, kafka: KafkaConfig, n: int, rounds: int, targets: list[str],
               python: str | None) -> dict[str, Any]:
    """threes' ``SyncService`` vs quixstreams' sinks on one update topic, per target: records/s and ratio.

    Returns:
        Per target ``<t>_threes_e2e_<unit>_s``, ``<t>_quix_<unit>_s``, ``<t>_vs_quix``, startup seconds;
        ``<t>_quix_error`` (and no quixstreams figure) when its runs failed.
    """
    figures: dict[str, Any] = {}
    try:
        quix_py = quix_python(python)
    except RuntimeError as exc:
        for t in targets:
            figures[f"{t}_quix_error"] = f"no quixstreams environment: {exc}"
        return figures
    topic = f"bench.quix.{uuid.uuid4().hex[:8]}"
    highs = produce_updates(kafka, topic, n)
    where = E2ETargets(ep)
    kconf = kafka.librdkafka_config()
    timeout_s = max(180.0, n / 250)
    try:
        for target in targets:
            unit = QUIX_TARGETS[target][1]
            rates: dict[str, list[float]] = {"threes": [], "quix": []}
            startup: dict[str, list[float]] = {"threes": [], "quix": []}
            errors: dict[str, str] = {}
            for r in range(rounds):
                order = ("threes", "quix") if r % 2 == 0 else ("quix", "threes")
                for system in order:
                    run = f"{system}_{target}_{r}_{uuid.uuid4().hex[:6]}"
                    spec = {"system": system, "target": target, "bootstrap": kafka.bootstrap_servers,
                            "topic": topic, "group": f"bench-{run}", "conn": where.conn, **where.spec(target, run)}
                    exe = sys.executable if system == "threes" else quix_py
                    cmd = [exe, str(Path(__file__).resolve()), "--e2e-child", json.dumps(spec)]
                    try:
                        times = run_until_committed(cmd, kconf, spec["group"], topic, highs, timeout_s)
                        held = where.count(target, spec)
                        if held < n:
                            raise RuntimeError(f"every offset committed but the target holds {held} of {n} records")
                    except Exception as exc:  # reported as the figure's reason, never faked
                        errors[system] = f"{type(exc).__name__}: {exc}"
                        print(f"{target} {system} round {r}: failed: {errors[system]}", file=sys.stderr)
                    else:
                        rates[system].append(n / (times["end"] - times["assigned"]))
                        startup[system].append(times["assigned"] - times["start"])
                    finally:
                        where.drop(target, spec)
            for system in ("threes", "quix"):
                key = f"{target}_threes_e2e_{unit}_s" if system == "threes" else f"{target}_quix_{unit}_s"
                if rates[system]:
                    figures[key] = statistics.median(rates[system])
                    figures[f"{target}_{system}_startup_s"] = statistics.median(startup[system])
                if system in errors:
                    figures[f"{target}_{system}_error"] = errors[system][:600]
            if rates["threes"] and rates["quix"]:
                figures[f"{target}_vs_quix"] = (figures[f"{target}_threes_e2e_{unit}_s"]
                                                / figures[f"{target}_quix_{unit}_s"])
    finally:
        where.close()
        from confluent_kafka.admin import AdminClient

        AdminClient(kconf).delete_topics([topic, f"{topic}.dlq"])
    return figures


# -- memory under a throttled sink --------------------------------------------------------------

def rss_child(bootstrap: str, topic: str, bound: int, rate: float, seconds: float) -> None:
    """Run a sync service whose sink applies ``rate`` records/s, for ``seconds``; print peak RSS as JSON."""
    from connectors.runtime.process import keep_pandas_out

    keep_pandas_out()  # as `threes sync run` does
    from connectors.api.sink import Sink
    from connectors.api.sink_records import RecordFailure
    from sync_service.service import SyncService
    from threes.config import pipeline_from_dict

    class ThrottledSink(Sink):
        """Writes nowhere, at ``rate`` records per second: a slow target."""

        def write(self, batch: SinkBatch) -> list[RecordFailure]:
            time.sleep(len(batch.records) / rate)
            return []

    p = pipeline_from_dict({
        "kafka": {"bootstrap_servers": bootstrap},
        "connections": {"pg": {"type": "rds", "url": "sqlite://"}},
        "sync": [{"name": f"rss-{topic}", "dead_letter_topic": f"{topic}.dlq", "buffer_max_bytes": bound,
                  "batch": {"max_records": 2_000, "max_age_ms": 500},
                  "sinks": [{"name": "slow", "type": "rds_sink", "connection": "pg", "topics": [topic],
                             "table": "unused", "key": ["id"], "max_concurrency": 2}]}],
    })
    cfg = p.sync[0]
    sink = ThrottledSink(cfg.sinks[0], None)
    service = SyncService(p.kafka, cfg, dict(p.connections), sinks=[sink])
    stop = threading.Event()
    peak_buffered = 0
    paused_max = 0
    def current_rss() -> int:
        # not ru_maxrss: on Linux it keeps the parent's high-water mark across fork and exec
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    service.open()
    idle_rss_mb = current_rss() / 2**20
    thread = threading.Thread(target=service.run, args=(stop,))
    thread.start()
    end = time.monotonic() + seconds
    peak_rss = 0
    while time.monotonic() < end:
        peak_rss = max(peak_rss, current_rss())
        peak_buffered = max(peak_buffered, int(service.metrics.value("threes_sync_buffered_bytes")))
        paused_max = max(paused_max, int(service.metrics.value("threes_sync_paused_partitions")))
        time.sleep(0.1)
    applied = service.metrics.value("threes_sync_records_out_total", sink="slow")
    stop.set()
    thread.join(120)
    print(json.dumps({"peak_rss_mb": peak_rss / 2**20, "idle_rss_mb": idle_rss_mb,
                      "peak_buffered_mb": peak_buffered / 1e6, "paused_partitions_max": paused_max,
                      "applied": applied}))


def bench_rss(kafka: KafkaConfig, bound: int, input_rate: float, seconds: float) -> dict[str, float]:
    from confluent_kafka.admin import AdminClient, NewTopic

    from kernel.kafka import clients
    from kernel.updates import encode_version
    from schemas.serde import AvroSerializer
    from schemas.store import SchemaStore

    topic = f"bench.rss.{uuid.uuid4().hex[:8]}"
    conf = kafka.librdkafka_config()
    admin = AdminClient(conf)  # keep a reference until the result is in: a collected client cancels it
    admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])[topic].result(30)
    store = SchemaStore(conf, kafka.schema_topic)
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(SCHEMA, store)
    producer = clients.kafka_producer(kafka, linger_ms=50)
    child = subprocess.Popen(
        [sys.executable, __file__, "--rss-child", kafka.bootstrap_servers, topic, str(bound),
         str(input_rate / 10), str(seconds)], stdout=subprocess.PIPE, text=True,
    )
    start, sent = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        due = int((time.monotonic() - start) * input_rate)
        while sent < due:
            try:
                producer.produce(topic, key=key_ser(sent), value=value_ser(row(sent)),
                                 headers=[("version", encode_version(1))])
                sent += 1
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(30)
    out, _ = child.communicate(timeout=300)
    result = json.loads(out.strip().splitlines()[-1])
    return {"rss_input_records": sent, "rss_input_mb": sent * 250 / 1e6, "rss_bound_mb": bound / 1e6,
            "rss_peak_mb": result["peak_rss_mb"], "rss_peak_buffered_mb": result["peak_buffered_mb"],
            "rss_idle_mb": result["idle_rss_mb"],
            "rss_paused_partitions_max": result["paused_partitions_max"], "rss_applied": result["applied"]}


def bench_fetch(kafka: KafkaConfig, n: int, rounds: int) -> dict[str, float]:
    """Drain the same backlog with librdkafka's fetch backoff and with threes' consumer defaults, alternating."""
    from confluent_kafka import Consumer

    from kernel.kafka.clients import CONSUMER_DEFAULTS

    topic = f"bench.fetch.{uuid.uuid4().hex[:8]}"
    highs = produce_updates(kafka, topic, n)
    conf = {**kafka.librdkafka_config(), "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "queued.max.messages.kbytes": 8192}  # as a sync service of the default bound gets per partition
    times: dict[str, list[float]] = {"default": [], "threes": []}
    for _ in range(rounds):
        for label, extra in (("default", {}), ("threes", CONSUMER_DEFAULTS)):
            consumer = Consumer({**conf, **extra, "group.id": f"bench-fetch-{uuid.uuid4().hex[:8]}"})
            consumer.subscribe([topic])
            got, started = 0, None
            while got < n:
                msgs = consumer.consume(1000, 1.0)
                if msgs and started is None:
                    started = time.monotonic()  # from the first record: the group join is left out
                for m in msgs:
                    m.headers()
                got += len(msgs)
            times[label].append(time.monotonic() - started)
            consumer.close()
    assert sum(highs.values()) == n
    from confluent_kafka.admin import AdminClient

    AdminClient(kafka.librdkafka_config()).delete_topics([topic])
    default_s, threes_s = statistics.median(times["default"]), statistics.median(times["threes"])
    return {"fetch_records": n, "fetch_default_s": default_s, "fetch_threes_s": threes_s,
            "fetch_ratio_default_vs_threes": default_s / threes_s}


def s3_connection(ep: Endpoints) -> S3Connection:
    from connectors.s3.connection import S3Connection

    return S3Connection(type="s3", endpoint_url=ep.s3_endpoint_url, region=ep.s3_region,
                        access_key_id=ep.s3_access_key_id, secret_access_key=ep.s3_secret_access_key, path_style=True)


def print_table(figures: dict[str, Any]) -> None:
    rows = [
        ("Elasticsearch docs/s", "es_baseline_docs_s", "es_sink_docs_s", "es_ratio", ">= 0.9"),
        ("PostgreSQL rows/s", "pg_baseline_rows_s", "pg_sink_rows_s", "pg_ratio", ">= 0.9"),
        ("S3 JSON Lines MB/s", "s3_baseline_mb_s", "s3_sink_mb_s", "s3_ratio", ">= 0.9"),
    ]
    print(f"{'measure':<28}{'baseline':>14}{'threes':>14}{'ratio':>9}  target")
    for label, base, ours, ratio, target in rows:
        if ratio in figures:
            print(f"{label:<28}{figures[base]:>14,.1f}{figures[ours]:>14,.1f}{figures[ratio]:>9.2f}  {target}"
                  f"{'' if figures[ratio] >= 0.9 else '  MISSED'}")
            seq = ours.replace("_sink_", "_sink_one_partition_")
            print(f"{'  (one partition)':<28}{'':>14}{figures[seq]:>14,.1f}{figures[seq] / figures[base]:>9.2f}")
    for label in ("small", "large"):
        if f"s3_parquet_{label}_ratio" in figures:
            print(f"{'S3 Parquet ' + label + ' rec/s':<28}{figures[f's3_parquet_{label}_before_rec_s']:>14,.1f}"
                  f"{figures[f's3_parquet_{label}_after_rec_s']:>14,.1f}{figures[f's3_parquet_{label}_ratio']:>9.2f}"
                  f"  after vs before ({figures[f's3_parquet_{label}_objects']:.0f} objects)")
    for target, (name, unit) in QUIX_TARGETS.items():
        ours, theirs, ratio = f"{target}_threes_e2e_{unit}_s", f"{target}_quix_{unit}_s", f"{target}_vs_quix"
        label = f"{name} {unit}/s vs quix"
        if ratio in figures:
            print(f"{label:<28}{figures[theirs]:>14,.1f}{figures[ours]:>14,.1f}{figures[ratio]:>9.2f}  >= 3 "
                  f"(baseline = quixstreams){'' if figures[ratio] >= 3 else '  MISSED'}")
        elif ours in figures or f"{target}_quix_error" in figures or f"{target}_threes_error" in figures:
            got = f"{figures[ours]:>14,.1f}" if ours in figures else f"{'-':>14}"
            print(f"{label:<28}{'-':>14}{got}{'-':>9}  not measured")
        for system in ("threes", "quix"):
            if f"{target}_{system}_error" in figures:
                print(f"  {system} failed: {figures[f'{target}_{system}_error']}")
    if "fetch_ratio_default_vs_threes" in figures:
        print(f"{'backlog drain s':<28}{figures['fetch_default_s']:>14,.2f}{figures['fetch_threes_s']:>14,.2f}"
              f"{figures['fetch_ratio_default_vs_threes']:>9.2f}  librdkafka's fetch backoff vs threes' consumer "
              f"({figures['fetch_records']:,} records)")
    if "rss_peak_mb" in figures:
        print(f"{'peak RSS MB (throttled)':<28}{figures['rss_bound_mb'] + 150:>14,.1f}{figures['rss_peak_mb']:>14,.1f}"
              f"{'':>9}  <= bound + 150 MB (bound {figures['rss_bound_mb']:.0f} MB, "
              f"peak buffered {figures['rss_peak_buffered_mb']:.1f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--quix-records", type=int, default=300_000,
                        help="update records of the quixstreams part (end to end, each side's last 1 s batch or "
                             "commit interval must stay a small part of the run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound-mb", type=int, default=64)
    parser.add_argument("--input-rate", type=float, default=20_000, help="records/s produced during the RSS run")
    parser.add_argument("--rss-seconds", type=float, default=30)
    parser.add_argument("--only", choices=["es", "pg", "s3", "s3pq", "quix", "fetch", "rss"], action="append")
    parser.add_argument("--quix-targets", default="es,pg,s3", help="targets of --only quix, comma-separated")
    parser.add_argument("--quix-python", help="interpreter with quixstreams (default: .threes/bench-venv, made once)")
    parser.add_argument("--rss-child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--e2e-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.e2e_child:
        child_main(json.loads(args.e2e_child))
        return
    from connectors.runtime.process import tune_gc

    tune_gc()  # what `threes sync run` sets in the service's process (the quixstreams child keeps Python's)
    if args.rss_child:
        b, topic, bound, rate, seconds = args.rss_child
        rss_child(b, topic, int(bound), float(rate), float(seconds))
        return
    from connectors.elasticsearch.connection import ElasticsearchConnection
    from connectors.rds.connection import RdsConnection
    from kernel.config.models import KafkaConfig
    from threes.local import Endpoints

    ep = Endpoints.from_env()
    kafka = KafkaConfig(bootstrap_servers=ep.kafka_bootstrap)
    atexit.register(BenchTopics(kafka.librdkafka_config()).drop)  # this run's bench.* topics
    only = set(args.only or ["es", "pg", "s3", "s3pq", "quix", "fetch", "rss"])
    quix_targets = [t for t in args.quix_targets.split(",") if t]
    if unknown := set(quix_targets) - set(QUIX_TARGETS):
        parser.error(f"--quix-targets: unknown {sorted(unknown)}; choose from {sorted(QUIX_TARGETS)}")
    figures: dict[str, Any] = {"records": args.records, "rounds": args.rounds}
    if "es" in only:
        figures |= bench_es(ElasticsearchConnection(type="elasticsearch", hosts=[ep.elasticsearch_url]),
                            args.records, args.rounds)
        figures["es_ratio"] = figures["es_sink_docs_s"] / figures["es_baseline_docs_s"]
    if "pg" in only:
        figures |= bench_pg(RdsConnection(type="rds", url=ep.postgres_url), args.records, args.rounds)
        figures["pg_ratio"] = figures["pg_sink_rows_s"] / figures["pg_baseline_rows_s"]
    if "s3" in only:
        figures |= bench_s3(s3_connection(ep), args.records, args.rounds)
        figures["s3_ratio"] = figures["s3_sink_mb_s"] / figures["s3_baseline_mb_s"]
    if "s3pq" in only:
        figures |= bench_s3_parquet(s3_connection(ep), args.records, args.rounds)
    if "quix" in only:
        figures |= bench_quix(ep, kafka, args.quix_records, args.rounds, quix_targets, args.quix_python)
    if "fetch" in only:
        figures |= bench_fetch(kafka, args.quix_records, args.rounds)
    if "rss" in only:
        figures |= bench_rss(kafka, args.bound_mb * 1024 * 1024, args.input_rate, args.rss_seconds)
        figures["rss_headroom_mb"] = figures["rss_bound_mb"] + 150 - figures["rss_peak_mb"]
    print_table(figures)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
