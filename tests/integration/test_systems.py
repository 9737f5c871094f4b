"""Round trips through the project's own client factories against the real systems."""

from __future__ import annotations

import datetime as dt
import decimal

import sqlalchemy as sa

from connectors.rds.connection import sql_engine


def test_sql_round_trip(pg_engine, unique):
    meta = sa.MetaData()
    table = sa.Table(
        f"rt_{unique}",
        meta,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("amount", sa.Numeric(12, 2)),
        sa.Column("at", sa.DateTime(timezone=True)),
        sa.Column("doc", sa.JSON),
    )
    meta.create_all(pg_engine)
    at = dt.datetime(2013, 1, 1, 6, tzinfo=dt.UTC)
    with pg_engine.begin() as conn:
        conn.execute(table.insert(), [{"id": 1, "amount": decimal.Decimal("10.25"), "at": at, "doc": {"a": [1, 2]}}])
    with pg_engine.connect() as conn:
        row = conn.execute(sa.select(table)).one()
    assert row.id == 1 and row.amount == decimal.Decimal("10.25") and row.at == at and row.doc == {"a": [1, 2]}
    meta.drop_all(pg_engine)


def test_index_and_search_a_document(es, unique):
    index = f"rt-{unique}"
    es.index(index=index, id="N10156", document={"tailnum": "N10156", "manufacturer": "EMBRAER", "seats": 55}, refresh=True)
    hits = es.search(index=index, query={"match": {"manufacturer": "embraer"}})["hits"]["hits"]
    assert [(h["_id"], h["_source"]["seats"]) for h in hits] == [("N10156", 55)]
    # external versioning, as the sinks use it: a stale version is rejected with 409
    es.index(index=index, id="v", document={"n": 2}, version=2, version_type="external", refresh=True)
    import pytest
    from elasticsearch import ConflictError

    with pytest.raises(ConflictError):
        es.index(index=index, id="v", document={"n": 1}, version=1, version_type="external")
    assert es.get(index=index, id="v")["_source"] == {"n": 2}
    es.indices.delete(index=index)


def test_put_list_and_get_an_object(s3, unique):
    bucket = f"rt-{unique}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="airlines/airlines.csv", Body=b"carrier,name\n9E,Endeavor Air Inc.\n")
    s3.put_object(Bucket=bucket, Key="other/x.txt", Body=b"x")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="airlines/")
    assert [o["Key"] for o in listed["Contents"]] == ["airlines/airlines.csv"]
    body = s3.get_object(Bucket=bucket, Key="airlines/airlines.csv")["Body"].read()
    assert body == b"carrier,name\n9E,Endeavor Air Inc.\n"
    for key in ("airlines/airlines.csv", "other/x.txt"):
        s3.delete_object(Bucket=bucket, Key=key)
    s3.delete_bucket(Bucket=bucket)


def test_client_factories_keep_secrets_out_of_repr(s3_conn, pg):
    assert "threes-secret-key" not in repr(s3_conn)
    assert "threes:threes@" not in pg.url and pg.password is not None
    assert sql_engine(pg).url.password == "threes"  # revealed only to SQLAlchemy
