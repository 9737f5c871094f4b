"""The aggregation specs of an update topic's ``aggregations`` (``count``, ``sum(f)``, ``percentile(f, p)``...).

:func:`parse_aggregation` is the one parser of them: the config checks a spec
with it (:data:`AggregationText`) and the plan builds its Spark aggregate from
the :class:`AggregationSpec` it returns.
"""

from __future__ import annotations

import re
from typing import Annotated, NamedTuple

from pydantic import AfterValidator

AGGREGATION = re.compile(
    r"^(?P<fn>[a-z_]+)(?:\((?P<field>[A-Za-z_][A-Za-z0-9_]*)(?:,(?P<p>[^,()]*))?\))?$"
)
"""The shape of an aggregation spec (spaces removed): ``fn``, ``fn(field)`` or ``fn(field,p)``;
:func:`parse_aggregation` checks the function and its arguments."""


AGGREGATE_FUNCTIONS = {
    "count": "count",
    "mean": "mean(f)",
    "sum": "sum(f)",
    "min": "min(f)",
    "max": "max(f)",
    "count_distinct": "count_distinct(f)",
    "approx_count_distinct": "approx_count_distinct(f)",
    "first": "first(f)",
    "last": "last(f)",
    "stddev": "stddev(f)",
    "percentile": "percentile(f, p)",
}
"""Every aggregate function of ``aggregations``, by name, with its spec's form (``f`` a field, ``p`` in (0, 1))."""


class AggregationSpec(NamedTuple):
    """One parsed aggregation spec: ``fn`` over ``field`` (``None`` for ``count``), ``p`` for ``percentile``."""

    fn: str
    field: str | None
    p: float | None = None


def parse_aggregation(spec: str) -> AggregationSpec:
    """Parse an aggregation spec of ``aggregations`` (the one parser of them: config and plan use it).

    Args:
        spec: ``count``, ``sum(amount)``, ``percentile(amount, 0.95)``... (spaces anywhere).

    Returns:
        The function, its field and ``p`` (percentile only).

    Raises:
        ValueError: an unknown function, a missing or extra argument, or ``p`` outside (0, 1); the
            message names the spec and the accepted forms.
    """
    forms = ", ".join(AGGREGATE_FUNCTIONS.values())
    if spec.count("(") > spec.count(")"):
        # YAML's flow mapping {p95: percentile(delay, 0.95)} splits at the comma: "percentile(delay" is left
        raise ValueError(f"{spec!r} looks cut at a comma: in a YAML flow mapping ({{...}}) quote the whole "
                         f"spec (\"{spec.strip()}, ...)\"), or write the mapping one key per line")
    m = AGGREGATION.match(spec.replace(" ", ""))
    if m is None or m.group("fn") not in AGGREGATE_FUNCTIONS:
        raise ValueError(f"{spec!r} is not {forms}")
    fn, field, p = m.group("fn"), m.group("field"), m.group("p")
    if fn == "count":
        if field is not None:
            raise ValueError(f"{spec!r}: count takes no field (it counts events; count_distinct(f) counts values)")
        return AggregationSpec(fn, None)
    if field is None:
        raise ValueError(f"{spec!r}: {fn} needs a field: {AGGREGATE_FUNCTIONS[fn]}")
    if fn != "percentile":
        if p is not None:
            raise ValueError(f"{spec!r}: {fn} takes one field: {AGGREGATE_FUNCTIONS[fn]}")
        return AggregationSpec(fn, field)
    try:
        fraction = float(p) if p is not None else None
    except ValueError:
        fraction = None
    if fraction is None or not 0.0 < fraction < 1.0:
        raise ValueError(f"{spec!r}: percentile(f, p) needs p in (0, 1), e.g. percentile({field}, 0.95)")
    return AggregationSpec(fn, field, fraction)


def _checked_aggregation(spec: str) -> str:
    parse_aggregation(spec)
    return spec


AggregationText = Annotated[str, AfterValidator(_checked_aggregation)]
