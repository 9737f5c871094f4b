"""Compare what the three sinks hold with the oracle, after a run.

* Elasticsearch ``flights``: one document per flight with every enriched
  field (:func:`threes.demo.oracle.compare` on all 336,776 or the subset);
* PostgreSQL ``route_stats``: every row (count and both means), and one
  window for all of them;
* S3 archive: the latest archived row of every flight (by version) equals the
  oracle's, each row sits in the ``dt=`` folder of its UTC date, and nothing
  was archived for a flight that does not exist.

Values of a changed reference are accepted old or new (the change happened
mid-stream); :func:`threes.demo.changes.check_boundary` then checks that
the switch from old to new is clean in every partition.

A check whose sink the pipeline does not have (``route_stats`` without the
PostgreSQL sink, e.g. in real-time mode) does not run: it is reported as
skipped, with the reason, and ``all_match`` covers only the checks that ran.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from threes.demo import oracle
from threes.demo.monitor import Targets
from threes.demo.sinks import read_archive, read_index, read_sql_table

log = logging.getLogger(__name__)

MATCH_COLUMNS = {
    "airline": ["airline_name"],
    "origin": ["origin_name"],
    "dest": ["dest_name"],
    "plane": ["plane_type"],
    "weather": [f"weather_{f}" for f in oracle.WEATHER_FIELDS],
}
"""Enriched columns that are non-null exactly when a lookup found its row (``plane_type`` is never NA
in planes.csv; a weather row has at least one measurement)."""


def match_rates(frame: Any) -> dict[str, dict[str, float | int]]:
    """Per lookup: flights with a match and the share of all flights, from enriched rows."""
    total = max(1, len(frame))
    out = {}
    for name, columns in MATCH_COLUMNS.items():
        matched = int(frame[columns].notna().any(axis=1).sum())
        out[name] = {"matched": matched, "rate": round(matched / total, 4)}
    return out


def verify(
    targets: Targets,
    expected: Any,
    alternatives: Any | None = None,
    changes: Sequence[Any] = (),
    events_partitions: int = 4,
) -> dict[str, Any]:
    """Read every sink back and compare it with the oracle.

    Args:
        targets: where the sinks are.
        expected: the oracle's enriched flights (:func:`threes.demo.oracle.enriched_flights`).
        alternatives: the oracle's enriched flights after every reference change, or ``None``.
        changes: the applied :class:`~threes.demo.changes.ReferenceChange` objects.
        events_partitions: partitions of the events topic (for the boundary checks).

    Returns:
        ``{"all_match": bool, "checked": [...], "skipped": {check: reason}, "flights_index": {...},
        "route_stats": {...}, "archive": {...}, "match_rate": {...}, "expected_match_rate": {...},
        "reference_changes": [...], "elapsed_s": {...}}``. ``all_match`` is whether every check
        in ``checked`` matched; a skipped check's entry is ``{"ok": None, "skipped": reason}``.
    """
    out: dict[str, Any] = {"elapsed_s": {}}
    key = list(oracle.FLIGHT_KEY)
    columns = oracle.enriched_columns()
    docs, flights_cmp = _verify_index(targets, expected, alternatives, out, key, columns)
    results: dict[str, bool] = {"flights_index": flights_cmp.ok}
    skipped: dict[str, str] = {}
    route_summary = "skipped"
    if targets.pg is None:
        skipped["route_stats"] = "the pipeline has no PostgreSQL (rds_sink) target for route_stats"
        out["route_stats"] = {"ok": None, "skipped": skipped["route_stats"]}
    else:
        route_cmp, results["route_stats"] = _verify_routes(targets, expected, out)
        route_summary = route_cmp.summary()
    results["archive"] = _verify_archive(targets, expected, alternatives, out, key, columns)
    results.update(_verify_changes(changes, docs, events_partitions, out, key))
    out["checked"] = list(results)
    out["skipped"] = skipped
    out["all_match"] = bool(all(results.values()))
    log.info("verify all_match=%s flights=%s route_stats=%s archive=%s skipped=%s", out["all_match"],
             flights_cmp.summary(), route_summary, out["archive"].get("ok"), sorted(skipped) or "none")
    return out


def _verify_index(targets: Targets, expected: Any, alternatives: Any, out: dict[str, Any], key: list[str],
                  columns: list[str]) -> tuple[Any, oracle.Comparison]:
    """The flights index against the oracle, and its match rates; returns ``(documents, comparison)``."""
    began = time.monotonic()
    docs = read_index(targets.es[0], targets.es[1])
    out["elapsed_s"]["read_elasticsearch"] = round(time.monotonic() - began, 1)
    flights_cmp = oracle.compare("flights index", expected, docs, key, columns, alternatives=alternatives)
    out["flights_index"] = flights_cmp.as_dict()
    if len(docs):
        out["match_rate"] = match_rates(docs)
    out["expected_match_rate"] = {k.rstrip("_"): {"matched": v, "rate": round(v / max(1, len(expected)), 4)}
                                  for k, v in oracle.match_counts(expected).items()}
    return docs, flights_cmp


def _verify_routes(targets: Targets, expected: Any, out: dict[str, Any]) -> tuple[oracle.Comparison, bool]:
    """The ``route_stats`` table against the oracle's aggregation (one window); returns ``(comparison, ok)``."""
    assert targets.pg is not None
    began = time.monotonic()
    conn, table, schema = targets.pg
    rows = read_sql_table(conn, table, schema)
    out["elapsed_s"]["read_postgres"] = round(time.monotonic() - began, 1)
    stats = oracle.route_stats(expected)
    route_cmp = oracle.compare("route_stats", stats, rows, list(oracle.ROUTE_KEY), list(oracle.ROUTE_VALUES))
    out["route_stats"] = route_cmp.as_dict()
    windows = int(rows["window_start"].nunique()) if "window_start" in rows else 0
    out["route_stats"]["windows"] = windows
    return route_cmp, route_cmp.ok and windows == 1


def _verify_archive(targets: Targets, expected: Any, alternatives: Any, out: dict[str, Any], key: list[str],
                    columns: list[str]) -> bool:
    """The S3 archive's latest version per flight against the oracle, each in its ``dt=`` folder."""
    began = time.monotonic()
    archive = read_archive(*targets.s3)
    out["elapsed_s"]["read_s3"] = round(time.monotonic() - began, 1)
    if not len(archive):
        out["archive"] = {"ok": False, "examples": ["the archive is empty"], "actual_rows": 0,
                          "expected_rows": int(len(expected))}
        return False
    latest = archive.sort_values("version").drop_duplicates(key, keep="last")
    archive_cmp = oracle.compare("archive", expected, latest, key, columns, alternatives=alternatives)
    out["archive"] = archive_cmp.as_dict()
    utc_dates = latest["time_hour"].dt.tz_convert("UTC").dt.strftime("%Y-%m-%d")
    misplaced = int((latest["dt"] != utc_dates).sum())
    out["archive"].update({
        "rows_archived": int(len(archive)),
        "dt_folders": int(latest["dt"].nunique()), "rows_in_wrong_dt_folder": misplaced,
        "expected_dt_folders": len(oracle.archive_partitions(expected)),
    })
    return archive_cmp.ok and misplaced == 0


def _verify_changes(changes: Sequence[Any], docs: Any, events_partitions: int, out: dict[str, Any],
                    key: list[str]) -> dict[str, bool]:
    """Each applied reference change switches cleanly in every partition (:func:`check_boundary_safe`).

    Returns:
        ``{"reference change: <label>": ok}`` per applied change.
    """
    from schemas import load_schema
    from schemas.serde import AvroSerializer

    serializer = AvroSerializer(load_schema("nycflights13/flight_key"))
    out["reference_changes"] = []
    results: dict[str, bool] = {}
    for change in changes:
        if change.applied_at is None:
            continue
        change.result = check_boundary_safe(change, docs, events_partitions, serializer, key)
        results[f"reference change: {change.label}"] = bool(change.result.get("boundary_ok", False))
        out["reference_changes"].append(change.as_dict())
    return results


def check_boundary_safe(change: Any, docs: Any, partitions: int, serializer: Any, key: list[str]) -> dict[str, Any]:
    """:func:`~threes.demo.changes.check_boundary`, or a failed result naming why it could not run."""
    from threes.demo.changes import check_boundary

    if not len(docs) or change.enriched_column not in docs:
        return {"boundary_ok": False, "problems": ["no enriched flights to check"]}
    return check_boundary(change, docs, partitions, serializer, key)
