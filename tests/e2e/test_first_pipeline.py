"""A user's first pipeline from an empty folder, run with ``threes run`` only (docs/first-pipeline.md).

The test plays the user: in a fresh folder it generates a small shop (customers
in PostgreSQL, products as a CSV object in S3, stores in Elasticsearch, orders
as a CSV of events), writes the YAML and the Avro schemas, starts
``threes run pipeline.yaml`` as a subprocess before the events topic exists,
replays the orders with ``threes replay`` once every part is ready, and compares
every sink (the Elasticsearch index, the PostgreSQL aggregate table, the Parquet
archive in S3) with an oracle computed here in plain Python from the generated
rows. A Ctrl-C (SIGINT) then stops the run: sync services, stream job and sources
in that order, exit code 0, no traceback.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.elasticsearch.connection import elasticsearch_client
from connectors.rds.connection import sql_engine
from connectors.s3.connection import s3_client
from threes.config import load_pipeline

THREES = str(Path(sys.executable).with_name("threes"))
CATEGORIES = ["books", "games", "tools"]
COUNTRIES = ["DE", "FR", "JP", "US"]
N_ORDERS = 240


def generate(seed: int = 14) -> dict[str, list[dict[str, Any]]]:
    """The shop: 12 customers, 8 products, 3 stores and 240 orders (some with unknown customers or stores)."""
    rnd = random.Random(seed)
    customers = [{"customer_id": i, "name": f"customer {i:02d}", "country": rnd.choice(COUNTRIES)}
                 for i in range(1, 13)]
    products = [{"product_id": f"P{i:02d}", "name": f"product {i}", "category": CATEGORIES[i % 3],
                 "unit_price": rnd.randint(1, 400) / 4} for i in range(1, 9)]
    stores = [{"store_id": f"S{i}", "name": f"store {i}", "city": city}
              for i, city in enumerate(["Berlin", "Lyon", "Osaka"], start=1)]
    start = datetime(2024, 5, 1, 8, tzinfo=UTC)
    orders = [
        {
            "order_id": i,
            "customer_id": rnd.randint(1, 14),  # 13 and 14 are nobody: a left join keeps them, fields null
            "product_id": rnd.choice(products)["product_id"],
            "store_id": rnd.choice(["S1", "S2", "S3", "S4"]),  # S4 is no store
            "quantity": rnd.randint(1, 5),
            "order_time": start + timedelta(minutes=7 * i),
        }
        for i in range(1, N_ORDERS + 1)
    ]
    return {"customers": customers, "products": products, "stores": stores, "orders": orders}


def oracle(data: dict[str, list[dict[str, Any]]]) -> tuple[dict[int, dict[str, Any]], dict[str, dict[str, int]]]:
    """What the sinks must hold: enriched orders by order_id, and per product category the aggregates."""
    customers = {c["customer_id"]: c for c in data["customers"]}
    products = {p["product_id"]: p for p in data["products"]}
    stores = {s["store_id"]: s for s in data["stores"]}
    enriched: dict[int, dict[str, Any]] = {}
    per_category: dict[str, dict[str, int]] = defaultdict(lambda: {"orders": 0, "units": 0, "max_quantity": 0})
    for o in data["orders"]:
        c, p, s = customers.get(o["customer_id"]), products[o["product_id"]], stores.get(o["store_id"])
        enriched[o["order_id"]] = {
            **{k: v for k, v in o.items() if k != "order_time"},
            "customer_name": c["name"] if c else None,
            "customer_country": c["country"] if c else None,
            "product_name": p["name"],
            "product_category": p["category"],
            "product_unit_price": p["unit_price"],
            "store_city": s["city"] if s else None,
        }
        agg = per_category[p["category"]]
        agg["orders"] += 1
        agg["units"] += o["quantity"]
        agg["max_quantity"] = max(agg["max_quantity"], o["quantity"])
    return enriched, dict(per_category)


ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "customer_id", "type": "int"},
    {"name": "product_id", "type": "string"},
    {"name": "store_id", "type": "string"},
    {"name": "quantity", "type": "int"},
    {"name": "order_time", "type": {"type": "long", "logicalType": "timestamp-micros"}},
]}
# The products' and stores' sources are given their value schema (typed CSV columns, a chosen record name);
# the customers' comes from the table. The snapshots need no reader schema: they read with the writer
# schemas their topics carry; the stores' key is the Elasticsearch _id (lookups join on `_id`).
PRODUCT = {"type": "record", "name": "Product", "namespace": "shop", "fields": [
    {"name": "product_id", "type": "string"}, {"name": "name", "type": "string"},
    {"name": "category", "type": "string"}, {"name": "unit_price", "type": "double"}]}
STORE = {"type": "record", "name": "Store", "namespace": "shop", "fields": [
    {"name": "store_id", "type": "string"}, {"name": "name", "type": "string"}, {"name": "city", "type": "string"}]}
PIPELINE = """\
# the shop's first pipeline (written by tests/e2e/test_first_pipeline.py)
kafka:
  bootstrap_servers: ${{env:THREES_KAFKA_BOOTSTRAP:-127.0.0.1:19092}}
connections:
  postgres:
    type: rds
    url: ${{env:THREES_POSTGRES_URL:-postgresql+psycopg://threes:threes@127.0.0.1:15432/threes}}
  elasticsearch:
    type: elasticsearch
    hosts: ["${{env:THREES_ELASTICSEARCH_URL:-http://127.0.0.1:19200}}"]
  s3:
    type: s3
    endpoint_url: ${{env:THREES_S3_ENDPOINT_URL:-http://127.0.0.1:18090}}
    access_key_id: ${{env:THREES_S3_ACCESS_KEY_ID:-threes}}
    secret_access_key: ${{env:THREES_S3_SECRET_ACCESS_KEY:-threes-secret-key}}
    path_style: true

sources:
  - {{name: customers, type: rds_source, connection: postgres, topic: state.customers.{u}, schema_name: {schema},
     table: customers, mode: timestamp, timestamp_column: updated_at, commit_delay_s: 0, poll_interval_s: 1}}
  - {{name: products, type: s3_source, connection: s3, topic: state.products.{u}, bucket: {bucket},
     prefix: reference/products/, format: csv, key: [product_id], value_schema: schemas/product.avsc,
     poll_interval_s: 1}}
  - {{name: stores, type: elasticsearch_source, connection: elasticsearch, topic: state.stores.{u},
     index: {stores_index}, value_schema: schemas/store.avsc, mode: snapshot, poll_interval_s: 1}}

stream:
  events: {{topic: orders.{u}, value_schema: schemas/order.avsc, starting_offsets: earliest,
           topic_spec: {{partitions: 2}}}}
  snapshots:                 # no reader schemas: read with the writer schemas the state topics carry
    - {{name: customers, topics: [state.customers.{u}]}}
    - {{name: products, topics: [state.products.{u}]}}
    - {{name: stores, topics: [state.stores.{u}]}}
  lookups:
    - {{snapshot: customers, on: {{customer_id: customer_id}}, prefix: customer_, fields: [name, country]}}
    - {{snapshot: products, on: {{product_id: product_id}}, prefix: product_, fields: [name, category, unit_price]}}
    - {{snapshot: stores, on: {{store_id: _id}}, prefix: store_, fields: [city]}}
  enriched_topic: orders.enriched.{u}
  updates:
    - {{topic: updates.orders.{u}, kind: projection, key: [order_id], version: offset}}
    - topic: updates.sales.{u}
      kind: aggregation
      group_by: [product_category]
      event_time: order_time
      window: 36500 days
      watermark: 36500 days
      aggregations: {{orders: count, units: sum(quantity), max_quantity: max(quantity)}}
  dead_letter_topic: orders.dlq.{u}
  checkpoint_location: checkpoints
  trigger_interval_s: 1
  spark:
    master: local[2]
    conf: {{spark.sql.shuffle.partitions: "2"}}

sync:
  - name: search
    dead_letter_topic: updates.dlq.{u}
    batch: {{max_age_ms: 500}}
    sinks:
      - {{name: orders-index, type: elasticsearch_sink, connection: elasticsearch, topics: [updates.orders.{u}],
         index: {orders_index}}}
  - name: warehouse
    dead_letter_topic: updates.dlq.{u}
    batch: {{max_age_ms: 500}}
    sinks:
      - {{name: sales, type: rds_sink, connection: postgres, topics: [updates.sales.{u}], schema_name: {schema},
         table: sales_by_category, key: [product_category, window_start], create_table: true}}
  - name: archive
    dead_letter_topic: updates.dlq.{u}
    batch: {{max_age_ms: 500}}
    sinks:
      - {{name: orders-archive, type: s3_sink, connection: s3, topics: [updates.orders.{u}], bucket: {bucket},
         prefix: archive/, format: parquet, rotate_interval_s: 2}}
"""


class Output:
    """The lines a child prints, collected by a thread (so its pipe never fills)."""

    def __init__(self, process: subprocess.Popen[str], logs: Path):
        self.lines: list[str] = []
        self.logs = logs
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def report(self) -> str:
        """Each part's threads in our code (from :func:`dump_stacks`) and log tail, then what ``threes run`` printed.

        The part most worth reading comes last: a CI excerpt keeps the end.
        """
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            dump = [i for i, line in enumerate(lines) if line.startswith(("Thread 0x", "Current thread 0x"))]
            logged = [ln for ln in lines if ln and not ln.startswith(("  File ", "Thread 0x", "Current thread 0x"))]
            threads = []
            if dump:
                bounds = [*dump, len(lines)]
                for start, end in itertools.pairwise(bounds):
                    frames = [ln for ln in lines[start + 1 : end] if ln.startswith("  File ")]
                    if any(own in ln for ln in frames for own in OWN_CODE):
                        threads.append("\n".join([lines[start], *frames[:12]]))
            parts.append(f"--- {log.name}: threads in threes' code at the timeout ---\n" + "\n".join(threads))
            parts.append(f"--- {log.name}: last 30 lines ---\n" + "\n".join(logged[-30:]))
        status = [i for i, line in enumerate(self.lines) if line.startswith("[run] running:")]
        printed = [line for i, line in enumerate(self.lines) if i in status[-3:] or i not in set(status)]
        return "\n".join([*parts, "--- threes run printed ---", *printed[-60:]])


OWN_CODE = ("/sync_service/", "/kernel/", "/connectors/", "/stream_app/", "/schemas/")


def dump_stacks(parent: int) -> None:
    """Send SIGUSR1 to the children of ``parent`` (the parts of ``threes run``), then give them a second to print."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:  # the field after the state: the parent's pid
            with contextlib.suppress(OSError):
                os.kill(int(stat.parent.name), signal.SIGUSR1)
    time.sleep(1.0)


def wait_for(what: str, check: Any, timeout_s: float, process: subprocess.Popen[str], output: Output) -> Any:
    """Poll ``check()`` until truthy; fail with the run's output when it exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if process.poll() is not None:
            pytest.fail(f"threes run exited ({process.returncode}) while waiting for {what}:\n{output.report()}")
        if time.monotonic() > deadline:
            dump_stacks(process.pid)  # each part prints where its threads wait into its log (SIGUSR1)
            pytest.fail(f"no {what} within {timeout_s:.0f} s; threes run said:\n{output.report()}")
        time.sleep(1.0)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, stack: Any, endpoints: Any, pg: Any, es_conn: Any,
         s3_conn: Any):
    """The fresh folder with data in the three systems, the YAML and the schemas; everything removed afterwards."""
    from sqlalchemy import text

    from tests.e2e.conftest import cleanup

    folder = tmp_path_factory.mktemp("first-pipeline")
    u = uuid.uuid4().hex[:10]
    names = {"u": u, "schema": f"shop_{u}", "bucket": f"shop-{u}", "stores_index": f"stores_{u}",
             "orders_index": f"orders_{u}"}
    data = generate()
    (folder / "schemas").mkdir()
    for name, schema in [("order", ORDER), ("product", PRODUCT), ("store", STORE)]:
        (folder / "schemas" / f"{name}.avsc").write_text(json.dumps(schema, indent=1))
    (folder / "pipeline.yaml").write_text(PIPELINE.format(**names))
    with (folder / "orders.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(data["orders"][0]))
        writer.writeheader()
        for o in data["orders"]:
            writer.writerow({**o, "order_time": o["order_time"].strftime("%Y-%m-%dT%H:%M:%SZ")})

    # the stack's endpoints, and its home: the stream job takes the Spark connector jars from there
    env = {**os.environ, **endpoints.as_env(), "THREES_HOME": str(stack.home)}
    pipeline = load_pipeline(folder / "pipeline.yaml", environ=env)
    engine = sql_engine(pg)
    with engine.begin() as db:
        db.execute(text(f'CREATE SCHEMA "{names["schema"]}"'))
        db.execute(text(f'CREATE TABLE "{names["schema"]}".customers (customer_id integer PRIMARY KEY, '
                        "name text NOT NULL, country text NOT NULL, updated_at timestamptz NOT NULL)"))
        db.execute(text(f'INSERT INTO "{names["schema"]}".customers VALUES (:customer_id, :name, :country, '
                        "now() - interval '1 hour')"), data["customers"])
    s3 = s3_client(s3_conn)
    s3.create_bucket(Bucket=names["bucket"])
    body = io.StringIO()
    writer = csv.DictWriter(body, fieldnames=list(data["products"][0]))
    writer.writeheader()
    writer.writerows(data["products"])
    s3.put_object(Bucket=names["bucket"], Key="reference/products/products.csv", Body=body.getvalue().encode())
    es = elasticsearch_client(es_conn)
    for store in data["stores"]:
        es.index(index=names["stores_index"], id=store["store_id"], document=store)
    es.indices.refresh(index=names["stores_index"])
    yield folder, names, data, pipeline, env
    cleanup(pipeline, f"_threes_offsets.{u}")
    try:
        with engine.begin() as db:
            db.execute(text(f'DROP SCHEMA IF EXISTS "{names["schema"]}" CASCADE'))
        for index in (names["stores_index"], names["orders_index"]):
            es.options(ignore_status=404).indices.delete(index=index)
        for obj in s3.list_objects_v2(Bucket=names["bucket"]).get("Contents", []):
            s3.delete_object(Bucket=names["bucket"], Key=obj["Key"])
        s3.delete_bucket(Bucket=names["bucket"])
    except Exception as exc:  # cleanup never hides the test's result
        print(f"cleanup failed: {exc}")
    engine.dispose()
    es.close()


@pytest.fixture(scope="module")
def run(shop: Any, pg: Any, es_conn: Any, s3_conn: Any) -> dict[str, Any]:
    """``threes run`` from the folder, the orders replayed once it is ready, until every sink is complete."""
    folder, names, data, pipeline, env = shop
    process = subprocess.Popen(  # our own console script
        [THREES, "run", "pipeline.yaml", "--log-dir", "logs", "--offsets-topic", f"_threes_offsets.{names['u']}"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    output = Output(process, folder / "logs")
    try:
        wait_for("ready pipeline", lambda: any(line.startswith("[run] running:") for line in output.lines), 240,
                 process, output)
        replay = subprocess.run(
            [THREES, "replay", "orders.csv", "--topic", f"orders.{names['u']}", "--schema", "schemas/order.avsc",
             "--key", "order_id", "--config", "pipeline.yaml"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=120,
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        enriched, per_category = oracle(data)
        sinks = Sinks(names, pg, es_conn, s3_conn)
        wait_for("complete Elasticsearch index", lambda: sinks.es_count() == N_ORDERS, 240, process, output)
        wait_for("complete sales table", lambda: sinks.sales() == per_category, 240, process, output)
        wait_for("complete archive", lambda: len(sinks.archive()) == N_ORDERS, 240, process, output)
        result = {"es": sinks.es_docs(), "sales": sinks.sales(), "archive": sinks.archive(),
                  "enriched": enriched, "per_category": per_category}
    except BaseException:
        process.send_signal(signal.SIGINT)
        process.wait(180)
        raise
    ready_lines = len(output.lines)
    logs = sorted((folder / "logs").glob("*.log"))
    sizes = {p.name: p.stat().st_size for p in logs}
    process.send_signal(signal.SIGINT)  # Ctrl-C
    result["returncode"] = process.wait(240)
    time.sleep(0.5)  # the reader thread takes the last lines
    result["output"] = output.lines
    result["stop_lines"] = output.lines[ready_lines:]
    result["logs"] = {p.name: p.read_text(errors="replace") for p in logs}
    # what each part logged while it stopped (a transient failure earlier may log a library's traceback)
    result["stop_logs"] = {p.name: p.read_bytes()[sizes[p.name]:].decode(errors="replace") for p in logs}
    return result


class Sinks:
    """Reads what each sink holds (clients of the test, independent of the pipeline's code)."""

    def __init__(self, names: dict[str, str], pg: Any, es_conn: Any, s3_conn: Any):
        self.names = names
        self.engine = sql_engine(pg)
        self.es = elasticsearch_client(es_conn)
        self.s3 = s3_client(s3_conn)

    def es_count(self) -> int:
        from elasticsearch import NotFoundError

        try:
            self.es.indices.refresh(index=self.names["orders_index"])
            return int(self.es.count(index=self.names["orders_index"])["count"])
        except NotFoundError:
            return 0

    def es_docs(self) -> dict[str, dict[str, Any]]:
        hits = self.es.search(index=self.names["orders_index"], size=10_000, query={"match_all": {}})["hits"]["hits"]
        return {h["_id"]: h["_source"] for h in hits}

    def sales(self) -> dict[str, dict[str, int]]:
        from sqlalchemy import text

        try:
            with self.engine.connect() as db:
                rows = db.execute(text(f'SELECT product_category, orders, units, max_quantity FROM '
                                       f'"{self.names["schema"]}".sales_by_category')).all()
        except Exception:  # not created yet
            return {}
        return {r[0]: {"orders": int(r[1]), "units": int(r[2]), "max_quantity": int(r[3])} for r in rows}

    def archive(self) -> dict[str, dict[str, Any]]:
        """The latest archived row per key (highest version), as ``key`` -> the value's fields."""
        import pyarrow.parquet as pq

        listing = self.s3.list_objects_v2(Bucket=self.names["bucket"], Prefix="archive/").get("Contents", [])
        latest: dict[str, tuple[int, dict[str, Any]]] = {}
        for obj in listing:
            if not obj["Key"].endswith(".parquet"):
                continue
            body = self.s3.get_object(Bucket=self.names["bucket"], Key=obj["Key"])["Body"].read()
            for row in pq.read_table(io.BytesIO(body)).to_pylist():
                if row["key"] not in latest or row["version"] > latest[row["key"]][0]:
                    latest[row["key"]] = (row["version"], row)
        return {k: v[1] for k, v in latest.items()}


FIELDS = ["order_id", "customer_id", "product_id", "store_id", "quantity", "customer_name", "customer_country",
          "product_name", "product_category", "product_unit_price", "store_city"]


def test_elasticsearch_holds_every_enriched_order_under_its_key(run: dict[str, Any]) -> None:
    enriched, docs = run["enriched"], run["es"]
    # the index's _id is the update key's fields joined by "|": one field here, the order id
    assert set(docs) == {str(i) for i in enriched}
    for order_id, want in enriched.items():
        doc = docs[str(order_id)]
        assert {f: doc.get(f) for f in FIELDS} == want, order_id
    # left joins: unknown customers and stores keep the order, with null fields
    assert any(d["customer_name"] is None for d in docs.values())
    assert any(d["store_city"] is None for d in docs.values())
    order_time = datetime(2024, 5, 1, 8, tzinfo=UTC) + timedelta(minutes=7)
    assert datetime.fromisoformat(docs["1"]["order_time"].replace("Z", "+00:00")) == order_time


def test_postgresql_holds_the_aggregates_per_category(run: dict[str, Any]) -> None:
    assert run["sales"] == run["per_category"]
    assert sum(r["orders"] for r in run["sales"].values()) == N_ORDERS


def test_the_archive_holds_every_order_keyed_by_its_key_json(run: dict[str, Any]) -> None:
    archive, enriched = run["archive"], run["enriched"]
    # the archive's key column: the update key as sorted compact JSON
    assert set(archive) == {json.dumps({"order_id": i}, separators=(",", ":")) for i in enriched}
    for key, row in archive.items():
        want = enriched[json.loads(key)["order_id"]]
        assert not row["deleted"]
        assert {f: row["value"][f] for f in FIELDS} == want, key


def test_ctrl_c_stops_sync_then_stream_then_sources_cleanly(run: dict[str, Any]) -> None:
    assert run["returncode"] == 0, "\n".join(run["output"][-40:])
    stopping = "\n".join(run["stop_lines"]) + "".join(run["stop_logs"].values())
    assert "Traceback" not in stopping, stopping[-5000:]
    assert "Traceback" not in "\n".join(run["output"])  # threes run itself never printed one
    assert "AttributeError" not in stopping

    def status(line: str, part: str) -> str | None:
        found = re.search(rf"\b{part} (\w+)", line.split(" | ")[0])
        return found.group(1) if found else None

    lines = [line for line in run["stop_lines"] if re.match(r"\[run\] (running|recovering|stopping|stopped): ", line)]
    stream_stopping = next(line for line in lines if status(line, "stream") == "stopping")
    sources_stopping = next(line for line in lines if status(line, "sources") == "stopping")
    assert status(stream_stopping, "sync") == "stopped", stream_stopping
    assert status(sources_stopping, "stream") == "stopped", sources_stopping
    assert all(status(lines[-1], p) == "stopped" for p in ("sources", "stream", "sync")), lines[-1]


def test_the_sources_said_what_their_snapshot_did(run: dict[str, Any]) -> None:
    log = run["logs"]["sources.log"]
    assert re.search(r"source=customers task=0 topic=\S+ snapshot done: rows_read=12 records=12", log), log[-3000:]
    assert re.search(r"source=products task=0 topic=\S+ snapshot done: rows_read=8 records=8", log)
    assert re.search(r"source=stores task=0 topic=\S+ snapshot done: rows_read=3 records=3", log)
