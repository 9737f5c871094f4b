"""Rows for `threes replay`: typed values, filters, keys, and the Avro bytes they become."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from connectors.exceptions import ConfigError
from schemas import load_schema
from schemas.serde import AvroDeserializer, AvroSerializer
from schemas.store import InMemorySchemaStore
from threes.demo import data
from threes.demo.replay import arrow_rows, filter_table, key_schema_for, table_source


def test_rows_are_plain_python_values_with_nulls_and_epoch_timestamps() -> None:
    table = pa.table({
        "i": pa.array([1, None, 3], pa.int32()),
        "f": pa.array([1.5, None, 2.0]),
        "s": pa.array(["a", None, "c"]),
        "t": pa.array([0, 3_600_000_000, None], pa.timestamp("us", tz="UTC")),
        "b": pa.array([True, None, False]),
    })
    rows = list(arrow_rows(table, batch_rows=2))
    assert rows == [
        {"i": 1, "f": 1.5, "s": "a", "t": 0, "b": True},
        {"i": None, "f": None, "s": None, "t": 3_600_000_000, "b": None},
        {"i": 3, "f": 2.0, "s": "c", "t": None, "b": False},
    ]
    assert all(type(r["i"]) is int for r in rows if r["i"] is not None)


def test_match_and_limit_select_a_deterministic_subset() -> None:
    flights = data.read_table("flights")
    some = filter_table(flights, {"month": ["1"], "day": ["1", "2"]})
    assert some.num_rows == 842 + 943
    assert set(zip(some.column("month").to_pylist(), some.column("day").to_pylist(), strict=True)) == {(1, 1), (1, 2)}
    assert filter_table(flights, {"carrier": ["HA"]}, limit=5).num_rows == 5
    with pytest.raises(ConfigError, match="no column 'moth'"):
        filter_table(flights, {"moth": ["1"]})
    with pytest.raises(ConfigError, match="not values of type int32"):
        filter_table(flights, {"month": ["January"]})


def test_derived_key_schema_is_the_shipped_flight_key() -> None:
    derived = key_schema_for(load_schema("nycflights13/flight"), list(data.FLIGHT_KEY))
    shipped = load_schema("nycflights13/flight_key")
    assert derived["name"] == shipped["name"] and derived["namespace"] == shipped["namespace"]
    assert [(f["name"], f["type"]) for f in derived["fields"]] == [(f["name"], f["type"]) for f in shipped["fields"]]
    with pytest.raises(ConfigError, match="nullable"):
        key_schema_for(load_schema("nycflights13/flight"), ["tailnum"])
    with pytest.raises(ConfigError, match="not in schema"):
        key_schema_for(load_schema("nycflights13/flight"), ["nope"])


def test_every_flight_row_encodes_and_decodes_to_the_same_values() -> None:
    store = InMemorySchemaStore()
    value_schema = load_schema("nycflights13/flight")
    ser = AvroSerializer(value_schema, store)
    de = AvroDeserializer(store)
    source = table_source(data.read_table("flights"), "flights", match={"month": ["2"], "day": ["9"]})
    n = 0
    for row in source.rows:
        back = de(ser(row))
        assert back["time_hour"] == dt.datetime.fromtimestamp(row["time_hour"] / 1e6, dt.UTC)
        assert {k: v for k, v in back.items() if k != "time_hour"} == {k: v for k, v in row.items() if k != "time_hour"}
        n += 1
    assert n == source.total == 684


def test_flights_csv_is_not_in_time_order_and_sorting_makes_it_so() -> None:
    from threes.demo.rows import sort_table

    flights = data.read_table("flights")
    months = flights.column("month").to_pylist()
    runs = [m for i, m in enumerate(months) if i == 0 or months[i - 1] != m]
    assert runs == [1, 10, 11, 12, 2, 3, 4, 5, 6, 7, 8, 9]  # R's string sort of months
    ordered = sort_table(flights, ["time_hour"])
    stamps = ordered.column("time_hour").cast(pa.int64()).to_pylist()
    assert stamps == sorted(stamps) and ordered.num_rows == flights.num_rows
    first = stamps[0]
    in_file = [f for f, t in zip(flights.column("flight").to_pylist(),
                                 flights.column("time_hour").cast(pa.int64()).to_pylist(), strict=True) if t == first]
    assert ordered.slice(0, len(in_file)).column("flight").to_pylist() == in_file  # ties keep file order
    with pytest.raises(ConfigError, match="no column"):
        sort_table(flights, ["when"])


def test_csv_dates_and_local_timestamps_read_into_timestamp_and_date_fields(tmp_path):
    import datetime as dt

    from threes.demo.data import read_csv

    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ]}
    (tmp_path / "o.csv").write_text("at,day\n1996-03-13,1996-03-13\n1996-03-13 10:11:12,1996-03-14\n"
                                    "1996-03-13T10:11:12.5+02:00,1996-03-15\n")
    utc = read_csv(tmp_path / "o.csv", schema).to_pydict()
    assert utc["at"] == [dt.datetime(1996, 3, 13, tzinfo=dt.UTC), dt.datetime(1996, 3, 13, 10, 11, 12, tzinfo=dt.UTC),
                         dt.datetime(1996, 3, 13, 8, 11, 12, 500000, tzinfo=dt.UTC)]
    assert utc["day"] == [dt.date(1996, 3, 13), dt.date(1996, 3, 14), dt.date(1996, 3, 15)]
    oslo = read_csv(tmp_path / "o.csv", schema, timezone="Europe/Oslo").to_pydict()["at"]
    assert [t.astimezone(dt.UTC).hour for t in oslo] == [23, 9, 8]  # local times in Oslo (UTC+1); the offset wins
