"""Read back what the sinks hold: the Elasticsearch index, the PostgreSQL table, the S3 archive.

Used by ``threes demo`` and the end-to-end test to count progress and to
compare the output with the oracle. Reads only (no side effects):

* Elasticsearch: point-in-time + ``search_after`` (works on the minimal
  integ-test server and on the full one),
  with each hit's ``_version`` (the update's version: the event offset);
* PostgreSQL: one ``SELECT`` of the table through SQLAlchemy Core;
* S3: every Parquet object under a prefix, its ``dt=`` folder kept, the
  ``value`` struct flattened into columns.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from connectors.elasticsearch.connection import ElasticsearchConnection, elasticsearch_client
from connectors.rds.connection import RdsConnection, sql_engine
from connectors.s3.connection import S3Connection, s3_client
from kernel.exceptions import SetupError

log = logging.getLogger(__name__)

_DT = re.compile(r"/dt=(\d{4}-\d{2}-\d{2})/")


def count_index(conn: ElasticsearchConnection, index: str, client: Any | None = None) -> int:
    """Documents in an index (0 when it does not exist yet); refreshes first so the count is current."""
    from elasticsearch import NotFoundError

    es = client or elasticsearch_client(conn)
    try:
        es.indices.refresh(index=index)
        return int(es.count(index=index)["count"])
    except NotFoundError:
        return 0
    finally:
        if client is None:
            es.close()


def read_index(
    conn: ElasticsearchConnection, index: str, *, fields: Sequence[str] | None = None, page: int = 5_000
) -> Any:
    """Every document of an index as a DataFrame.

    Args:
        conn: the cluster.
        index: the index.
        fields: ``_source`` fields to fetch (all when ``None``).
        page: documents per request.

    Returns:
        A ``pandas.DataFrame`` with ``_id``, ``_version`` and the source fields
        (JSON values: timestamps stay ISO text).

    Raises:
        SetupError: the cluster refused the search.
    """
    import pandas as pd
    from elasticsearch import ApiError, TransportError

    es = elasticsearch_client(conn)
    rows: list[dict[str, Any]] = []
    try:
        es.indices.refresh(index=index)
        pit = es.open_point_in_time(index=index, keep_alive="2m")["id"]
        after = None
        try:
            while True:
                body: dict[str, Any] = {
                    "size": page, "pit": {"id": pit, "keep_alive": "2m"}, "sort": [{"_shard_doc": "asc"}],
                    "version": True, "track_total_hits": False,
                }
                if fields is not None:
                    body["_source"] = list(fields)
                if after is not None:
                    body["search_after"] = after
                hits = es.search(**body)["hits"]["hits"]
                if not hits:
                    break
                for hit in hits:
                    rows.append({"_id": hit["_id"], "_version": hit.get("_version"), **hit["_source"]})
                after = hits[-1]["sort"]
        finally:
            es.close_point_in_time(id=pit)
    except (ApiError, TransportError) as exc:
        raise SetupError(f"reading index {index!r}: {exc}") from exc
    finally:
        es.close()
    return pd.DataFrame(rows)


def read_sql_table(conn: RdsConnection, table: str, schema_name: str | None = None) -> Any:
    """Every row of a table as a DataFrame (an empty frame when the table does not exist yet)."""
    import pandas as pd
    from sqlalchemy import MetaData, Table, select
    from sqlalchemy.exc import NoSuchTableError, SQLAlchemyError

    engine = sql_engine(conn)
    try:
        tbl = Table(table, MetaData(), schema=schema_name, autoload_with=engine)
        with engine.connect() as db:
            result = db.execute(select(tbl))
            return pd.DataFrame(result.fetchall(), columns=list(result.keys()))
    except NoSuchTableError:
        return pd.DataFrame()
    except SQLAlchemyError as exc:
        raise SetupError(f"reading table {table!r}: {exc}") from exc
    finally:
        engine.dispose()


def list_objects(conn: S3Connection, bucket: str, prefix: str, client: Any | None = None) -> list[dict[str, Any]]:
    """The objects under a prefix (``Key``, ``Size``, ``LastModified``...); empty when the bucket is missing."""
    from botocore.exceptions import ClientError

    s3 = client or s3_client(conn)
    out: list[dict[str, Any]] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out.extend(page.get("Contents", []))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchBucket", "404"):
            return []
        raise SetupError(f"listing s3://{bucket}/{prefix}: {exc}") from exc
    return out


def read_parquet_objects(
    conn: S3Connection, bucket: str, keys: Sequence[str], *, columns: Sequence[str] | None = None, threads: int = 4,
    client: Any | None = None,
) -> Any:
    """Read Parquet objects into one Arrow table, with a ``dt`` column from each object's ``dt=`` folder.

    Args:
        conn: the S3 endpoint.
        bucket: the bucket.
        keys: the object keys.
        columns: top-level columns to read (all when ``None``).
        threads: concurrent GETs.
        client: a boto3 client to reuse.

    Returns:
        A ``pyarrow.Table`` (``None`` when ``keys`` is empty).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    s3 = client or s3_client(conn)

    def one(key: str) -> Any:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        # ParquetFile, not read_table: one object needs no dataset discovery (~40 % of a small object's read)
        table = pq.ParquetFile(io.BytesIO(body)).read(columns=list(columns) if columns else None)
        m = _DT.search(key)
        return table.append_column("dt", pa.array([m.group(1) if m else None] * table.num_rows, pa.string()))

    if not keys:
        return None
    with ThreadPoolExecutor(max_workers=threads) as pool:
        tables = list(pool.map(one, keys))
    return pa.concat_tables(tables, promote_options="default")


def read_archive(conn: S3Connection, bucket: str, prefix: str) -> Any:
    """The S3 archive as a DataFrame: one row per archived update, the value's fields as columns.

    Returns:
        A ``pandas.DataFrame`` with ``dt``, ``topic``, ``partition``, ``offset``,
        ``version``, ``deleted`` and the value's fields (empty when nothing is archived yet).
    """
    import pandas as pd

    keys = [o["Key"] for o in list_objects(conn, bucket, prefix) if o["Key"].endswith(".parquet")]
    table = read_parquet_objects(conn, bucket, keys)
    if table is None:
        return pd.DataFrame()
    value = table.column("value").combine_chunks()
    meta = table.drop_columns(["value", "key"]) if "key" in table.column_names else table.drop_columns(["value"])
    frame = meta.to_pandas()
    values = value.flatten() if hasattr(value, "flatten") else []
    for field, column in zip(value.type, values, strict=True):
        frame[field.name] = column.to_pandas(types_mapper=_nullable_ints)
    return frame


def _nullable_ints(arrow_type: Any) -> Any:
    import pandas as pd
    import pyarrow as pa

    return {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}.get(arrow_type)
