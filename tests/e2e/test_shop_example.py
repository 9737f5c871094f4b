"""The shop example (examples/shop) through ``threes run``: the stream's language, checked in every sink.

The test runs the shipped example as a user does (docs/first-pipeline.md, "The shop"), with
every topic, table, index and prefix made unique (:func:`threes.demo.isolate.write_isolated`):
the example's generator loads the reference data, ``threes run`` starts sources, stream job and
sync services, the generator produces the order lines, and each sink is compared with an oracle
computed here in pandas from the generated rows: the where (test lines nowhere), the derive
columns (the date, the exact decimal amount, the upper-cased code), the chain line -> order ->
customer -> nation with its nulls, the cancelled lines deleted (PostgreSQL row and Elasticsearch
document gone, a tombstone last in the archive), the hopping windows per region and the sessions
per customer (all but the one the closing line keeps open).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from connectors.elasticsearch.connection import elasticsearch_client
from connectors.rds.connection import sql_engine
from connectors.s3.connection import s3_client
from tests.e2e.conftest import cleanup
from tests.e2e.test_first_pipeline import Output, wait_for
from threes.config import load_pipeline
from threes.demo.isolate import free_port, write_isolated
from threes.examples.shop import generate as shop_generator

THREES = str(Path(sys.executable).with_name("threes"))
SHOP = Path(__file__).resolve().parents[2] / "examples" / "shop"
WINDOW, SLIDE, GAP, WATERMARK = timedelta(hours=1), timedelta(minutes=30), timedelta(minutes=20), timedelta(hours=1)
ROW_FIELDS = ["order_id", "sku", "quantity", "status", "order_customer_id", "order_channel", "customer_name",
              "customer_nation", "customer_segment", "nation_code", "nation_name", "nation_region"]


# -- the oracle -------------------------------------------------------------------------------------------------


def enriched_frame(shop: shop_generator.Shop) -> pd.DataFrame:
    """Every event the stream keeps (its where), enriched along the chain, with the derive columns."""
    orders = pd.DataFrame(shop.orders).set_index("order_id")
    customers = pd.DataFrame(shop.customers).set_index("customer_id")
    nations = pd.DataFrame(shop.nations).set_index("code")
    frame = pd.DataFrame(shop.all_events)
    frame = frame[frame["status"] != "test"].reset_index(drop=True)
    frame["order_customer_id"] = frame["order_id"].map(orders["customer_id"])
    frame["order_channel"] = frame["order_id"].map(orders["channel"])
    for field in ("name", "nation", "segment"):
        frame[f"customer_{field}"] = frame["order_customer_id"].map(customers[field])
    frame["nation_code"] = frame["customer_nation"].str.upper()
    for field in ("name", "region"):
        frame[f"nation_{field}"] = frame["nation_code"].map(nations[field])
    times = [t.to_pydatetime() for t in frame["line_time"]]
    frame["line_date"] = [t.date() for t in times]
    frame["amount"] = [p * int(q) * (1 - d) for p, q, d in zip(frame["unit_price"], frame["quantity"],
                                                                frame["discount"], strict=True)]
    frame = frame.astype(object).where(frame.notna(), None)
    frame["line_time"] = pd.Series(times, dtype=object)  # aware datetimes, as the sinks' clients return them
    return frame


def expected_lines(frame: pd.DataFrame) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """Per line id, its last event: the row the sinks hold, or (cancelled) a deletion."""
    last = frame.groupby("line_id").tail(1).set_index("line_id")
    rows = {int(i): r.to_dict() for i, r in last.iterrows() if r["status"] != "cancelled"}
    return rows, {int(i) for i, r in last.iterrows() if r["status"] == "cancelled"}


def _hopping_starts(at: datetime) -> list[datetime]:
    """Starts of the hopping windows holding ``at``: multiples of the slide since the epoch (Spark's)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    start = epoch + ((at - epoch) // SLIDE) * SLIDE
    starts = []
    while start + WINDOW > at:
        starts.append(start)
        start -= SLIDE
    return starts


def expected_revenue(frame: pd.DataFrame) -> dict[tuple[str, datetime], dict[str, Any]]:
    """Per (region, hopping window start): the aggregates of the open lines with a region."""
    lines = frame[(frame["status"] == "open") & frame["nation_region"].notna()].copy()
    lines["window_start"] = lines["line_time"].map(_hopping_starts)
    lines = lines.explode("window_start")
    out = {}
    for (region, start), group in lines.groupby(["nation_region", "window_start"]):
        out[(region, pd.Timestamp(start).to_pydatetime())] = {"lines": len(group), "units": int(group["quantity"].sum()),
                                "revenue": sum(group["amount"], Decimal(0)), "max_amount": max(group["amount"]),
                                "customers": int(group["order_customer_id"].nunique())}
    return out


def expected_sessions(frame: pd.DataFrame) -> dict[tuple[str, datetime], dict[str, Any]]:
    """Per (customer, session start): sessions of open lines closed by the watermark (the closing one is not)."""
    lines = frame[(frame["status"] == "open") & frame["order_customer_id"].notna()].copy()
    lines["t"] = pd.to_datetime(lines["line_time"], utc=True)
    lines = lines.sort_values("t")
    watermark = lines["line_time"].max() - WATERMARK
    out = {}
    for customer, group in lines.groupby("order_customer_id"):
        session = (group["t"].diff() >= GAP).cumsum()
        for _, events in group.groupby(session):
            start, end = events["line_time"].iloc[0], events["line_time"].iloc[-1] + GAP
            if end > watermark:
                continue  # still open: append mode writes a session once the watermark passes its end
            out[(customer, start)] = {"window_end": end, "lines": len(events), "spend": sum(events["amount"], Decimal(0)),
                                      "skus": int(events["sku"].nunique()), "first_sku": events["sku"].iloc[0],
                                      "last_sku": events["sku"].iloc[-1]}
    return out


# -- the run ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shop_run(tmp_path_factory: pytest.TempPathFactory, stack: Any, endpoints: Any) -> Iterator[dict[str, Any]]:
    """The isolated example, its reference data loaded, ``threes run``, the events; yields what the sinks hold."""
    folder = tmp_path_factory.mktemp("shop")
    unique = uuid.uuid4().hex[:10]
    for schema in SHOP.glob("*.avsc"):  # relative schema paths start at the config file's folder
        shutil.copy(schema, folder / schema.name)
    config = write_isolated(SHOP / "pipeline.yaml", folder / "pipeline.yaml", unique, free_port)
    env = {**os.environ, **endpoints.as_env(), "THREES_HOME": str(stack.home),
           "THREES_CHECKPOINTS": str(folder / "checkpoints")}
    pipeline = load_pipeline(config, environ=env)
    offsets_topic = f"_threes_offsets.{unique}"
    shop = shop_generator.generate()
    shop_generator.load_reference(pipeline, shop, folder)
    process = subprocess.Popen(  # our own console script
        [THREES, "run", "pipeline.yaml", "--log-dir", "logs", "--offsets-topic", offsets_topic],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    output = Output(process, folder / "logs")
    sinks = Sinks(pipeline)
    try:
        wait_for("ready pipeline", lambda: any(line.startswith("[run] running:") for line in output.lines), 300,
                 process, output)
        assert shop_generator.produce_events(pipeline, shop, folder) == len(shop.all_events)
        frame = enriched_frame(shop)
        rows, deleted = expected_lines(frame)
        revenue, sessions = expected_revenue(frame), expected_sessions(frame)
        wait_for("order lines in PostgreSQL", lambda: set(sinks.table_lines()) == set(rows), 300, process, output)
        wait_for("order lines in Elasticsearch", lambda: set(sinks.es_lines()) == set(rows), 120, process, output)
        wait_for("the archive's last records", lambda: set(sinks.archive()) == set(rows) | deleted, 120, process,
                 output)
        wait_for("hopping windows", lambda: set(sinks.revenue()) == set(revenue), 180, process, output)
        wait_for("sessions", lambda: set(sinks.sessions()) == set(sessions), 180, process, output)
        yield {"frame": frame, "rows": rows, "deleted": deleted, "revenue": revenue, "sessions": sessions,
               "table": sinks.table_lines(), "table_tombstones": sinks.table_tombstones(), "es": sinks.es_lines(), "archive": sinks.archive(),
               "got_revenue": sinks.revenue(), "got_sessions": sinks.sessions(), "logs": folder / "logs"}
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        sinks.close()
        cleanup(pipeline, offsets_topic)


class Sinks:
    """What each sink of the isolated pipeline holds, read with the test's own clients."""

    def __init__(self, pipeline: Any):
        sinks = {s.name: s for svc in pipeline.sync for s in svc.sinks}
        self.lines_table = sinks["lines-table"].table
        self.revenue_table = sinks["region-revenue"].table
        self.sessions_table = sinks["customer-sessions"].table
        self.index = sinks["lines-index"].index
        self.bucket, self.prefix = sinks["lines-archive"].bucket, sinks["lines-archive"].prefix
        self.engine = sql_engine(pipeline.connections["postgres"])
        self.es = elasticsearch_client(pipeline.connections["elasticsearch"])
        self.s3 = s3_client(pipeline.connections["s3"])

    def close(self) -> None:
        self.engine.dispose()
        self.es.close()

    def _select(self, sql: str) -> list[dict[str, Any]]:
        from sqlalchemy import text
        from sqlalchemy.exc import ProgrammingError

        try:
            with self.engine.connect() as db:
                return [dict(r._mapping) for r in db.execute(text(sql))]
        except ProgrammingError:  # the sink has not created its table yet
            return []

    def table_lines(self) -> dict[int, dict[str, Any]]:
        return {r["line_id"]: r for r in self._select(f'SELECT * FROM "{self.lines_table}"')}

    def table_tombstones(self) -> dict[int, dict[str, Any]]:
        """The lines table's deleted keys and their versions (``<table>__deleted``)."""
        return {r["line_id"]: r for r in self._select(f'SELECT * FROM "{self.lines_table}__deleted"')}

    def revenue(self) -> dict[tuple[str, datetime], dict[str, Any]]:
        return {(r["nation_region"], r["window_start"]): r for r in self._select(f'SELECT * FROM "{self.revenue_table}"')}

    def sessions(self) -> dict[tuple[str, datetime], dict[str, Any]]:
        rows = self._select(f'SELECT * FROM "{self.sessions_table}"')
        return {(r["order_customer_id"], r["window_start"]): r for r in rows}

    def es_lines(self) -> dict[int, dict[str, Any]]:
        from elasticsearch import NotFoundError

        try:
            self.es.indices.refresh(index=self.index)
            hits = self.es.search(index=self.index, size=10_000, query={"match_all": {}})["hits"]["hits"]
        except NotFoundError:
            return {}
        return {int(h["_id"]): h["_source"] for h in hits}

    def archive(self) -> dict[int, dict[str, Any]]:
        """The record of the highest version per line id: ``deleted`` and ``value``."""
        import pyarrow.parquet as pq

        latest: dict[int, dict[str, Any]] = {}
        listing = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix).get("Contents", [])
        for obj in listing:
            if not obj["Key"].endswith(".parquet"):
                continue
            body = self.s3.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"].read()
            for row in pq.read_table(io.BytesIO(body)).to_pylist():
                line_id = json.loads(row["key"])["line_id"]
                if line_id not in latest or row["version"] > latest[line_id]["version"]:
                    latest[line_id] = {**row, "object": obj["Key"]}
        return latest


# -- the checks -------------------------------------------------------------------------------------------------


def test_the_where_drops_test_lines_and_cancelled_lines_are_deleted_from_postgresql(shop_run: dict[str, Any]) -> None:
    table, rows, frame = shop_run["table"], shop_run["rows"], shop_run["frame"]
    assert set(table) == set(rows)
    test_ids = {e["line_id"] for e in shop_generator.generate().all_events if e["status"] == "test"}
    assert test_ids and not test_ids & set(table)
    assert shop_run["deleted"] and not shop_run["deleted"] & set(table)  # cancelled: the row is gone
    assert set(shop_run["table_tombstones"]) == shop_run["deleted"]  # ...its key and version kept beside
    for line_id, want in rows.items():
        got = table[line_id]
        assert {f: got[f] for f in ROW_FIELDS} == {f: want[f] for f in ROW_FIELDS}, line_id
        assert got["amount"] == want["amount"], line_id  # exact decimal arithmetic
        assert got["line_date"] == want["line_date"], line_id
        assert got["line_time"] == want["line_time"], line_id
    # the chain's nulls: an unknown order stops it at the order, an unknown customer at the customer, a
    # nation not in the file at the nation
    assert any(r["order_customer_id"] is None for r in table.values())
    assert any(r["order_customer_id"] is not None and r["customer_name"] is None for r in table.values())
    assert any(r["customer_nation"] is not None and r["nation_region"] is None for r in table.values())
    assert len(frame) > len(rows)


def test_elasticsearch_holds_the_same_lines_and_the_cancelled_documents_are_deleted(shop_run: dict[str, Any]) -> None:
    docs, rows = shop_run["es"], shop_run["rows"]
    assert set(docs) == set(rows)
    for line_id, want in rows.items():
        doc = docs[line_id]
        assert {f: doc.get(f) for f in ROW_FIELDS} == {f: want[f] for f in ROW_FIELDS}, line_id
        assert Decimal(str(doc["amount"])) == want["amount"], line_id
        assert doc["line_date"] == want["line_date"].isoformat(), line_id


def test_the_archive_keeps_every_line_and_a_tombstone_last_for_each_cancelled_one(shop_run: dict[str, Any]) -> None:
    archive, rows, deleted = shop_run["archive"], shop_run["rows"], shop_run["deleted"]
    assert set(archive) == set(rows) | deleted
    for line_id in deleted:
        tombstone = archive[line_id]
        assert tombstone["deleted"] and tombstone["value"] is None, line_id
        # no line_date in a tombstone: its dt= folder is the date of its Kafka timestamp
        produced = datetime.fromtimestamp(tombstone["timestamp_ms"] / 1000, UTC).date()
        assert f"/dt={produced.isoformat()}/" in tombstone["object"], tombstone["object"]
    for line_id, want in rows.items():
        got = archive[line_id]
        assert not got["deleted"], line_id
        assert {f: got["value"][f] for f in ROW_FIELDS} == {f: want[f] for f in ROW_FIELDS}, line_id
        assert got["value"]["amount"] == want["amount"], line_id
        # partition_by line_date: the line's own day
        assert f"/dt={want['line_date'].isoformat()}/" in got["object"], got["object"]


def test_hopping_windows_per_region_match_the_oracle(shop_run: dict[str, Any]) -> None:
    got, want = shop_run["got_revenue"], shop_run["revenue"]
    assert set(got) == set(want)
    assert sum(w["lines"] for w in want.values()) == 2 * sum(  # a 1 hour window every 30 minutes: 2 per line
        1 for _, r in shop_run["frame"].iterrows() if r["status"] == "open" and r["nation_region"] is not None)
    for key, w in want.items():
        g = got[key]
        assert g["window_end"] - g["window_start"] == WINDOW, key
        assert {k: g[k] for k in w} == w, key


def test_sessions_per_customer_match_the_oracle_and_the_open_one_is_not_written(shop_run: dict[str, Any]) -> None:
    got, want = shop_run["got_sessions"], shop_run["sessions"]
    assert set(got) == set(want)
    closing = shop_generator.generate().closing
    assert all(start < closing["line_time"] for _, start in got)  # the closing line's session is still open
    assert any(w["lines"] > 1 for w in want.values())
    for key, w in want.items():
        assert {k: got[key][k] for k in w} == w, key
