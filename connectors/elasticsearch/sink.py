"""``ElasticsearchSink``: update topics into an index with bulk requests and external versioning."""

from __future__ import annotations

import base64
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from connectors.api.sink import Sink
from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord, latest_per_key
from connectors.elasticsearch.bulk import BulkRequests, ElasticsearchThrottledError
from connectors.elasticsearch.config import ElasticsearchSinkConfig
from connectors.elasticsearch.connection import ElasticsearchConnection, elasticsearch_client
from kernel.exceptions import (
    BatchRefusedError,
    FatalError,
    RetriableError,
    SetupError,
    SinkBackpressureError,
    SinkBlockedError,
)
from kernel.redact import redact

log = logging.getLogger(__name__)



HTTP_MAX_CONTENT_LENGTH = 100 * 1024 * 1024
"""Elasticsearch's default ``http.max_content_length`` (100 MiB): no request, hence no document, is larger."""


def doc_id(key: Any) -> str:
    """The ``_id`` of a key: the scalar as text, a composite key's fields joined by ``|`` in schema order."""
    if isinstance(key, dict):
        return "|".join(str(v) for v in key.values())
    return str(key)


_NESTED = (bytes, dict, list)


def _json_safe(value: Any) -> Any:
    """Bytes become base64 text (Elasticsearch's ``binary``); the client's serializer does the rest."""
    if isinstance(value, dict) and not any(isinstance(v, _NESTED) for v in value.values()):
        return value  # flat documents (the common case) are used as they are
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


class ElasticsearchSink(BulkRequests, Sink):
    """Apply update topics to an index: index by ``_id`` = key, delete on tombstone.

    Delivery guarantee: at least once, effectively once in the index: every
    action carries ``version`` = the update's version header with
    ``version_type=external`` (Elasticsearch docs, "Index API: versioning"), so
    Elasticsearch itself rejects an update that is not newer than the document
    with a 409, which this sink counts as success. A replayed batch changes nothing.

    Idempotency key: ``_id`` (the key; composite keys joined by ``|``) and the version.

    Documents: values the sync service decoded in columns are written as JSON
    in one call per writer schema (:mod:`schemas.documents`,
    byte-identical to the client's serializer); others per record.

    Requests: the batch's newest update per key, in NDJSON bulk bodies of at
    most ``chunk_records`` actions and ``chunk_bytes`` bytes, built once (documents
    already JSON from the columns) and sent with the client's ``bulk`` API
    concurrently up to the adaptive concurrency limit. Per-item results are read
    when the answer says ``errors`` (even with HTTP 200): 2xx, 409 and a 404 on delete are success;
    items answered 429 are retried alone (``item_retries``, with backoff); 5xx
    items make the batch :class:`RetriableError`; an item error any document
    would get (``cluster_block_exception``: a write block or the flood-stage
    disk watermark; a closed or missing index; no privilege) blocks the sink
    (:class:`SinkBlockedError`, nothing dead-lettered); any other refusal (a
    field the mapping rejects, an immense term...) is about the record's data:
    it goes to the dead letter topic.

    Per-record limits: items still answered 429 (or 413) after ``item_retries``
    while at least half of their bulk request was indexed are that record's
    refusal, not throughput: they are returned as failures not about their data,
    and the sink runtime dead-letters them because their neighbours were applied
    (``sync_service/isolation.py``). A document larger than ``max_record_bytes``
    (default ``http.max_content_length``, 100 MiB) is dead-lettered unsent, and a
    request answered 413 is bisected by the runtime down to its document.

    Backpressure: HTTP 429 on the request, or on most items of a bulk request
    after ``item_retries``, and slow answers, which also lower the concurrency
    limit. Uses only APIs the minimal integ-test server has (bulk, cluster health).

    YAML: see :class:`~connectors.elasticsearch.config.ElasticsearchSinkConfig`
    (its example is rendered in docs/config-reference.md).
    """

    config: ElasticsearchSinkConfig  # the base class holds any sink's config and connection; this sink's are these
    connection: ElasticsearchConnection

    splits_requests = True
    default_max_record_bytes = HTTP_MAX_CONTENT_LENGTH

    def __init__(self, config: Any, connection: Any, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._index_ready = not config.create_index  # checked (or created) before the first document

    def open(self) -> None:
        """Create the client and the request pool, and check the cluster answers.

        Raises:
            SetupError: the cluster does not answer.
        """
        from elasticsearch import OrjsonSerializer

        self.client = elasticsearch_client(self.connection)
        # the client's own serializer (connectors/elasticsearch/connection.py), for per-record documents
        self._serializer = OrjsonSerializer()
        self._pool = ThreadPoolExecutor(max_workers=self.config.max_concurrency, thread_name_prefix=f"es-{self.name}")
        self.check()

    def check(self) -> None:
        """``GET _cluster/health`` (``GET /`` answers 405 on the minimal server).

        Raises:
            SetupError: the cluster does not answer or refuses our credentials.
        """
        from elasticsearch import ApiError, TransportError

        client = self.client or elasticsearch_client(self.connection)
        try:
            client.cluster.health(timeout="5s")
        except (ApiError, TransportError) as exc:
            hosts = self.connection.hosts
            raise SetupError(f"sink {self.name!r}: Elasticsearch {redact(str(hosts))} did not answer: "
                             f"{redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)}") from exc

    def close(self) -> None:
        """Stop the request pool and close the client."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.client is not None:
            self.client.close()

    @staticmethod
    def _sources(batch: SinkBatch, records: list[SinkRecord]) -> dict[int, bytes]:
        """The JSON ``_source`` of every upsert whose value was decoded in columns, by ``id(record)``.

        One NDJSON write per writer schema (:mod:`schemas.documents`),
        byte-identical to what the client's serializer writes for the value dict.
        """
        from schemas.documents import documents

        by_schema: dict[bytes | None, list[SinkRecord]] = {}
        for record in records:
            if record.row >= 0 and not record.is_delete:
                by_schema.setdefault(record.value_fingerprint, []).append(record)
        out: dict[int, bytes] = {}
        for group in by_schema.values():
            table = batch.value_table(group)
            docs = documents(table) if table is not None else None
            if docs is not None and len(docs) == len(group):
                out.update(zip(map(id, group), docs, strict=True))
        return out

    def _lines(self, record: SinkRecord, source: bytes | None = None) -> bytes:
        """The bulk body lines of one update: the action (index or delete, external version), and the document.

        Raises:
            ValueError: a negative version (Elasticsearch's external versions are 0..2^63-1).
        """
        import orjson

        if record.version < 0:
            raise ValueError(f"{record.where()}: version {record.version} is negative; Elasticsearch external "
                             "versions are 0..2^63-1")
        meta = {"_index": self.config.index, "_id": doc_id(record.key), "version": record.version,
                "version_type": "external"}
        if record.is_delete:
            return orjson.dumps({"delete": meta}) + b"\n"
        if source is None:  # per record: the client's own serializer, as a document of the client's API
            source = self._serializer.dumps(_json_safe(record.value))
        return orjson.dumps({"index": meta}) + b"\n" + source + b"\n"

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        """Send the batch's newest update per key in concurrent bulk requests.

        Returns:
            The refused records: about their data (a mapping error), or not (429 or 413 after the
            retries while most of their bulk request was indexed).

        Raises:
            SinkBackpressureError: 429 on a request, or on most items of one after ``item_retries``.
            SinkBlockedError: items refused for a reason any document would get (a write block,
                a closed or missing index, no privilege), or the request answered 401/403.
            BatchRefusedError: a request answered 413 (too large): the runtime bisects the batch.
            RetriableError: the cluster cannot be reached, a 5xx, or 5xx items.
            FatalError: the cluster refused the request itself (another 4xx).
        """
        assert self._pool is not None, "open() first"
        failures: list[RecordFailure] = []
        records = latest_per_key(batch.records)
        if not self._index_ready:
            self._ensure_index(records)
        chunks = self._chunks(batch, records, failures)
        futures = [self._pool.submit(self._send, chunk) for chunk in chunks if chunk]
        sent = sum(len(chunk) for chunk in chunks)
        errors: list[BaseException] = []
        for future in futures:
            try:
                failures.extend(future.result())
            except (SinkBackpressureError, RetriableError, FatalError, BatchRefusedError) as exc:
                errors.append(exc)
        if errors:
            # the strongest error wins: fatal stops, blocked waits for the target, transient retries,
            # a refused request is bisected, backpressure waits
            for kind in (FatalError, SinkBlockedError, RetriableError, BatchRefusedError):
                for error in errors:
                    if isinstance(error, kind) and not isinstance(error, SinkBackpressureError):
                        raise error
            raise errors[0]
        throttled = sum(1 for f in failures if isinstance(f.error, ElasticsearchThrottledError))
        if throttled * 2 > sent:
            # most of the batch refused on every retry (or a batch of one): the cluster is busy
            # (throughput), not refusing these documents; all of it is written again later
            self.limiter.backpressure()
            raise SinkBackpressureError(2.0, f"sink {self.name!r}: {throttled} of {sent} item(s) still answered "
                                             "429 after the retries")
        # fewer: those documents hit a per-record limit (indexing pressure on one large document)
        # while the rest was indexed; the sink runtime dead-letters them (their neighbours were applied)
        return failures

    def _chunks(self, batch: SinkBatch, records: list[SinkRecord],
                failures: list[RecordFailure]) -> list[list[tuple[SinkRecord, bytes]]]:
        """NDJSON lines cut into bulk requests (``chunk_records``/``chunk_bytes``); bad documents join ``failures``."""
        sources = self._sources(batch, records) if batch.tables else {}
        chunks: list[list[tuple[SinkRecord, bytes]]] = [[]]
        size = 0
        for record in records:
            try:
                lines = self._lines(record, sources.get(id(record)))
            except ValueError as exc:
                failures.append(RecordFailure(record, exc, about_data=True))
                continue
            full = len(chunks[-1]) >= self.config.chunk_records or size + len(lines) > self.config.chunk_bytes
            if chunks[-1] and full:
                chunks.append([])
                size = 0
            chunks[-1].append((record, lines))
            size += len(lines)
        return chunks

    def _ensure_index(self, records: list[SinkRecord]) -> None:
        """Create the index with mappings from the first upsert's value schema, unless it exists.

        An existing index (or one another task created first) is used as it is.

        Raises:
            RetriableError: the cluster cannot be reached.
            FatalError: the cluster refused the mappings (400).
        """
        from elasticsearch import ApiError, TransportError

        from connectors.elasticsearch.mapping import index_mappings

        sample = next((r for r in records if not r.is_delete and isinstance(r.value_schema, dict)), None)
        if sample is None:
            return  # only deletes so far: nothing to map yet
        index = self.config.index
        try:
            if self.client.indices.exists(index=index):
                self._index_ready = True
                return
            mappings = index_mappings(sample.value_schema, self.config)
            try:
                self.client.indices.create(index=index, mappings=mappings)
            except ApiError as exc:
                if "[scaled_float]" not in str(exc) or "does not exist" not in str(exc):
                    raise
                # a cluster without the mapper-extras module (the minimal distribution): decimals as double
                log.warning("sink=%s index=%s: the cluster has no scaled_float type; decimals mapped as double",
                            self.name, index)
                mappings = index_mappings(sample.value_schema, self.config.model_copy(
                    update={"decimal_mapping": "double"}))
                self.client.indices.create(index=index, mappings=mappings)
            log.info("sink=%s created index=%s fields_mapped=%d", self.name, index, len(mappings["properties"]))
        except ApiError as exc:
            if "resource_already_exists_exception" not in str(exc):
                if getattr(exc, "status_code", 500) >= 500:
                    raise RetriableError(f"sink {self.name!r}: creating index {index!r}: {redact(str(exc))}") from exc
                raise FatalError(f"sink {self.name!r}: index {index!r} refused its mappings: {redact(str(exc))}") \
                    from exc
        except TransportError as exc:
            raise RetriableError(f"sink {self.name!r}: creating index {index!r}: {redact(str(exc))}") from exc
        self._index_ready = True
