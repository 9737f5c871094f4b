"""The stream's language in Spark, against real Kafka: ``where`` (counted) and ``derive`` over every Avro type.

The unit tests (tests/unit/stream_app/test_stream_language.py) parse, type and order the
expressions without a JVM; here they run as Catalyst columns in micro-batches, and the
enriched records are compared with a Python oracle.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY

from schemas.serde import AvroDeserializer

from .conftest import flight
from .language_helpers import produce, totals, write_schema

pytestmark = pytest.mark.spark

# where before the lookups (it reads an event field) and after them (it reads a looked-up one; an unknown
# destination gives a null name, and null counts as false)
WHERES = {
    "event field": ("flight_id % 3 <> 0", lambda i: "LAX"),
    "looked-up field": ("dest_name <> 'Chicago Ohare Intl'", lambda i: ("ORD", "SFO")[i % 2] if i % 3 == 0 else "LAX"),
}


@pytest.mark.parametrize(("case", "projection"), [(c, True) for c in WHERES] + [("event field", False)])
def test_where_drops_and_counts_a_third_and_never_hides_dead_letters(spark, env, case, projection):
    where, dest = WHERES[case]
    for faa in ("EWR", "LAX", "ORD"):
        env.put_airport(faa)
    flights = [flight(i, "EWR", dest(i)) for i in range(1, 31)]
    env.put_flights(flights[:15])
    env.put_raw_event(b"bad-1", b"plain text")  # not Avro: the decode fails, every field is null
    env.put_raw_event(b"bad-2", None)
    env.put_flights(flights[15:])
    # without update records every event gives one record (enriched or dead letter) unless the where drops it
    updates = [{"topic": env.updates, "kind": "projection", "key": ["flight_id"], "version": "offset"}] * projection
    job = env.start(spark, env.config(where=where, updates=updates), available_now=True)
    assert job.await_termination(180)

    kept = {i for i in range(1, 31) if i % 3 != 0}
    got = env.consume(env.enriched, lambda rs: len(rs) >= len(kept))
    assert sorted(r["value"]["flight_id"] for r in got) == sorted(kept)  # exactly the kept ones, once each
    if projection:
        ups = env.consume(env.updates, lambda rs: len(rs) >= len(kept))
        assert len(ups) == len(kept)
    letters = env.consume(env.dlq, lambda rs: len(rs) >= 2, deserialize=False)
    assert sorted(r["key"] for r in letters) == [b"bad-1", b"bad-2"]  # the where did not drop them
    assert all(r["headers"]["dlq.stage"] == b"decode" for r in letters)
    counts = totals(job, 32)
    assert counts == {"events": 32, "filtered": 10, "enriched": 20, "dead_letters": 2, "updates": 20 * projection}
    labels = {"job": job.config.name, "kind": "events"}
    assert REGISTRY.get_sample_value("threes_stream_records_total", labels) == 32
    assert REGISTRY.get_sample_value("threes_stream_filtered_events_total", {"job": job.config.name}) == 10
    # the events are decoded once: a filter for the where was pushed below the decoding, copying from_avro
    # into its predicate (7 from_avro in the plan of a where on one event field, against 1 to decode)
    in_batch, to_decode = decodes(spark, env, job)
    assert in_batch == to_decode


def decodes(spark: Any, env: Any, job: Any) -> tuple[int, int]:
    """``from_avro`` calls in the optimized plan of the job's micro-batch, and in the plan that decodes it.

    The events topic is read as a batch. Decoding takes one ``from_avro`` per writer schema of the
    event's record name that the shared schema topic holds (earlier runs may have left other versions).
    """
    from stream_app.enrich import BoundLookup
    from stream_app.spark_kafka_options import source_options

    reader = spark.read.format("kafka")
    for key, value in source_options(job._options).items():
        reader = reader.option(key, value)
    batch = reader.option("subscribe", env.events).option("includeHeaders", "true").load()
    views = {name: snapshot.view() for name, snapshot in job.snapshots.items()}
    lookups = [BoundLookup(lookup, views[lookup.snapshot]) for lookup in job.config.lookups]
    frame = job._batch.frame(batch, job._writers())
    records = job._batch.records(frame, lookups, views)

    def count(df: Any) -> int:
        return df._jdf.queryExecution().optimizedPlan().toString().count("from_avro(")

    return count(records), count(frame)


DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
TYPED = {
    "type": "record",
    "name": "Typed",
    "namespace": "threes.test.language",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "b", "type": "boolean"},
        {"name": "s", "type": "string"},
        {"name": "by", "type": "bytes"},
        {"name": "price", "type": DECIMAL},
        {"name": "qty", "type": "int"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        # what the RDS source writes for a timestamp without time zone, a time and a uuid
        {"name": "local_ts", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "t", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "opt_l", "type": ["null", "long"], "default": None},
        {"name": "opt_s", "type": ["null", "string"], "default": None},
        {"name": "opt_price", "type": ["null", DECIMAL], "default": None},
    ],
}
DERIVE = {
    "i_next": "i + 1",
    "l_double": "l * 2",
    "f_half": "f / 2",
    "d_sq": "d * d",
    "not_b": "NOT b",
    "s_upper": "upper(s)",
    "by_hex": "hex(by)",
    "by_len": "length(by)",
    "amount": "price * qty",
    "taxed": "price * 1.25",
    "ts_day": "to_date(ts_ms)",
    "next_day": "date_add(day, 1)",
    "us_hour": "hour(ts_us)",
    "us_later": "ts_us + INTERVAL 90 MINUTES",
    "epoch_ms": "unix_millis(ts_ms)",
    "local_day": "to_date(local_ts)",
    "local_later": "local_ts + INTERVAL 1 DAY",
    "t_seconds": "hour(t) * 3600 + minute(t) * 60 + second(t)",  # an Avro time-micros is a Spark TIME
    "uid_upper": "upper(uid)",
    "opt_next": "opt_l + 1",
    "opt_label": "concat(s, '-', opt_s)",
    "opt_default": "coalesce(opt_s, 'none')",
    "opt_total": "opt_price + price",
    "chained": "amount + opt_total",
}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def typed_event(n: int) -> dict[str, Any]:
    return {
        "id": n,
        "i": n - 5,
        "l": n * 10**12,
        "f": n + 0.5,  # exact in binary: f / 2 is exact too
        "d": n / 4,
        "b": n % 2 == 0,
        "s": f"s{n}",
        "by": bytes([n, 0, 255]),
        "price": Decimal("19.99") + n,
        "qty": n % 4,
        "day": dt.date(2024, 2, 27) + dt.timedelta(days=n),  # over the leap day
        # 23:30 UTC: a date taken in any zone east of UTC would be the next day
        "ts_ms": dt.datetime(2024, 12, 31, 23, 30, n, n * 1000, tzinfo=dt.UTC),
        "ts_us": dt.datetime(2024, 1, 1, 22, 45, 0, n * 7 + 1, tzinfo=dt.UTC),
        "local_ts": dt.datetime(2024, 6, 30, 23, 59, 59, n),
        "t": dt.time(23, 30, n, n),
        "uid": uuid.UUID(int=n * 2**100 + n),
        "opt_l": None if n % 3 == 0 else n,
        "opt_s": None if n % 4 == 0 else f"o{n}",
        "opt_price": None if n % 5 == 0 else Decimal("0.01") * n,
    }


def oracle(e: dict[str, Any]) -> dict[str, Any]:
    """The derive columns as Spark SQL defines them, computed in Python (nulls propagate)."""
    amount = e["price"] * e["qty"]
    total = None if e["opt_price"] is None else e["opt_price"] + e["price"]
    ts_ms = e["ts_ms"]
    return {
        **e,
        "i_next": e["i"] + 1,
        "l_double": e["l"] * 2,
        "f_half": e["f"] / 2,
        "d_sq": e["d"] * e["d"],
        "not_b": not e["b"],
        "s_upper": e["s"].upper(),
        "by_hex": e["by"].hex().upper(),
        "by_len": len(e["by"]),
        "amount": amount,
        "taxed": e["price"] * Decimal("1.25"),
        "ts_day": ts_ms.date(),
        "next_day": e["day"] + dt.timedelta(days=1),
        "us_hour": e["ts_us"].hour,
        "us_later": e["ts_us"] + dt.timedelta(minutes=90),
        "epoch_ms": (ts_ms - EPOCH) // dt.timedelta(milliseconds=1),
        "local_day": e["local_ts"].date(),
        "local_later": e["local_ts"] + dt.timedelta(days=1),
        "t_seconds": e["t"].hour * 3600 + e["t"].minute * 60 + e["t"].second,
        "uid_upper": str(e["uid"]).upper(),
        "opt_next": None if e["opt_l"] is None else e["opt_l"] + 1,
        "opt_label": None if e["opt_s"] is None else f"{e['s']}-{e['opt_s']}",
        "opt_default": e["opt_s"] if e["opt_s"] is not None else "none",
        "opt_total": total,
        "chained": None if total is None else amount + total,
    }


def test_derived_columns_over_every_avro_type_equal_a_python_oracle(spark, env):
    write_schema(env, "typed.avsc", TYPED)
    events = [typed_event(n) for n in range(12)]
    produce(env, env.events, [(str(e["id"]).encode(), e) for e in events], TYPED)
    config = env.config(
        events={"topic": env.events, "value_schema": "typed.avsc", "starting_offsets": "earliest"},
        snapshots=[],
        lookups=[],
        derive=DERIVE,
    )
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(180)

    enriched = job.plan.enriched
    types = {fld["name"]: fld["type"] for fld in enriched.avro["fields"]}
    # the enriched schema: event fields, then the derive columns in YAML order, typed by Spark
    assert list(types) == [fld["name"] for fld in TYPED["fields"]] + list(DERIVE)
    assert types["amount"] == ["null", {"type": "bytes", "logicalType": "decimal", "precision": 21, "scale": 2}]
    assert types["taxed"] == ["null", {"type": "bytes", "logicalType": "decimal", "precision": 14, "scale": 4}]
    assert types["ts_day"] == ["null", {"type": "int", "logicalType": "date"}]
    assert types["us_later"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]
    assert types["f_half"] == ["null", "double"] and types["by_len"] == ["null", "int"]

    got = env.consume(env.enriched, lambda rs: len(rs) >= len(events), deserialize=False)
    assert len(got) == len(events)
    assert all(r["raw"][2:10] == enriched.fingerprint for r in got)  # written under the plan's enriched schema
    decode = AvroDeserializer(env.store, enriched.avro)
    by_id = {rec["id"]: rec for rec in (decode(r["raw"]) for r in got)}
    for e in events:
        want, have = oracle(e), by_id[e["id"]]
        assert have == want, {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
    # decimals exact (Decimal, not float), and the scale Spark computes
    assert by_id[7]["amount"] == Decimal("80.97") and by_id[7]["taxed"] == Decimal("33.7375")
    assert by_id[7]["chained"] == Decimal("80.97") + Decimal("0.07") + Decimal("26.99")
    # 23:30 UTC on New Year's Eve is still the 31st
    assert all(r["ts_day"] == dt.date(2024, 12, 31) for r in by_id.values())
    in_batch, to_decode = decodes(spark, env, job)
    assert in_batch == to_decode  # twenty derive columns over the decoded fields: decoded once


SALE = {
    "type": "record",
    "name": "Sale",
    "namespace": "threes.test.language",
    "fields": [
        {"name": "sale_id", "type": "long"},
        {"name": "at", "type": "string"},  # a text time stamp: derive makes it the event time
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2}},
    ],
}


def test_derive_columns_as_update_key_version_group_and_event_time(spark, env):
    write_schema(env, "sale.avsc", SALE)
    sales = [{"sale_id": n, "at": f"2024-05-01 {10 + n % 3}:{n:02d}:00", "amount": Decimal("2.50") * n}
             for n in range(1, 13)]
    produce(env, env.events, [(str(s["sale_id"]).encode(), s) for s in sales], SALE)
    updates = [
        {"topic": env.updates, "kind": "projection", "key": ["sale_key"], "version": "revision",
         "fields": ["sale_key", "amount"], "where": "amount >= 10"},
        {"topic": env.delays, "kind": "aggregation", "group_by": ["parity"], "event_time": "at_ts",
         "window": "1 hour", "watermark": "1 day", "aggregations": {"sales": "count", "total": "sum(amount)"},
         "where": "parity = 'odd' OR amount > 25"},
    ]
    derive = {"sale_key": "concat('s-', sale_id)", "revision": "sale_id * 1000", "at_ts": "date_trunc('MINUTE', to_timestamp(at))",
              "parity": "CASE WHEN sale_id % 2 = 0 THEN 'even' ELSE 'odd' END"}
    config = env.config(
        events={"topic": env.events, "value_schema": "sale.avsc", "starting_offsets": "earliest"},
        snapshots=[], lookups=[], derive=derive, updates=updates,
    )
    # threes validate (no JVM) accepts what the job runs: date_trunc has no type in sqlglot, Spark's is a timestamp
    from stream_app.plan import build_plan

    assert build_plan(config, None, env.tmp) is not None
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(240)
    types = {fld["name"]: fld["type"] for fld in job.plan.enriched.avro["fields"]}
    assert types["at_ts"] == ["null", {"type": "long", "logicalType": "timestamp-micros"}]  # Spark's type

    from kernel.updates import decode_version

    kept = [s for s in sales if s["amount"] >= 10]
    projected = env.consume(env.updates, lambda rs: len(rs) >= len(kept))
    got = {r["value"]["sale_key"]: (r["value"]["amount"], decode_version(r["headers"]["version"])) for r in projected}
    assert got == {f"s-{s['sale_id']}": (s["amount"], s["sale_id"] * 1000) for s in kept}

    want: dict[tuple[str, dt.datetime], tuple[int, Decimal]] = {}
    for s in sales:
        parity = "even" if s["sale_id"] % 2 == 0 else "odd"
        if parity == "odd" or s["amount"] > 25:
            hour = dt.datetime(2024, 5, 1, 10 + s["sale_id"] % 3, tzinfo=dt.UTC)
            n, total = want.get((parity, hour), (0, Decimal(0)))
            want[(parity, hour)] = (n + 1, total + s["amount"])
    aggregated = env.consume(env.delays, lambda rs: {(r["value"]["parity"], r["value"]["window_start"])
                                                     for r in rs} >= set(want))
    latest: dict[tuple[str, dt.datetime], tuple[int, Decimal]] = {}
    for r in aggregated:  # an update per change: the last one per window holds
        v = r["value"]
        latest[(v["parity"], v["window_start"])] = (v["sales"], v["total"])
    assert latest == want


def test_derived_arrays_structs_and_maps(spark, env):
    write_schema(env, "typed.avsc", TYPED)
    events = [typed_event(n) for n in range(1, 4)]
    produce(env, env.events, [(str(e["id"]).encode(), e) for e in events], TYPED)
    derive = {
        "parts": "split(concat(s, ',', coalesce(opt_s, 'x')), ',')",
        "pair": "named_struct('n', i, 'label', upper(s), 'when', ts_us)",
        "pairs": "array(named_struct('n', i), named_struct('n', i + 1))",
        "counts": "map(s, l, 'qty', CAST(qty AS BIGINT))",
        "first_part": "split(s, '1')[0]",
    }
    config = env.config(
        events={"topic": env.events, "value_schema": "typed.avsc", "starting_offsets": "earliest"},
        snapshots=[], lookups=[], derive=derive,
    )
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(180)
    got = env.consume(env.enriched, lambda rs: len(rs) >= len(events), deserialize=False)
    decode = AvroDeserializer(env.store, job.plan.enriched.avro)
    by_id = {rec["id"]: rec for rec in (decode(r["raw"]) for r in got)}
    for e in events:
        have = by_id[e["id"]]
        assert have["parts"] == [e["s"], e["opt_s"] or "x"]
        assert have["pair"] == {"n": e["i"], "label": e["s"].upper(), "when": e["ts_us"]}
        assert have["pairs"] == [{"n": e["i"]}, {"n": e["i"] + 1}]
        assert have["counts"] == {e["s"]: e["l"], "qty": e["qty"]}
        assert have["first_part"] == e["s"].split("1")[0]
