"""Reference tables into Elasticsearch (bulk, diffed by ``_id``) and S3 (one CSV object), idempotently.

The diff rules are :mod:`threes.demo.reference`'s: new documents are
indexed, changed ones re-indexed with a fresh ``updated_at``, missing ones
deleted, identical ones left alone; the S3 object is rewritten only when its
bytes differ.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.elasticsearch.connection import ElasticsearchConnection, elasticsearch_client
from connectors.s3.connection import S3Connection, s3_client
from kernel.exceptions import SetupError
from threes.demo.data import TABLES
from threes.demo.reference_diff import UPDATED_AT, LoadResult, diff, field_names, records, table_schema

log = logging.getLogger(__name__)


# -- Elasticsearch ---------------------------------------------------------------------------------


def es_mappings(schema: dict[str, Any]) -> dict[str, Any]:
    """Explicit index mappings of an Avro record: strings ``keyword``, numbers typed, timestamps ``date``.

    Raises:
        ValueError: a field type has no mapping here (records, arrays, maps).
    """
    from threes.demo.data import non_null

    kinds = {"int": "integer", "long": "long", "double": "double", "float": "float", "string": "keyword",
             "boolean": "boolean"}
    props: dict[str, Any] = {}
    for f in schema["fields"]:
        base, _ = non_null(f["type"])
        if isinstance(base, dict) and str(base.get("logicalType", "")).startswith("timestamp"):
            props[f["name"]] = {"type": "date"}
        elif (base if isinstance(base, str) else base.get("type")) in kinds:
            props[f["name"]] = {"type": kinds[base if isinstance(base, str) else base["type"]]}
        else:
            raise ValueError(f"field {f['name']!r}: no index mapping for Avro type {base}")
    return {"properties": props}


def _doc_id(row: Mapping[str, Any], key: Sequence[str]) -> str:
    return "|".join(str(row[k]) for k in key)


def load_elasticsearch(
    conn: ElasticsearchConnection, table: str, frame: Any, *, index: str | None = None
) -> LoadResult:
    """Create the index if missing and make its documents equal to ``frame``'s rows.

    ``_id`` is the key (composite keys joined by ``|``, as ``ElasticsearchSink``
    does); each written document gets ``updated_at`` = now (UTC, ms).

    Args:
        conn: the cluster.
        table: the dataset table (``planes``).
        frame: the rows wanted.
        index: the index name (default ``table``).

    Returns:
        What was done.

    Raises:
        SetupError: the cluster refused a request or an item.
    """
    from elasticsearch import ApiError, TransportError, helpers

    started = time.monotonic()
    index = index or table
    key = list(TABLES[table].key)
    columns = field_names(table)
    values = [c for c in columns if c not in key]
    result = LoadResult(table, f"index {index}")
    client = elasticsearch_client(conn)
    try:
        if not client.indices.exists(index=index):
            mappings = es_mappings(table_schema(table))
            mappings["properties"][UPDATED_AT] = {"type": "date"}
            client.indices.create(index=index, mappings={"dynamic": "strict", **mappings},
                                  settings={"number_of_replicas": 0})
        client.indices.refresh(index=index)
        existing = [hit["_source"] for hit in helpers.scan(client, index=index, query={"query": {"match_all": {}}},
                                                           size=5000)]
        inserts, updates, deletes, result.unchanged = diff(records(frame, columns), existing, key, values)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        actions: list[dict[str, Any]] = [
            {"_op_type": "index", "_index": index, "_id": _doc_id(r, key), "_source": {**r, UPDATED_AT: now}}
            for r in inserts + updates
        ]
        actions += [{"_op_type": "delete", "_index": index, "_id": "|".join(str(v) for v in k)} for k in deletes]
        if actions:
            ok, errors = helpers.bulk(client, actions, chunk_size=2000, raise_on_error=False, refresh="wait_for")
            # errors is the list of refused items (a count only with stats_only=True)
            if isinstance(errors, list) and errors:
                raise SetupError(f"loading {table} into index {index}: {len(errors)} item(s) refused, e.g. {errors[0]}")
    except (ApiError, TransportError) as exc:
        raise SetupError(f"loading {table} into index {index}: {exc}") from exc
    finally:
        client.close()
    result.inserted, result.updated, result.deleted = len(inserts), len(updates), len(deletes)
    result.elapsed_s = time.monotonic() - started
    log.info("reference load %s", result.summary())
    return result


# -- S3 ---------------------------------------------------------------------------------------------


def csv_bytes(frame: Any, columns: Sequence[str]) -> bytes:
    """A frame as CSV text the way the dataset writes it: header, ``NA`` for null, ISO UTC timestamps."""
    out = io.StringIO()
    frame[list(columns)].to_csv(out, index=False, na_rep="NA", date_format="%Y-%m-%dT%H:%M:%SZ")
    return out.getvalue().encode()


def load_s3(
    conn: S3Connection, table: str, frame: Any, *, bucket: str, key: str, create_bucket: bool = True
) -> LoadResult:
    """Write a dataset table as one CSV object, only when its bytes differ from what is there.

    Args:
        conn: the S3 endpoint.
        table: the dataset table (``airlines``).
        frame: the rows wanted.
        bucket: the bucket (created when missing and ``create_bucket``).
        key: the object key, e.g. ``reference/airlines/airlines.csv``.
        create_bucket: create a missing bucket.

    Returns:
        What was done (``updated`` counts the rows that differ from the previous object).

    Raises:
        SetupError: the endpoint refused a request.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    started = time.monotonic()
    result = LoadResult(table, f"s3://{bucket}/{key}")
    columns = field_names(table)
    body = csv_bytes(frame, columns)
    s3 = s3_client(conn)
    try:
        try:
            s3.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if not create_bucket or exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                raise
            s3.create_bucket(Bucket=bucket)
        try:
            old = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            old = None
        new_lines = body.decode().splitlines()[1:]
        if old is None:
            result.inserted = len(new_lines)
        elif old == body:
            result.unchanged = len(new_lines)
        else:
            old_lines = set(old.decode().splitlines()[1:])
            result.updated = sum(1 for line in new_lines if line not in old_lines)
            result.unchanged = len(new_lines) - result.updated
        if old != body:
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="text/csv")
    except (BotoCoreError, ClientError) as exc:
        raise SetupError(f"loading {table} into s3://{bucket}/{key}: {exc}") from exc
    result.elapsed_s = time.monotonic() - started
    log.info("reference load %s", result.summary())
    return result
