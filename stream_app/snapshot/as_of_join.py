"""The as-of (temporal) join: each event to the version of its key valid at its event time.

An equi-join on the lookup key plus ``__from <= t AND (__to IS NULL OR t < __to)``
against a :class:`VersionsView` (see :mod:`stream_app.snapshot.versioned`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stream_app.snapshot.data import LK
from stream_app.snapshot.version_intervals import FROM, TO


def _f() -> Any:
    from pyspark.sql import functions

    return functions


@dataclass(frozen=True)
class VersionsView:
    """The versions a micro-batch's ``as_of`` lookups join.

    Attributes:
        df: ``__lk, __from, __to`` + value fields (Parquet bucketed by ``__lk``, or cached).
        rows: versions in it.
        horizon_ms: events older than this (epoch ms) get no version (``None``: no record read yet).
        broadcast: join by broadcast (small table) rather than by a sort-merge join.
    """

    df: Any
    rows: int
    horizon_ms: int | None
    broadcast: bool


def event_time_ms(column: Any, data_type: Any) -> Any:
    """An event-time column as epoch ms: a timestamp's instant, or a date's midnight UTC.

    Raises:
        ValueError: the column is neither a timestamp nor a date.
    """
    from pyspark.sql import types as T

    f = _f()
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return f.unix_millis(column.cast("timestamp")) if isinstance(data_type, T.TimestampNTZType) \
            else f.unix_millis(column)
    if isinstance(data_type, T.DateType):
        return f.unix_date(column).cast("long") * f.lit(86_400_000)
    raise ValueError(f"as_of column of type {data_type.simpleString()} is not a timestamp or a date")


def join_as_of(
    df: Any, i: int, key: str, at: Any, view: VersionsView, values: Sequence[str], how: str,
    passthrough: str | None, too_old: Any = None,
) -> tuple[Any, list[Any]]:
    """Join each event to the version of its key valid at its time (a temporal join).

    Args:
        df: the events, with the lookup key column ``key``.
        i: the lookup's index (names the helper columns).
        key: the events' lookup key column.
        at: the event-time column, epoch ms (:func:`event_time_ms`).
        view: the versions to join.
        values: the value fields to join.
        how: ``left`` or ``inner``.
        passthrough: a column whose non-null rows an inner lookup never drops.
        too_old: a ``pyspark.sql.Observation`` that receives ``too_old``, the events
            older than the retention horizon (they get no version); ``None``: not counted.

    Returns:
        The joined frame (``__v{i}`` the value struct, null without a version) and
        the value's fields as columns to select.
    """
    f = _f()
    side = view.df.select(
        f.col(LK).alias(f"__vk{i}"), f.col(FROM).alias(f"__vf{i}"), f.col(TO).alias(f"__vt{i}"),
        f.struct(*values).alias(f"__vv{i}"),
    )
    if view.broadcast:
        side = side.hint("broadcast")
    at_col = f"__at{i}"
    df = df.select("*", at.alias(at_col))
    t = f.col(at_col)
    cond = (
        (f.col(key) == f.col(f"__vk{i}"))
        & (f.col(f"__vf{i}") <= t)
        & (f.col(f"__vt{i}").isNull() | (t < f.col(f"__vt{i}")))
    )
    joined = df.join(side, cond, "left")
    horizon = view.horizon_ms
    fresh = f.lit(True) if horizon is None else t >= f.lit(horizon)
    value = f.when(fresh, f.col(f"__vv{i}"))
    if too_old is not None:
        old = f.lit(False) if horizon is None else t < f.lit(horizon)
        joined = joined.observe(too_old, f.count_if(old).alias("too_old"))
    joined = joined.select("*", value.alias(f"__v{i}"))
    if how == "inner":
        keep = f.col(f"__v{i}").isNotNull()
        if passthrough is not None:
            keep = keep | f.col(passthrough).isNotNull()
        joined = joined.filter(keep)
    return joined, [f.col(f"__v{i}")[name] for name in values]
