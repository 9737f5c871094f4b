"""Rows for `threes replay`: typed values, filters, keys, and the Avro bytes they become."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from kernel.exceptions import ConfigError
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


def _replayer(store: InMemorySchemaStore) -> Any:
    from kernel.config.models import KafkaConfig
    from threes.demo.replay import Replayer

    # the constructor contacts no broker: the schemas go to the in-memory store
    return Replayer(KafkaConfig(bootstrap_servers="127.0.0.1:1"), "flights", load_schema("nycflights13/flight"),
                    list(data.FLIGHT_KEY), key_schema=load_schema("nycflights13/flight_key"), store=store)


def test_rows_of_a_table_are_encoded_column_wise_into_fastavros_bytes() -> None:
    from threes.demo.replay import COLUMNAR_ROWS

    store = InMemorySchemaStore()
    replayer = _replayer(store)
    assert replayer.columnar is not None
    source = table_source(data.read_table("flights"), "flights", limit=2 * COLUMNAR_ROWS + 17)
    encoded = list(replayer._encoded(source))
    assert len(encoded) == source.total
    assert all(key is not None and value is not None for _row, key, value in encoded)
    key_ser = AvroSerializer(load_schema("nycflights13/flight_key"), store)
    value_ser = AvroSerializer(load_schema("nycflights13/flight"), store)
    for (row, key, value), expected in zip(encoded, table_source(source.table, "again").rows, strict=True):
        assert row == expected
        assert key == key_ser({k: row[k] for k in data.FLIGHT_KEY})
        assert value == value_ser(row)


def test_a_batch_the_columnar_encoder_cannot_write_is_left_to_the_per_row_path_which_names_the_row() -> None:
    from threes.demo.replay import COLUMNAR_ROWS, RowSource

    store = InMemorySchemaStore()
    replayer = _replayer(store)
    table = data.read_table("flights").slice(0, COLUMNAR_ROWS + 5)
    carrier = table.column("carrier").to_pylist()
    carrier[COLUMNAR_ROWS + 2] = None  # a null in a non-null field, in the second batch
    table = table.set_column(table.schema.get_field_index("carrier"), pa.field("carrier", pa.string()),
                             pa.array(carrier, pa.string()))
    encoded = list(replayer._encoded(RowSource(arrow_rows(table), table.num_rows, "flights.csv", table)))
    assert all(k is not None for _r, k, _v in encoded[:COLUMNAR_ROWS])  # the first batch: column-wise
    assert all(k is None and v is None for _r, k, v in encoded[COLUMNAR_ROWS:])  # the second: one row at a time
    assert encoded[COLUMNAR_ROWS + 2][0]["carrier"] is None  # the row the per-row path names (tests/e2e)
