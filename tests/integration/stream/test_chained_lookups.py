"""Chained lookups in Spark: line -> order -> customer -> (derive) -> nation, on every join engine.

A lookup's ``on`` names an earlier lookup's prefixed column (``order_customer_id``) or a derive
column computed from one (``nation_code = upper(customer_nation)``). A missing middle key
(an order whose customer does not exist) gives nulls below it with ``how: left`` and drops
the event with ``how: inner``; the result must not depend on the engine that joins.
"""

from __future__ import annotations

from typing import Any

import pytest

from .language_helpers import produce, state_topic, totals, write_schema

pytestmark = pytest.mark.spark

NS = "threes.test.chain"


def record(name: str, *fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": NS, "fields": [{"name": n, "type": t} for n, t in fields]}


LINE = record("Line", ("line_id", "long"), ("order_id", "long"), ("sku", "string"), ("qty", "int"))
ORDER_KEY = record("OrderKey", ("order_id", "long"))
ORDER = record("Order", ("order_id", "long"), ("customer_id", "long"), ("channel", "string"))
CUSTOMER_KEY = record("CustomerKey", ("customer_id", "long"))
CUSTOMER = record("Customer", ("customer_id", "long"), ("name", "string"), ("nation", "string"))
NATION_KEY = record("NationKey", ("code", "string"))
NATION = record("Nation", ("code", "string"), ("region", "string"))

ORDERS = {1: (10, "web"), 2: (20, "shop"), 3: (99, "web"), 4: (30, "phone")}  # order 3: customer 99 is missing
CUSTOMERS = {10: ("Ada", "fr"), 20: ("Bo", "de"), 30: ("Cy", "xx")}  # nation XX is missing
NATIONS = {"FR": "Europe", "DE": "Europe", "JP": "Asia"}
LINES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 1, 7: 3, 8: 2}  # line -> order; order 5 is missing

ENGINES = {
    "broadcast": {},
    "partitioned-lookup": {"broadcast_max_rows": 0, "partitioned_join": "lookup"},
    "partitioned-sort_merge": {"broadcast_max_rows": 0, "partitioned_join": "sort_merge"},
    "indexed": {"index_min_rows": 0},  # the opt-in engine: a hash index in the Python workers
}
# one engine per hop: a partitioned (lookup files), a broadcast and an indexed snapshot in one chain
MIXED = {"orders": ENGINES["partitioned-lookup"], "customers": ENGINES["broadcast"], "nations": ENGINES["indexed"]}
ENGINES_AND_MIXED = [*ENGINES, "mixed"]


def settings(engine: str, snapshot: str) -> dict[str, Any]:
    """The snapshot config of ``snapshot`` on ``engine``."""
    return MIXED[snapshot] if engine == "mixed" else ENGINES[engine]


def modes(engine: str) -> dict[str, str]:
    """The mode each snapshot has on ``engine``."""
    names = ("orders", "customers", "nations")
    if engine == "mixed":
        return {"orders": "partitioned", "customers": "broadcast", "nations": "indexed"}
    return dict.fromkeys(names, engine.split("-")[0])


def expected(how: str) -> dict[int, dict[str, Any]]:
    """The enriched lines, computed in Python: left joins give nulls, the inner customer lookup drops.

    Fields: the event's, then each lookup's in YAML order (nation_, customer_, order_), then the derive column.
    """
    out = {}
    for line_id, order_id in LINES.items():
        event = {"line_id": line_id, "order_id": order_id, "sku": f"sku{line_id}", "qty": line_id}
        order = ORDERS.get(order_id)
        customer_id = order[0] if order else None
        customer = CUSTOMERS.get(customer_id) if customer_id is not None else None
        if customer is None and how == "inner":
            continue
        if line_id == 8:  # the where: Bo's line 8 (the where reads a looked-up column: it runs mid-chain)
            continue
        nation_key = customer[1].upper() if customer else None
        region = NATIONS.get(nation_key) if nation_key is not None else None
        out[line_id] = {
            **event,
            "nation_code": nation_key if region is not None else None,
            "nation_region": region,
            "customer_customer_id": customer_id if customer else None,
            "customer_name": customer[0] if customer else None,
            "customer_nation": customer[1] if customer else None,
            "order_order_id": order_id if order else None,
            "order_customer_id": customer_id,
            "order_channel": order[1] if order else None,
            "nation_key": nation_key,
        }
    return out


@pytest.mark.parametrize("how", ["left", "inner"])
@pytest.mark.parametrize("engine", ENGINES_AND_MIXED)
def test_three_hop_chain_with_a_missing_middle_key(spark, env, engine, how):
    schemas = {"line": LINE, "order_key": ORDER_KEY, "order": ORDER, "customer_key": CUSTOMER_KEY,
               "customer": CUSTOMER, "nation_key": NATION_KEY, "nation": NATION}
    for name, schema in schemas.items():
        write_schema(env, f"{name}.avsc", schema)
    topics = {name: state_topic(env, name) for name in ("orders", "customers", "nations")}
    produce(env, topics["orders"], [({"order_id": o}, {"order_id": o, "customer_id": c, "channel": ch})
                                    for o, (c, ch) in ORDERS.items()], ORDER, ORDER_KEY)
    produce(env, topics["customers"], [({"customer_id": c}, {"customer_id": c, "name": n, "nation": nat})
                                       for c, (n, nat) in CUSTOMERS.items()], CUSTOMER, CUSTOMER_KEY)
    produce(env, topics["nations"], [({"code": c}, {"code": c, "region": r}) for c, r in NATIONS.items()],
            NATION, NATION_KEY)
    produce(env, env.events, [(str(line).encode(), {"line_id": line, "order_id": order, "sku": f"sku{line}",
                                                    "qty": line}) for line, order in LINES.items()], LINE)
    snapshots = [
        {"name": name, "topics": [topics[name]], "key_schema": f"{kind}_key.avsc", "value_schema": f"{kind}.avsc",
         **settings(engine, name)}
        for name, kind in (("orders", "order"), ("customers", "customer"), ("nations", "nation"))
    ]
    lookups = [
        # in reverse order of the chain: the job orders them by the columns they read (a DAG)
        {"snapshot": "nations", "on": {"nation_key": "code"}, "prefix": "nation_"},
        {"snapshot": "customers", "on": {"order_customer_id": "customer_id"}, "prefix": "customer_", "how": how},
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "prefix": "order_"},
    ]
    config = env.config(
        events={"topic": env.events, "value_schema": "line.avsc", "starting_offsets": "earliest"},
        snapshots=snapshots,
        lookups=lookups,
        derive={"nation_key": "upper(customer_nation)"},
        where="coalesce(customer_name, '') <> 'Bo' OR line_id <> 8",
    )
    job = env.start(spark, config, available_now=True)
    assert {n: s.mode for n, s in job.snapshots.items()} == modes(engine)
    if engine == "partitioned-lookup":
        assert all(s.view().lookup_files is not None for s in job.snapshots.values())
    if engine == "mixed":
        assert job.snapshots["orders"].view().lookup_files is not None
    assert job.await_termination(180)

    want = expected(how)
    got = env.consume(env.enriched, lambda rs: len(rs) >= len(want))
    assert [fld["name"] for fld in job.plan.enriched.avro["fields"]] == list(next(iter(want.values())))
    by_line = {r["value"]["line_id"]: r["value"] for r in got}
    assert sorted(r["value"]["line_id"] for r in got) == sorted(want), f"{engine}/{how}: one record per kept line"
    for line_id, row in want.items():
        assert by_line[line_id] == row, f"{engine}/{how}: line {line_id}"
    if how == "left":  # the missing customer: nulls below it, the order above it kept
        assert by_line[3]["order_channel"] == "web" and by_line[3]["customer_name"] is None
        assert by_line[3]["nation_region"] is None
    else:
        assert set(by_line) == {1, 2, 4, 6}
    assert totals(job, len(LINES))["filtered"] == 1


def _setup(env: Any, engine: str) -> Any:
    """Schemas, snapshot topics with ORDERS/CUSTOMERS/NATIONS, and the left chain's config on ``engine``."""
    schemas = {"line": LINE, "order_key": ORDER_KEY, "order": ORDER, "customer_key": CUSTOMER_KEY,
               "customer": CUSTOMER, "nation_key": NATION_KEY, "nation": NATION}
    for name, schema in schemas.items():
        write_schema(env, f"{name}.avsc", schema)
    topics = {name: state_topic(env, name) for name in ("orders", "customers", "nations")}
    produce(env, topics["orders"], [({"order_id": o}, {"order_id": o, "customer_id": c, "channel": ch})
                                    for o, (c, ch) in ORDERS.items()], ORDER, ORDER_KEY)
    produce(env, topics["customers"], [({"customer_id": c}, {"customer_id": c, "name": n, "nation": nat})
                                       for c, (n, nat) in CUSTOMERS.items()], CUSTOMER, CUSTOMER_KEY)
    produce(env, topics["nations"], [({"code": c}, {"code": c, "region": r}) for c, r in NATIONS.items()],
            NATION, NATION_KEY)
    snapshots = [
        {"name": name, "topics": [topics[name]], "key_schema": f"{kind}_key.avsc", "value_schema": f"{kind}.avsc",
         **settings(engine, name)}
        for name, kind in (("orders", "order"), ("customers", "customer"), ("nations", "nation"))
    ]
    lookups = [
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "prefix": "order_"},
        {"snapshot": "customers", "on": {"order_customer_id": "customer_id"}, "prefix": "customer_"},
        {"snapshot": "nations", "on": {"nation_key": "code"}, "prefix": "nation_"},
    ]
    config = env.config(
        events={"topic": env.events, "value_schema": "line.avsc", "starting_offsets": "earliest"},
        snapshots=snapshots, lookups=lookups, derive={"nation_key": "upper(customer_nation)"},
    )
    return topics, config


def line(line_id: int, order_id: int) -> tuple[bytes, dict[str, Any]]:
    return str(line_id).encode(), {"line_id": line_id, "order_id": order_id, "sku": f"sku{line_id}", "qty": 1}


@pytest.mark.parametrize("engine", ENGINES_AND_MIXED)
def test_a_change_of_the_middle_snapshot_reaches_the_rest_of_the_chain(spark, env, engine):
    topics, config = _setup(env, engine)
    job = env.start(spark, config)
    assert {n: s.mode for n, s in job.snapshots.items()} == modes(engine)
    produce(env, env.events, [line(1, 3), line(2, 1)], LINE)
    env.consume(env.enriched, lambda rs: len(rs) >= 2, timeout_s=120)
    # the missing customer arrives, an existing one is deleted: later events see both (the snapshots' overlays)
    produce(env, topics["customers"], [({"customer_id": 99}, {"customer_id": 99, "name": "Di", "nation": "jp"}),
                                       ({"customer_id": 10}, None)], CUSTOMER, CUSTOMER_KEY)
    produce(env, topics["nations"], [({"code": "JP"}, {"code": "JP", "region": "Asia and Pacific"})],
            NATION, NATION_KEY)
    # no wait: the micro-batch of the next events catches every snapshot up to its end offsets before it joins
    produce(env, env.events, [line(3, 3), line(4, 1)], LINE)
    got = {r["value"]["line_id"]: r["value"] for r in env.consume(env.enriched, lambda rs: len(rs) >= 4,
                                                                   timeout_s=120)}
    summary = {i: (v["order_customer_id"], v["customer_name"], v["nation_key"], v["nation_region"])
               for i, v in got.items()}
    assert summary == {
        1: (99, None, None, None),  # customer 99 missing at first
        2: (10, "Ada", "FR", "Europe"),
        3: (99, "Di", "JP", "Asia and Pacific"),  # inserted, and its nation changed: both seen
        4: (10, None, None, None),  # deleted: nulls down the chain
    }
