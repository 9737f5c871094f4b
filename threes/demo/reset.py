"""Start a pipeline from clean topics and sinks (the demo's second run on a warm machine).

With every process of the pipeline stopped, :func:`reset_pipeline` removes
what a previous run left: the pipeline's topics (state, events, enriched,
update and dead letter topics), the sync services' consumer groups, the
sources' stored positions, the stream job's checkpoint folder, and what the
sinks wrote (the Elasticsearch index, the PostgreSQL table, the objects under
the S3 prefix). The schema topic is kept: schemas are shared and immutable.
The systems of record are not touched here; the reference loader resets them.

The Elasticsearch index of flights is then created with explicit mappings
(keywords, numbers, dates from the update's Avro schema, no replica) instead of
dynamic ones, as one would with an index template in production.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from connectors.elasticsearch.connection import elasticsearch_client
from connectors.rds.connection import sql_engine
from connectors.s3.connection import s3_client
from kernel.exceptions import SetupError
from kernel.kafka import clients

log = logging.getLogger(__name__)


def pipeline_topics(pipeline: Any) -> list[str]:
    """Every topic the pipeline writes or reads, except the shared schema and offsets topics."""
    topics: list[str] = [s.topic for s in pipeline.sources]
    stream = pipeline.stream
    if stream is not None:
        topics += [stream.events.topic, stream.enriched_topic, stream.dead_letter_topic]
        topics += [t for snap in stream.snapshots for t in snap.topics]
        topics += [u.topic for u in stream.updates]
    for service in pipeline.sync:
        topics.append(service.dead_letter_topic)
        topics += [t for sink in service.sinks for t in sink.topics]
    return sorted(set(topics))


def delete_topics(pipeline: Any, topics: list[str], timeout_s: float = 60.0) -> list[str]:
    """Delete the topics that exist and wait until Kafka no longer lists them.

    Returns:
        The topics deleted.

    Raises:
        SetupError: Kafka refused, or still lists a topic after ``timeout_s``.
    """
    from confluent_kafka import KafkaException

    admin = clients.kafka_admin(pipeline.kafka)
    existing = set(admin.list_topics(timeout=pipeline.kafka.request_timeout_s).topics)
    doomed = [t for t in topics if t in existing]
    if not doomed:
        return []
    for topic, future in admin.delete_topics(doomed, operation_timeout=30).items():
        try:
            future.result()
        except KafkaException as exc:
            if "UNKNOWN_TOPIC" not in str(exc):
                raise SetupError(f"cannot delete topic {topic!r}: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    while True:
        left = set(doomed) & set(admin.list_topics(timeout=pipeline.kafka.request_timeout_s).topics)
        if not left:
            return doomed
        if time.monotonic() > deadline:
            raise SetupError(f"Kafka still lists deleted topics {sorted(left)} after {timeout_s:.0f} s")
        time.sleep(0.5)


def delete_groups(pipeline: Any) -> list[str]:
    """Delete the sync services' consumer groups (their members must be stopped).

    Transient coordinator errors (a broker still loading ``__consumer_offsets``
    answers COORDINATOR_LOAD_IN_PROGRESS) are retried with backoff for up to
    60 s; a group that does not exist counts as deleted.

    Returns:
        The groups deleted.

    Raises:
        SetupError: a group cannot be deleted (for example it still has members).
    """
    from confluent_kafka import KafkaError, KafkaException
    from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

    groups = [s.consumer_group() for s in pipeline.sync]
    if not groups:
        return []
    admin = clients.kafka_admin(pipeline.kafka)

    coordinator_busy = {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
    }

    def transient(exc: BaseException) -> bool:
        if not isinstance(exc, KafkaException) or not exc.args:
            return False
        error = exc.args[0]
        return isinstance(error, KafkaError) and (error.retriable() or error.code() in coordinator_busy)

    @retry(
        retry=retry_if_exception(transient), stop=stop_after_delay(60), wait=wait_exponential(0.2, max=5), reraise=True
    )
    def delete(group: str) -> bool:
        future = admin.delete_consumer_groups([group], request_timeout=pipeline.kafka.request_timeout_s)[group]
        try:
            future.result()
        except KafkaException as exc:
            if "GROUP_ID_NOT_FOUND" in str(exc):
                return False
            raise
        return True

    deleted = []
    for group in groups:
        try:
            if delete(group):
                deleted.append(group)
        except KafkaException as exc:
            raise SetupError(f"cannot delete consumer group {group!r}: {exc}") from exc
    return deleted


def reset_source_positions(pipeline: Any, offsets_topic: str) -> list[str]:
    """Forget the stored positions of the pipeline's sources (they start with a snapshot).

    Returns:
        The offsets keys reset.
    """
    from connectors.runtime.offsets import OffsetStore

    conf = pipeline.kafka.librdkafka_config()
    store = OffsetStore(conf, offsets_topic)
    names = {s.name for s in pipeline.sources}
    keys = sorted(k for k, p in store.load_all().items() if p.connector in names)
    if keys:
        store.reset(keys, clients.kafka_producer(pipeline.kafka))
    return keys


def _local_folder(location: str) -> Path | None:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    return None


def clear_sinks(pipeline: Any) -> dict[str, int]:
    """Remove what the sinks wrote: indices, tables, objects under prefixes.

    Returns:
        What was removed: ``{"indices": n, "tables": n, "objects": n}``.
    """
    from elasticsearch import NotFoundError
    from sqlalchemy import MetaData, Table

    removed = {"indices": 0, "tables": 0, "objects": 0}
    for service in pipeline.sync:
        for sink in service.sinks:
            conn = pipeline.connections[sink.connection]
            if sink.type == "elasticsearch_sink":
                es = elasticsearch_client(conn)
                try:
                    es.indices.delete(index=sink.index)
                    removed["indices"] += 1
                except NotFoundError:
                    pass
                finally:
                    es.close()
            elif sink.type == "rds_sink":
                engine = sql_engine(conn)
                try:
                    Table(sink.table, MetaData(), schema=sink.schema_name).drop(engine, checkfirst=True)
                    # its tombstones too: a fresh table must not inherit the deleted keys' versions
                    tombstones = sink.tombstone_table or f"{sink.table}__deleted"
                    Table(tombstones, MetaData(), schema=sink.schema_name).drop(engine, checkfirst=True)
                    removed["tables"] += 1
                finally:
                    engine.dispose()
            elif sink.type == "s3_sink":
                removed["objects"] += _delete_prefix(conn, sink.bucket, sink.prefix)
    return removed


def _delete_prefix(conn: Any, bucket: str, prefix: str) -> int:
    from threes.demo.sinks import list_objects

    s3 = s3_client(conn)
    keys = [o["Key"] for o in list_objects(conn, bucket, prefix, client=s3)]
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True})
    return len(keys)


def create_flights_index(pipeline: Any, value_schema: dict[str, Any]) -> list[str]:
    """Create each Elasticsearch sink's index with mappings from the update value schema.

    Returns:
        The indices created.
    """
    from threes.demo.reference_stores import es_mappings

    mappings = es_mappings(value_schema)
    created = []
    for service in pipeline.sync:
        for sink in service.sinks:
            if sink.type != "elasticsearch_sink":
                continue
            es = elasticsearch_client(pipeline.connections[sink.connection])
            try:
                # a refresh every 5 s rather than every second: fewer tiny segments to write and
                # merge while bulk indexing (Elasticsearch, "Tune for indexing speed"); the demo
                # refreshes once more when the sink has caught up
                es.indices.create(
                    index=sink.index, mappings=mappings, settings={"number_of_replicas": 0, "refresh_interval": "5s"}
                )
                created.append(sink.index)
            finally:
                es.close()
    return created


def reset_pipeline(pipeline: Any, offsets_topic: str = "_threes_offsets") -> dict[str, Any]:
    """Everything above, in order (stop the pipeline's processes first).

    Returns:
        A summary of what was removed.

    Raises:
        SetupError: a system refused a deletion.
    """
    started = time.monotonic()
    summary: dict[str, Any] = {"topics": delete_topics(pipeline, pipeline_topics(pipeline))}
    summary["groups"] = delete_groups(pipeline)
    summary["source_positions"] = reset_source_positions(pipeline, offsets_topic)
    if pipeline.stream is not None:
        folder = _local_folder(pipeline.stream.checkpoint_location)
        if folder is not None and folder.exists():
            shutil.rmtree(folder)
            summary["checkpoint"] = str(folder)
    summary.update(clear_sinks(pipeline))
    summary["elapsed_s"] = round(time.monotonic() - started, 2)
    log.info("reset pipeline %s", summary)
    return summary
