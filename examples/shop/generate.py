"""The shop's data: reference tables into PostgreSQL, Elasticsearch and S3, order lines into Kafka.

A small synthetic shop, the same for a given seed: 6 nations (a CSV object in S3), 18
customers (Elasticsearch documents, ``_id`` = the customer id), 80 orders (a PostgreSQL table)
and about 260 order-line events over one day. Among the events: lines of orders nobody knows
(the chain of lookups stops at the order), orders of unknown customers, a customer whose nation
is not in the file, cancellations (a second event for the line, ``status`` ``cancelled``, some
minutes later), test lines (``status`` ``test``), and one last line a day later whose event
time moves the watermark past every session of the day, so they are written.

Usage, from the repository (or with the installed example, ``threes/examples/shop``)::

    python examples/shop/generate.py reference            # once, before `threes run`
    threes run examples/shop/pipeline.yaml
    python examples/shop/generate.py events               # once the pipeline runs

``--config`` names another copy of the pipeline YAML (its sources say where the reference data
goes, its ``stream.events`` where the events go); ``--seed`` another shop. Loading the reference
data again writes the same values (unchanged table rows keep their ``updated_at``; documents and
the CSV object are written again, with the same content); producing the events again produces
them again (the sinks keep one row per key, the versions of a second run are newer).

The events are produced with the project's replayer (:class:`threes.demo.replay.Replayer`, what
``threes replay`` runs): keyed by ``line_id`` in single-object Avro, writer schemas registered in
the schema topic, every record acknowledged (``acks=all``, idempotent producer).
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PIPELINE = HERE / "pipeline.yaml"
SEED = 38
START = datetime(2024, 6, 3, 8, tzinfo=UTC)
"""The first order's time; the day's orders span the next 10 hours."""
CLOSING_AFTER = timedelta(days=1)
"""The last line comes this long after the day's last event: past every session's gap and the watermark."""
NATIONS_OBJECT = "nations.csv"

log = logging.getLogger(__name__)

NATIONS = [
    {"code": "DE", "name": "Germany", "region": "EUROPE"},
    {"code": "FR", "name": "France", "region": "EUROPE"},
    {"code": "JP", "name": "Japan", "region": "ASIA"},
    {"code": "IN", "name": "India", "region": "ASIA"},
    {"code": "US", "name": "United States", "region": "AMERICA"},
    {"code": "BR", "name": "Brazil", "region": "AMERICA"},
]
SKUS = [f"SKU-{i:03d}" for i in range(1, 13)]
DISCOUNTS = [Decimal("0.00"), Decimal("0.00"), Decimal("0.05"), Decimal("0.10"), Decimal("0.15"), Decimal("0.30")]


@dataclass(frozen=True)
class Shop:
    """The generated shop.

    Attributes:
        nations: ``code`` (upper case), ``name``, ``region``.
        customers: ``customer_id`` (``C001``...), ``name``, ``nation`` (lower case), ``segment``.
        orders: ``order_id``, ``customer_id``, ``channel``, ``order_time`` (aware UTC ``datetime``).
        events: the order lines to produce, in order: ``line_id``, ``order_id``, ``sku``,
            ``unit_price`` and ``discount`` (``Decimal``, 2 places), ``quantity``, ``status``
            (``open``, ``cancelled``, ``test``), ``line_time`` (aware UTC ``datetime``, unique).
        closing: the last event, produced after ``events`` were acknowledged.
    """

    nations: list[dict[str, Any]]
    customers: list[dict[str, Any]]
    orders: list[dict[str, Any]]
    events: list[dict[str, Any]]
    closing: dict[str, Any]

    @property
    def all_events(self) -> list[dict[str, Any]]:
        """``events`` then ``closing``: every record produced, in produce order."""
        return [*self.events, self.closing]


def generate(seed: int = SEED, n_orders: int = 80) -> Shop:
    """Generate the shop (deterministic: the same seed gives the same rows).

    Args:
        seed: the random generator's seed.
        n_orders: orders over the day (each has 1 to 5 lines).

    Returns:
        The reference rows and the events.
    """
    rnd = random.Random(seed)
    codes = [n["code"].lower() for n in NATIONS]
    customers = [
        {"customer_id": f"C{i:03d}", "name": f"customer {i:02d}", "nation": rnd.choice(codes),
         "segment": rnd.choice(["retail", "business"])}
        for i in range(1, 17)
    ]
    customers.append({"customer_id": "C017", "name": "customer 17", "nation": "zz", "segment": "retail"})  # no nation
    customers.append({"customer_id": "C018", "name": "customer 18", "nation": "de", "segment": "business"})
    minutes = sorted(rnd.sample(range(10 * 60), n_orders))
    orders = [
        {"order_id": i, "customer_id": rnd.choice([c["customer_id"] for c in customers] + ["C019", "C020"]),
         "channel": rnd.choice(["web", "app", "store"]), "order_time": START + timedelta(minutes=m)}
        for i, m in enumerate(minutes, start=1)
    ]  # C019 and C020 are nobody: the chain stops after the order
    used: set[datetime] = set()

    def unique(at: datetime) -> datetime:
        while at in used:  # first/last by event time need distinct times
            at += timedelta(seconds=1)
        used.add(at)
        return at

    events: list[dict[str, Any]] = []
    line_id = 0

    def line(order_id: int, at: datetime, status: str = "open") -> dict[str, Any]:
        nonlocal line_id
        line_id += 1
        return {"line_id": line_id, "order_id": order_id, "sku": rnd.choice(SKUS),
                "unit_price": Decimal(rnd.randint(100, 12_000)) / 100, "quantity": rnd.randint(1, 6),
                "discount": rnd.choice(DISCOUNTS), "status": status, "line_time": unique(at)}

    for order in orders:
        at = order["order_time"]
        for _ in range(rnd.randint(1, 5)):
            at += timedelta(seconds=rnd.randint(20, 240))
            placed = line(order["order_id"], at)
            events.append(placed)
            if rnd.random() < 0.1:  # cancelled some minutes later: the same line, status cancelled
                later = placed["line_time"] + timedelta(minutes=rnd.randint(3, 30))
                events.append({**placed, "status": "cancelled", "line_time": unique(later)})
    for order_id in range(901, 907):  # orders nobody knows: the lookups leave their columns null
        events.append(line(order_id, START + timedelta(minutes=rnd.randint(0, 10 * 60))))
    for _ in range(12):  # test lines: the stream's where drops them before anything else
        events.append(line(rnd.choice(orders)["order_id"], START + timedelta(minutes=rnd.randint(0, 10 * 60)),
                           status="test"))
    events.sort(key=lambda e: e["line_time"])
    known = next(o for o in orders if o["customer_id"] in {c["customer_id"] for c in customers[:16]})
    closing = line(known["order_id"], events[-1]["line_time"] + CLOSING_AFTER)
    return Shop(NATIONS, customers, orders, events, closing)


# -- the systems of record ------------------------------------------------------------------------------------


def _source(pipeline: Any, name: str, kind: str) -> Any:
    from kernel.exceptions import ConfigError

    for source in pipeline.sources:
        if source.name == name:
            if source.type != kind:
                raise ConfigError(f"source {name!r} is a {source.type}; the shop loads a {kind} there")
            return source
    raise ConfigError(f"the pipeline has no source named {name!r} (where the shop's {name} go)")


def load_orders(pipeline: Any, shop: Shop) -> None:
    """Make the orders table (source ``orders``) hold the shop's orders: insert new rows, update changed ones.

    A changed row gets ``updated_at = now()``, which is what the source's ``timestamp`` mode reads;
    an identical row is left alone, so loading twice changes nothing.

    Raises:
        SetupError: the database refused a statement.
    """
    from sqlalchemy import BigInteger, Column, DateTime, MetaData, Table, Text, func, select, update
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.schema import CreateSchema

    from connectors.rds.connection import sql_engine
    from kernel.exceptions import SetupError

    source = _source(pipeline, "orders", "rds_source")
    table = Table(source.table, MetaData(),
                  Column("order_id", BigInteger, primary_key=True, autoincrement=False),
                  Column("customer_id", Text, nullable=False), Column("channel", Text, nullable=False),
                  Column("order_time", DateTime(timezone=True), nullable=False),
                  Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
                  schema=source.schema_name)
    engine = sql_engine(pipeline.connections[source.connection])
    try:
        with engine.begin() as db:
            if source.schema_name:
                db.execute(CreateSchema(source.schema_name, if_not_exists=True))
        table.create(engine, checkfirst=True)
        with engine.begin() as db:
            columns = ("customer_id", "channel", "order_time")
            have = {r.order_id: tuple(getattr(r, c) for c in columns) for r in db.execute(select(table))}
            new = [o for o in shop.orders if o["order_id"] not in have]
            changed = [o for o in shop.orders if o["order_id"] in have
                       and have[o["order_id"]] != tuple(o[c] for c in columns)]
            if new:
                db.execute(table.insert(), new)
            for o in changed:
                db.execute(update(table).where(table.c.order_id == o["order_id"])
                           .values(**{c: o[c] for c in columns}, updated_at=func.now()))
    except SQLAlchemyError as exc:
        raise SetupError(f"loading the shop's orders into table {source.table}: {exc}") from exc
    finally:
        engine.dispose()
    log.info("orders: table=%s inserted=%d updated=%d", source.table, len(new), len(changed))


def load_customers(pipeline: Any, shop: Shop, base_dir: Path) -> None:
    """Index the customers (source ``customers``), ``_id`` = ``customer_id``, mapped from the source's value schema.

    Raises:
        SetupError: the cluster refused the index or a document.
    """
    from elasticsearch import ApiError, TransportError, helpers

    from connectors.elasticsearch.connection import elasticsearch_client
    from kernel.exceptions import SetupError
    from schemas import load_schema
    from threes.demo.reference_stores import es_mappings

    source = _source(pipeline, "customers", "elasticsearch_source")
    es = elasticsearch_client(pipeline.connections[source.connection])
    try:
        if not es.indices.exists(index=source.index):
            mappings = es_mappings(load_schema(source.value_schema, base_dir))
            es.indices.create(index=source.index, mappings={"dynamic": "strict", **mappings},
                              settings={"number_of_replicas": 0})
        actions = [{"_op_type": "index", "_index": source.index, "_id": c["customer_id"], "_source": c}
                   for c in shop.customers]
        _, errors = helpers.bulk(es, actions, raise_on_error=False, refresh="wait_for")
        if errors:
            raise SetupError(f"indexing the shop's customers into {source.index}: {len(errors)} refused, "
                             f"e.g. {errors[0]}")
    except (ApiError, TransportError) as exc:
        raise SetupError(f"indexing the shop's customers into {source.index}: {exc}") from exc
    finally:
        es.close()
    log.info("customers: index=%s documents=%d", source.index, len(shop.customers))


def load_nations(pipeline: Any, shop: Shop) -> None:
    """Write the nations as one CSV object under the ``nations`` source's prefix (bucket created when missing).

    Raises:
        SetupError: the endpoint refused a request.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from connectors.s3.connection import s3_client
    from kernel.exceptions import SetupError

    source = _source(pipeline, "nations", "s3_source")
    body = io.StringIO()
    writer = csv.DictWriter(body, fieldnames=["code", "name", "region"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(shop.nations)
    key = f"{source.prefix}{NATIONS_OBJECT}"
    s3 = s3_client(pipeline.connections[source.connection])
    try:
        try:
            s3.head_bucket(Bucket=source.bucket)
        except ClientError:
            s3.create_bucket(Bucket=source.bucket)
        s3.put_object(Bucket=source.bucket, Key=key, Body=body.getvalue().encode(), ContentType="text/csv")
    except (BotoCoreError, ClientError) as exc:
        raise SetupError(f"writing s3://{source.bucket}/{key}: {exc}") from exc
    log.info("nations: object=s3://%s/%s rows=%d", source.bucket, key, len(shop.nations))


def load_reference(pipeline: Any, shop: Shop, base_dir: Path) -> None:
    """Load the orders, customers and nations where the pipeline's sources read them (idempotent).

    Raises:
        ConfigError: a source is missing or of another type.
        SetupError: a system refused the load.
    """
    load_nations(pipeline, shop)
    load_customers(pipeline, shop, base_dir)
    load_orders(pipeline, shop)


# -- the events ------------------------------------------------------------------------------------------------


def produce_events(pipeline: Any, shop: Shop, base_dir: Path, *, closing: bool = True) -> int:
    """Produce the order lines into the stream's events topic, keyed by ``line_id``; then the closing line.

    The closing line goes in a second run of the replayer, after every earlier record was
    acknowledged: it carries the latest event time, and the job must not see it before the lines
    it closes (they would be later than the watermark).

    Args:
        pipeline: the validated pipeline (``kafka``, ``stream.events``).
        shop: the generated shop.
        base_dir: the pipeline file's folder (where its relative schema paths start).
        closing: produce the closing line too.

    Returns:
        Records acknowledged.

    Raises:
        SetupError: Kafka cannot be reached.
        RetriableError: records were not acknowledged.
    """
    from schemas import load_schema
    from threes.demo.replay import Replayer, RowSource

    events = pipeline.stream.events
    replayer = Replayer(pipeline.kafka, events.topic, load_schema(events.value_schema, base_dir), ["line_id"],
                        partitions=events.topic_spec.partitions)
    acked = replayer.run(RowSource(iter(shop.events), len(shop.events), "shop order lines")).acked
    if closing:
        acked += replayer.run(RowSource(iter([shop.closing]), 1, "shop closing line")).acked
    return acked


def main(argv: list[str] | None = None) -> int:
    """``generate.py reference|events [--config PIPELINE] [--seed N]``; returns the exit code."""
    from kernel.exceptions import ThreesError
    from threes.config import load_pipeline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["reference", "events"], help="load the reference data, or produce events")
    parser.add_argument("--config", type=Path, default=PIPELINE, help="the pipeline YAML (default: the example's)")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shop = generate(args.seed)
    try:
        pipeline = load_pipeline(args.config)
        if args.what == "reference":
            load_reference(pipeline, shop, args.config.resolve().parent)
            print(f"loaded {len(shop.orders)} orders, {len(shop.customers)} customers, {len(shop.nations)} nations")
        else:
            acked = produce_events(pipeline, shop, args.config.resolve().parent)
            print(f"produced {acked} order-line events into {pipeline.stream.events.topic}")
    except ThreesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
