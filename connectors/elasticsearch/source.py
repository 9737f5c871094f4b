"""ElasticsearchSource: an index into a compacted topic, ``_id`` as the key.

Reads with a point-in-time and ``search_after`` (Elasticsearch reference,
"Paginate search results"), the only deep pagination that is consistent and
works on the minimal distribution the tests run against (no scroll-free
alternatives needed, no ``_delete_by_query``, no scripts).

* ``incremental``: documents with ``prev < updated_field <= now - commit_delay_s``
  sorted by ``updated_field`` then ``_shard_doc``; the upper bound covers the
  refresh interval (a document is searchable about a second after it was
  written) and writers' clocks. Inside a range the position moves to the last
  page's ``updated_field`` value, read again *inclusively* on restart (ties
  re-emitted, never lost).
* ``snapshot``: the whole index every ``snapshot_interval_s``; the ids seen
  settle deletes right after.
* Deletes: reconciliation compares the index's ``_id`` set (``_source: false``
  pages) with the topic's live keys; vanished ids become tombstones, ids the
  topic lacks (a document without ``updated_field``) are fetched with ``mget``.

Without ``value_schema`` the Avro schema is derived from the index mapping:
``keyword``/``text`` and the like -> ``string``, ``long`` -> ``long``,
``integer``/``short``/``byte`` -> ``int``, floating types -> ``double``,
``boolean`` -> ``boolean``; ``date`` stays the ``string`` written in
``_source`` (its format is the mapping's); objects, ``nested`` and other types
become their JSON text. Every field is nullable. A mapping is a better source
of types than the first documents (it is what the index enforces), which is why
this source does not sample documents.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from connectors.api.source import BoundedLiveKeys, SourceBatch, SourceSchemas, SourceTask, TopicState, tombstone_batches
from connectors.elasticsearch.config import ElasticsearchSourceConfig
from connectors.elasticsearch.connection import ElasticsearchConnection, elasticsearch_client
from connectors.runtime.avro import CoercionError, avro_name, record_coercer
from kernel.exceptions import ConfigError, FatalError, RetriableError

log = logging.getLogger(__name__)

KEEP_ALIVE = "2m"
_STRING_TYPES = {"keyword", "text", "constant_keyword", "wildcard", "match_only_text", "ip", "version",
                 "date", "date_nanos", "search_as_you_type"}
_TYPES = {"long": "long", "unsigned_long": "long", "integer": "int", "short": "int", "byte": "int",
          "double": "double", "float": "double", "half_float": "double", "scaled_float": "double",
          "boolean": "boolean", "binary": "string"}


def mapping_to_avro(properties: Mapping[str, Any], name: str) -> dict[str, Any]:
    """An Avro record schema from an index mapping's top-level ``properties`` (see module docstring).

    Returns:
        A record whose fields are all nullable, in mapping order; a field renamed to
        a valid Avro name keeps its original name in ``"source.field"``.
    """
    fields = []
    for field, spec in properties.items():
        es_type = spec.get("type", "object")
        avro_type = _TYPES.get(es_type, "string")
        f: dict[str, Any] = {"name": avro_name(field), "type": ["null", avro_type], "default": None,
                             "es.type": es_type}
        if f["name"] != field:
            f["source.field"] = field
        fields.append(f)
    return {"type": "record", "name": avro_name(name), "namespace": "threes.elasticsearch", "fields": fields}


class _PitExpired(Exception):
    """The point in time of a read is gone (its keep-alive passed): HTTP 404 ``search_context_missing_exception``."""


class ElasticsearchSource(SourceTask):
    """An Elasticsearch index into a compacted topic, keyed by ``_id``.

    Delivery guarantee: at least once. The incremental watermark (or the
    snapshot's completion) is stored only after the broker acknowledged every
    document before it.

    Idempotency key: the document ``_id`` (Avro record ``{"_id": string}``).

    Backpressure: one page (``page_size`` documents) is read at a time; while
    the producer's queue is full no new page is requested.

    YAML: see :class:`~connectors.elasticsearch.config.ElasticsearchSourceConfig`
    (its example is rendered in docs/config-reference.md).
    """

    config: ElasticsearchSourceConfig
    connection: ElasticsearchConnection

    def __init__(self, config: ElasticsearchSourceConfig, connection: ElasticsearchConnection, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.es: Any = None
        self._pit_id: str | None = None
        self._snapshot_ids: set[str] | None = None

    # -- open -----------------------------------------------------------------------------------------

    def open(self, position: Mapping[str, Any] | None) -> SourceSchemas:
        """Check the index, derive the schema from its mapping (or config), resume from ``position``.

        Raises:
            RetriableError: the cluster cannot be reached.
            ConfigError: the index does not exist, or ``updated_field`` is not in its mapping.
            FatalError: credentials refused.
        """
        cfg = self.config
        self.es = elasticsearch_client(self.connection)
        mapping = self._call(lambda: self.es.indices.get_mapping(index=cfg.index), "reading the mapping")
        properties: dict[str, Any] = {}
        for idx in mapping.body.values():
            properties.update(idx.get("mappings", {}).get("properties", {}))
        if cfg.value_schema:
            from schemas import load_schema

            self.value_schema = load_schema(cfg.value_schema)
        else:
            self.value_schema = mapping_to_avro(properties, cfg.name)
            log.info("source=%s value schema from the mapping of index %s: %d fields", cfg.name, cfg.index,
                     len(self.value_schema["fields"]))
        self.key_schema = {"type": "record", "name": f"{avro_name(cfg.name)}_key",
                           "namespace": "threes.elasticsearch", "fields": [{"name": "_id", "type": "string"}]}
        self.coerce = record_coercer(self.value_schema)
        self.updated_is_date = True
        if cfg.mode == "incremental":
            spec = properties.get(cfg.updated_field or "")
            if spec is None:
                raise ConfigError(f"source {cfg.name!r}: updated_field {cfg.updated_field!r} is not in the mapping of "
                                  f"index {cfg.index!r}")
            self.updated_is_date = spec.get("type") in ("date", "date_nanos")
        pos = dict(position or {})
        if pos and pos.get("mode") != cfg.mode:
            raise ConfigError(f"source {cfg.name!r}: the stored position is of mode {pos.get('mode')!r}; reset it "
                              f"with `threes offsets reset --connector {cfg.name}`")
        self.watermark = pos.get("watermark")
        self.inclusive = bool(pos.get("inclusive", False))
        self.last_snapshot_ms = pos.get("last_snapshot_ms")
        return SourceSchemas(key=self.key_schema, value=self.value_schema)

    def _call(self, fn: Any, what: str, pit: bool = False) -> Any:
        from elasticsearch import (
            ApiError,
            AuthenticationException,
            AuthorizationException,
            NotFoundError,
            TransportError,
        )
        from elasticsearch import ConnectionError as EsConnectionError

        cfg = self.config
        try:
            return fn()
        except NotFoundError as exc:
            if pit and "search_context_missing" in str(getattr(exc, "body", "") or exc):
                raise _PitExpired(str(exc)) from exc
            raise ConfigError(f"source {cfg.name!r}: index {cfg.index!r} does not exist ({what})") from exc
        except (AuthenticationException, AuthorizationException) as exc:
            raise FatalError(f"source {cfg.name!r}: Elasticsearch refused the credentials ({what}): "
                             f"HTTP {exc.meta.status}") from exc
        except (EsConnectionError, TransportError) as exc:
            raise RetriableError(f"source {cfg.name!r}: Elasticsearch not reachable ({what}): {exc}") from exc
        except ApiError as exc:
            if exc.meta.status in (429, 502, 503, 504):
                raise RetriableError(f"source {cfg.name!r}: Elasticsearch busy ({what}): HTTP {exc.meta.status}") \
                    from exc
            raise FatalError(f"source {cfg.name!r}: {what} failed: HTTP {exc.meta.status} {exc.message}") from exc

    # -- reading --------------------------------------------------------------------------------------

    def _open_pit(self) -> str:
        cfg = self.config
        return self._call(lambda: self.es.open_point_in_time(index=cfg.index, keep_alive=KEEP_ALIVE),
                          "opening a point in time")["id"]

    def _pages(self, query: Mapping[str, Any], sort: list[Any], *, source: bool = True,
               search_after: list[Any] | None = None,
               on_expiry: Callable[[], Mapping[str, Any]] | None = None) -> Iterator[list[dict[str, Any]]]:
        """Hits of ``query`` in pages, through one point-in-time (closed at the end).

        A point in time lives ``KEEP_ALIVE`` after each search; when the worker
        held a page longer than that (the producer blocked: backpressure), the
        next search finds no search context (HTTP 404
        ``search_context_missing_exception``). That is not a missing index:

        * with ``on_expiry`` (incremental reads), a new point in time is opened
          and the read resumes with the query it returns, which starts at the
          last page's sort value (the watermark, inclusive): documents of that
          value may come again, none is skipped;
        * without it (a snapshot, whose ``_shard_doc`` sort values mean nothing
          in another point in time), :class:`RetriableError`: the worker retries
          the cycle, which starts the snapshot again.

        Raises:
            RetriableError: the point in time expired during a snapshot, or the cluster failed.
        """
        cfg = self.config
        pit = self._open_pit()
        self._pit_id = pit
        try:
            after = search_after
            while True:
                kwargs: dict[str, Any] = {"pit": {"id": pit, "keep_alive": KEEP_ALIVE}, "size": cfg.page_size,
                                          "sort": sort, "query": dict(query), "track_total_hits": False}
                if not source:
                    kwargs["source"] = False
                if after is not None:
                    kwargs["search_after"] = after
                try:
                    resp = self._call(lambda kw=kwargs: self.es.search(**kw), "searching", pit=True)
                except _PitExpired as exc:
                    if on_expiry is None:
                        raise RetriableError(
                            f"source {cfg.name!r}: the point in time on index {cfg.index!r} expired (kept "
                            f"{KEEP_ALIVE} after each page) during a snapshot; the snapshot starts again"
                        ) from exc
                    log.warning("source=%s point in time on index %s expired (the page was held longer than %s); "
                                "reopening it and resuming at the last position", cfg.name, cfg.index, KEEP_ALIVE)
                    query, after = on_expiry(), None
                    pit = self._pit_id = self._open_pit()
                    continue
                pit = self._pit_id = resp.get("pit_id", pit)
                hits = resp["hits"]["hits"]
                if not hits:
                    return
                yield hits
                after = hits[-1]["sort"]
                if len(hits) < cfg.page_size:
                    return
        finally:
            try:
                self.es.close_point_in_time(id=pit)
            except Exception as exc:  # an expired PIT needs no closing
                log.debug("source=%s closing point in time: %s", cfg.name, exc)

    def _record(self, hit: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            value = self.coerce(hit.get("_source") or {})
        except CoercionError as exc:
            raise FatalError(f"source {self.name!r}: index {self.config.index!r} _id {hit['_id']!r}: {exc}") from exc
        return {"_id": hit["_id"]}, value

    def _position(self) -> dict[str, Any]:
        return {"mode": self.config.mode, "watermark": self.watermark, "inclusive": self.inclusive,
                "last_snapshot_ms": self.last_snapshot_ms}

    def poll(self) -> Iterator[SourceBatch]:
        """Read the next incremental range, or a full snapshot when one is due.

        Raises:
            RetriableError: the cluster failed or is busy.
            FatalError: a document does not fit the value schema (names index, ``_id`` and field).
        """
        if self.config.mode == "snapshot":
            yield from self._snapshot()
        else:
            yield from self._incremental()

    def _snapshot(self) -> Iterator[SourceBatch]:
        cfg = self.config
        now_ms = int(time.time() * 1000)
        if self.last_snapshot_ms is not None and now_ms - self.last_snapshot_ms < cfg.snapshot_interval_s * 1000:
            return
        ids: set[str] = set()
        for hits in self._pages({"match_all": {}}, ["_shard_doc"]):
            records = [self._record(h) for h in hits]
            ids.update(h["_id"] for h in hits)
            yield SourceBatch(records, None)
        self.last_snapshot_ms = now_ms
        self._snapshot_ids = ids
        yield SourceBatch([], self._position())

    def _upper(self) -> Any:
        upper = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.config.commit_delay_s)
        if self.updated_is_date:
            return upper.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return int(upper.timestamp() * 1000)

    def _incremental(self) -> Iterator[SourceBatch]:
        cfg = self.config
        field = cfg.updated_field or ""
        upper = self._upper()
        bounds: dict[str, Any] = {"lte": upper}
        if self.watermark is not None:
            bounds["gte" if self.inclusive else "gt"] = self.watermark
        if self.updated_is_date:
            bounds["format"] = "strict_date_optional_time||epoch_millis"
        sort = [{field: {"order": "asc", **({"format": "strict_date_optional_time"} if self.updated_is_date
                                            else {})}}, {"_shard_doc": "asc"}]
        def resume() -> dict[str, Any]:
            # the last page's sort value, inclusively: what the next run would start from
            again = {k: v for k, v in bounds.items() if k not in ("gt", "gte")}
            if self.watermark is not None:
                again["gte" if self.inclusive else "gt"] = self.watermark
            return {"range": {field: again}}

        for hits in self._pages({"range": {field: bounds}}, sort, on_expiry=resume):
            records = [self._record(h) for h in hits]
            # every document sorting before the last one's value is emitted: resume there, inclusively
            self.watermark = hits[-1]["sort"][0]
            self.inclusive = True
            yield SourceBatch(records, self._position())
        self.watermark = upper
        self.inclusive = False
        yield SourceBatch([], self._position())

    # -- reconcile ------------------------------------------------------------------------------------

    def wants_reconcile(self) -> bool:
        """Right after a snapshot: its ids settle deletes."""
        return self._snapshot_ids is not None

    def reconcile(self, state: TopicState) -> Iterator[SourceBatch]:
        """Tombstones for live keys whose ``_id`` is gone; documents the topic lacks are fetched and emitted.

        The index's ids are compared page by page with the worker's on-disk key
        set (bounded memory: one page of ids; a snapshot's id set when one just ran).

        Raises:
            RetriableError: the cluster failed.
        """
        ids = self._snapshot_ids
        self._snapshot_ids = None
        live, encode = state.live, state.encode_key
        seen: set[bytes] = set()

        def id_chunks() -> Iterator[list[str]]:
            if ids is not None:
                listed = sorted(ids)
                for i in range(0, len(listed), self.config.page_size):
                    yield listed[i:i + self.config.page_size]
            else:
                for hits in self._pages({"match_all": {}}, ["_shard_doc"], source=False):
                    yield [h["_id"] for h in hits]

        for chunk in id_chunks():
            by_key = {encode({"_id": i}): i for i in chunk}
            if isinstance(live, BoundedLiveKeys):
                missing = [by_key[kb] for kb in live.split(list(by_key))]
            else:
                seen.update(kb for kb in by_key if kb in live)
                missing = [i for kb, i in by_key.items() if kb not in live]
            if missing:
                resp = self._call(lambda c=missing: self.es.mget(index=self.config.index, ids=c),
                                  "fetching documents")
                yield SourceBatch([self._record(d) for d in resp["docs"] if d.get("found")], None)
        gone_keys = live.unseen() if isinstance(live, BoundedLiveKeys) else (kb for kb in list(live) if kb not in seen)
        yield from tombstone_batches(gone_keys, self.config.batch_records)

    def describe_key(self, key: Any) -> str:
        """E.g. ``index "products" _id 'p-1'``."""
        doc_id = key.get("_id") if isinstance(key, Mapping) else key
        return f"index {self.config.index!r} _id {doc_id!r}"

    def close(self) -> None:
        """Close the client."""
        if self.es is not None:
            self.es.close()
