"""The job's ordered steps run on a micro-batch's events: derive columns, lookup rounds and ``where``.

:mod:`stream_app.stages` orders them as a DAG when the job starts; :func:`apply_steps` applies them
in that order to a DataFrame of decoded events, each lookup round by :func:`stream_app.enrich.enrich`.
A ``where`` drops events by a generator, never a filter (:func:`stream_app.columns.rows_where`), and
never drops an event on its way to the dead letter topic.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from stream_app.columns import ColumnCache, rows_where
from stream_app.enrich import BoundLookup, enrich
from stream_app.expressions import column
from stream_app.stages import DeriveStep, LookupStep, Step, WhereStep


def _derived(step: DeriveStep) -> list[Any]:
    return [column(text, name) for name, text in step.columns]


def _dropped_column(step: WhereStep, passthrough: str | None) -> Any:
    return _dropped(step.expression, passthrough).alias(DROPPED)


def apply_steps(
    events: Any,
    steps: Sequence[Step],
    lookups: Sequence[BoundLookup],
    passthrough: str | None = None,
    cache: ColumnCache | None = None,
    observation: Any = None,
) -> Any:
    """Run a job's derive columns, lookups and ``where`` in their planned order (:mod:`stream_app.stages`).

    Args:
        events: decoded events (their fields as columns).
        steps: the plan's steps.
        lookups: every lookup of the job, bound to this batch's views, by index.
        passthrough: a column whose non-null rows (events to dead-letter) neither a ``where`` nor an
            inner lookup drops.
        cache: the job's :class:`~stream_app.columns.ColumnCache`.
        observation: a ``pyspark.sql.Observation`` (a micro-batch) or the name of the observed
            metrics in a streaming query's progress (real-time mode) that receives ``filtered``, the
            events the ``where`` dropped; ``None``: not counted.

    Returns:
        The events with every derive and looked-up column, without the events ``where`` dropped.
    """
    from pyspark.sql import functions as f

    cache = cache if cache is not None else ColumnCache()
    df = events
    for step in steps:
        if isinstance(step, DeriveStep):
            cols = cache.get(("derive", step.columns), partial(_derived, step))
            df = cache.select(df, [cache.col("*"), *cols])
        elif isinstance(step, LookupStep):
            df = enrich(df, [lookups[i] for i in step.lookups], passthrough, cache, ids=step.lookups)
        else:
            dropped = cache.get(("where", step.expression, passthrough), partial(_dropped_column, step, passthrough))
            df = cache.select(df, [cache.col("*"), dropped])
            if observation is not None:
                df = df.observe(observation, f.count_if(f.col(DROPPED)).alias("filtered"))
            kept = [c for c in df.columns if c != DROPPED]
            # A generator (rows_where), never a filter: Spark pushes a filter below the projections under it
            # and copies the expressions it reads into the predicate. Before the lookups that copied the
            # events' decoding (from_avro, 7 times in the plan of a where on one field) and the dead letter
            # check; after one, a lookup's UDF. Events it drops are never looked up either way: the lookups
            # come after it in the plan.
            df = rows_where(df, ~f.col(DROPPED), kept)
    return df


DROPPED = "__dropped"


def _dropped(expression: str, passthrough: str | None) -> Any:
    """True for an event ``where`` drops: not true (false or null), and not one to dead-letter."""
    from pyspark.sql import functions as f

    dropped = ~f.coalesce(column(expression), f.lit(False))
    return dropped & f.col(passthrough).isNull() if passthrough is not None else dropped
