"""Hopping and session windows and the newer aggregate functions, through real Kafka and Spark (local[2]).

Each test writes a few hundred flights in shuffled order (arrival order is not event time),
runs the job and checks every update record against a pandas oracle computed here from the
same events: counts, sums, distinct counts, first/last by event time exact, the approximate
functions within their documented error.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from typing import Any

import pandas as pd
import pytest

from kernel.updates import VERSION_HEADER, decode_version
from tests.integration.stream.test_typed_aggregations import ORDER  # the same orders

pytestmark = pytest.mark.spark

T0 = dt.datetime(2013, 1, 1, tzinfo=dt.UTC)
ORIGINS = ("EWR", "JFK", "LGA")
DESTS = ("LAX", "ORD", "JFK", "EWR", "LGA")
PERCENTILE_RANK_ERROR = 1 / 10_000  # percentile_approx's accuracy 10000 (stream_app.updates.PERCENTILE_ACCURACY)
HLL_RSD = 0.05  # approx_count_distinct's relative standard deviation (Spark's default)


def _flight(i: int, origin: str, at: dt.datetime, rng: random.Random) -> dict[str, Any]:
    delay = None if rng.random() < 0.1 else float(rng.randint(-10, 120))  # whole numbers: sums are exact
    return {"flight_id": i, "origin": origin, "dest": rng.choice(DESTS), "dep_delay": delay, "time_hour": at}


def _frame(flights: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(flights).astype({"dep_delay": "float64"})


def _put_shuffled(env, flights: list[dict[str, Any]], seed: int) -> None:
    shuffled = list(flights)
    random.Random(seed).shuffle(shuffled)
    env.put_flights(shuffled)


def _latest_per_key(records: list[dict[str, Any]]) -> dict[tuple[str, dt.datetime], dict[str, Any]]:
    """The record of the highest version per (origin, window_start): what a sink keeps."""
    out: dict[tuple[str, dt.datetime], tuple[int, dict[str, Any]]] = {}
    for rec in records:
        value = rec["value"]
        version = decode_version(rec["headers"][VERSION_HEADER])
        key = (value["origin"], value["window_start"])
        if key not in out or version > out[key][0]:
            out[key] = (version, {**value, "__version": version})
    return {k: v for k, (_, v) in out.items()}


def _complete(expected: dict[Any, dict[str, Any]]):
    def until(records: list[dict[str, Any]]) -> bool:
        got = _latest_per_key([r for r in records if r["value"] is not None])
        return all(k in got and got[k]["flights"] == e["flights"] for k, e in expected.items())

    return until


def _oracle(group: pd.DataFrame) -> dict[str, Any]:
    """Every aggregate of one (origin, window) from its events, as pandas computes them."""
    ordered = group.sort_values("time_hour")
    delays = ordered["dep_delay"].dropna()
    return {
        "flights": len(ordered),
        "total_delay": float(delays.sum()) if len(delays) else None,
        "dests": int(ordered["dest"].nunique()),
        "first_dest": ordered["dest"].iloc[0],
        "last_dest": ordered["dest"].iloc[-1],
        "last_delay": None if pd.isna(ordered["dep_delay"].iloc[-1]) else float(ordered["dep_delay"].iloc[-1]),
        "delay_sd": float(delays.std(ddof=1)) if len(delays) > 1 else None,
        "delays": sorted(delays.tolist()),
    }


def _check_percentile(value: float | None, values: list[float], p: float) -> None:
    """``value`` is a percentile ``p`` of ``values`` within percentile_approx's rank error."""
    if not values:
        assert value is None
        return
    n = len(values)
    below = sum(v < value for v in values)
    at_or_below = sum(v <= value for v in values)
    slack = n * PERCENTILE_RANK_ERROR
    assert value in values  # percentile_approx returns one of the values it saw
    assert below <= p * n + slack and at_or_below >= p * n - slack, (value, values)


def _hopping_windows(at: dt.datetime, window: dt.timedelta, slide: dt.timedelta) -> list[dt.datetime]:
    """Starts of the hopping windows holding ``at``: every multiple of ``slide`` since the epoch (Spark's)."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    last = epoch + ((at - epoch) // slide) * slide
    starts = []
    while last + window > at:
        starts.append(last)
        last -= slide
    return starts


def test_hopping_windows_and_every_aggregate_function_match_a_pandas_oracle(spark, env):
    for faa in DESTS:
        env.put_airport(faa)
    rng = random.Random(38)
    # 240 flights over 12 hours at distinct minutes: first/last by event time are defined
    minutes = rng.sample(range(12 * 60), 240)
    flights = [_flight(i, rng.choice(ORIGINS), T0 + dt.timedelta(minutes=m), rng) for i, m in enumerate(minutes)]
    # a slide that does not divide the window: Spark starts windows at multiples of the slide since the epoch
    window, slide = dt.timedelta(hours=1), dt.timedelta(minutes=25)
    update = {
        "topic": env.delays, "kind": "aggregation", "group_by": ["origin"], "event_time": "time_hour",
        "window": "1 hour", "slide": "25 minutes", "watermark": "1 day",
        "aggregations": {
            "flights": "count", "total_delay": "sum(dep_delay)", "dests": "count_distinct(dest)",
            "approx_dests": "approx_count_distinct(dest)", "first_dest": "first(dest)", "last_dest": "last(dest)",
            "last_delay": "last(dep_delay)", "delay_sd": "stddev(dep_delay)", "p90": "percentile(dep_delay, 0.9)",
        },
    }
    events = {"topic": env.events, "value_schema": "flight.avsc", "starting_offsets": "earliest",
              "max_offsets_per_trigger": 60}  # several micro-batches: the state (sets, sketches) is merged across them
    config = env.config(events=events, updates=[update])
    _put_shuffled(env, flights, seed=1)
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(300)

    frame = _frame(flights)
    frame["window_start"] = [_hopping_windows(t, window, slide) for t in frame["time_hour"]]
    frame = frame.explode("window_start")
    expected = {(o, pd.Timestamp(w).to_pydatetime()): _oracle(g) for (o, w), g in frame.groupby(["origin", "window_start"])}
    assert sum(e["flights"] for e in expected.values()) > 2 * len(flights)  # every flight is in 2 or 3 windows

    records = env.consume(env.delays, _complete(expected), timeout_s=120)
    got = _latest_per_key(records)
    assert set(got) == set(expected)  # no window Spark has that the oracle lacks
    # the aggregation's records are counted as updates, as a projection's are
    from prometheus_client import REGISTRY

    counted = REGISTRY.get_sample_value("threes_stream_records_total", {"job": config.name, "kind": "updates"})
    assert counted is not None and counted >= len(expected), counted
    for key, e in expected.items():
        g = got[key]
        assert g["window_end"] - g["window_start"] == window
        assert g["__version"] == g["flights"] == e["flights"], key
        assert g["total_delay"] == e["total_delay"], key
        assert g["dests"] == e["dests"], key
        assert abs(g["approx_dests"] - e["dests"]) <= max(1.0, 3 * HLL_RSD * e["dests"]), key
        assert (g["first_dest"], g["last_dest"], g["last_delay"]) == (e["first_dest"], e["last_dest"],
                                                                      e["last_delay"]), key
        if e["delay_sd"] is None:
            assert g["delay_sd"] is None, key
        else:
            assert math.isclose(g["delay_sd"], e["delay_sd"], rel_tol=1e-9), key
        _check_percentile(g["p90"], e["delays"], 0.9)


def _sessions(frame: pd.DataFrame, gap: dt.timedelta) -> dict[tuple[str, dt.datetime], dict[str, Any]]:
    """Session windows per origin: a new session when the next event is ``gap`` or more after the last one."""
    out = {}
    for origin, group in frame.sort_values("time_hour").groupby("origin"):
        session = (group["time_hour"].diff() >= gap).cumsum()
        for _, events in group.groupby(session):
            start, end = events["time_hour"].min(), events["time_hour"].max() + gap
            out[(origin, start.to_pydatetime())] = {**_oracle(events), "window_end": end.to_pydatetime()}
    return out


def _aggregated_rows(job, topic: str) -> int:
    query = next(q for q in job.queries if topic in (q.name or ""))
    return sum(p["numInputRows"] for p in query.recentProgress)


def test_session_windows_match_a_pandas_oracle_and_a_late_event_moves_the_start_before_emission(spark, env):
    import time

    for faa in DESTS:
        env.put_airport(faa)
    rng = random.Random(3838)
    gap = dt.timedelta(minutes=30)
    flights: list[dict[str, Any]] = []
    for slot in range(10):  # one session per origin every 3 hours, 2 to 8 flights 1 to 15 minutes apart
        for k, origin in enumerate(ORIGINS):
            at = T0 + dt.timedelta(hours=3 * slot, minutes=20 * k)
            for _ in range(rng.randint(2, 8)):
                flights.append(_flight(len(flights), origin, at, rng))
                at += dt.timedelta(minutes=rng.randint(1, 15))
    last = T0 + dt.timedelta(hours=32)  # EWR's last session, after every other one
    flights += [_flight(len(flights) + i, "EWR", last + dt.timedelta(minutes=5 * i), rng) for i in range(3)]
    update = {
        "topic": env.delays, "kind": "aggregation", "group_by": ["origin"], "event_time": "time_hour",
        "window": "session", "gap": "30 minutes", "watermark": "2 days",  # the shuffled flights are all on time
        "aggregations": {"flights": "count", "total_delay": "sum(dep_delay)", "dests": "count_distinct(dest)",
                         "first_dest": "first(dest)", "last_dest": "last(dest)", "last_delay": "last(dep_delay)"},
    }
    config = env.config(updates=[update])
    _put_shuffled(env, flights, seed=2)
    job = env.start(spark, config)
    deadline = time.monotonic() + 240
    while _aggregated_rows(job, env.delays) < len(flights):  # the sessions are open in the state store
        assert time.monotonic() < deadline, "the aggregation did not read the flights"
        time.sleep(1)

    # before EWR's last session, less than the gap before it and within the watermark: that session, still
    # open, now starts 20 minutes earlier
    late = _flight(len(flights), "EWR", last - dt.timedelta(minutes=20), rng)
    env.put_flights([late])
    while _aggregated_rows(job, env.delays) < len(flights) + 1:
        assert time.monotonic() < deadline, "the aggregation did not read the late flight"
        time.sleep(1)
    # three days later, another origin: the watermark passes the end of every session above, which are emitted
    env.put_flights([_flight(len(flights) + 1, "ORD", last + dt.timedelta(days=3), rng)])

    expected = _sessions(_frame([*flights, late]), gap)
    assert len(expected) == 31 and ("EWR", late["time_hour"]) in expected
    records = env.consume(env.delays, _complete(expected), timeout_s=180)
    got = _latest_per_key(records)
    assert set(got) == set(expected)  # the session ORD opened stays open: not emitted
    # append mode: each session is written once, final; the key EWR's last session had before the late
    # flight (its start then) was never written, so no record in a sink needs a tombstone
    assert len(records) == len(expected)
    assert ("EWR", last) not in got
    for key, e in expected.items():
        g = got[key]
        assert g["window_end"] == e["window_end"], key
        assert g["__version"] == g["flights"] == e["flights"], key
        assert (g["total_delay"], g["dests"]) == (e["total_delay"], e["dests"]), key
        assert (g["first_dest"], g["last_dest"], g["last_delay"]) == (e["first_dest"], e["last_dest"],
                                                                      e["last_delay"]), key

    # older than the watermark now: dropped, and counted once (not by each stateful operator it meets)
    env.put_flights([_flight(len(flights) + 2, "EWR", T0, rng)])
    while _aggregated_rows(job, env.delays) < len(flights) + 3:
        assert time.monotonic() < deadline + 180, "the aggregation did not read the late flight"
        time.sleep(1)
    late_events = job._listener
    job.stop()  # progress reaches listeners through Spark's asynchronous bus: the stop waits for the last events
    assert late_events.dropped[env.delays] == 1




def test_new_functions_keep_decimal_and_date_types_over_hopping_days(spark, tmp_path):
    """first/last of the date event time stay dates; percentile and first/last of a decimal stay decimals."""
    import io
    import json
    from decimal import Decimal

    import fastavro
    from pyspark.sql.types import DateType, DecimalType, LongType, StringType, StructField, StructType

    from schemas.serde import HEADER_BYTES
    from stream_app.config import StreamJobConfig
    from stream_app.plan import build_plan
    from stream_app.updates import aggregate, aggregation_records

    (tmp_path / "order.avsc").write_text(json.dumps(ORDER))
    config = StreamJobConfig.model_validate({
        "events": {"topic": "orders", "value_schema": str(tmp_path / "order.avsc")},
        "enriched_topic": "orders.enriched", "dead_letter_topic": "orders.dlq",
        "checkpoint_location": str(tmp_path / "cp"),
        "updates": [{"topic": "updates.days", "kind": "aggregation", "group_by": ["shop"], "event_time": "day",
                     "window": "2 days", "slide": "1 day",
                     "aggregations": {"n": "count", "first_day": "first(day)", "last_day": "last(day)",
                                      "first_amount": "first(amount)", "median": "percentile(amount, 0.5)",
                                      "sd": "stddev(amount)", "ids": "count_distinct(order_id)"}}],
    })
    update = build_plan(config, spark, tmp_path).updates[0]
    schema = StructType([StructField("order_id", LongType()), StructField("shop", StringType()),
                         StructField("day", DateType()), StructField("amount", DecimalType(12, 2))])
    d = dt.date(1996, 3, 13)
    rows = [(1, "a", d + dt.timedelta(days=1), Decimal("3.30")), (2, "a", d, Decimal("1.10")),
            (3, "a", d + dt.timedelta(days=1), Decimal("2.20")), (3, "a", d + dt.timedelta(days=1), Decimal("2.20"))]
    out = aggregation_records(aggregate(spark.createDataFrame(rows, schema), update), update).collect()
    parsed = fastavro.parse_schema(update.value.avro)
    values = {v["window_start"].date(): v for v in (
        fastavro.schemaless_reader(io.BytesIO(r["value"][HEADER_BYTES:]), parsed, None) for r in out)}
    # windows of 2 days every day since the epoch: the 12th-13th, the 13th-14th, the 14th-15th
    assert sorted(values) == [d - dt.timedelta(days=1), d, d + dt.timedelta(days=1)]
    both = values[d]
    assert (both["n"], both["ids"]) == (4, 3)
    assert (both["first_day"], both["last_day"]) == (d, d + dt.timedelta(days=1))  # dates, not timestamps
    assert both["first_amount"] == Decimal("1.10")  # the earliest day's, though it came second
    assert both["median"] == Decimal("2.20")  # one of the amounts, exactly
    assert math.isclose(both["sd"], float(pd.Series([3.3, 1.1, 2.2, 2.2]).std(ddof=1)), rel_tol=1e-12)
    assert values[d - dt.timedelta(days=1)]["sd"] is None  # one order: no sample standard deviation
