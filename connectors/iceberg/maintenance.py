"""Maintenance of the sink's Iceberg tables: expire old snapshots, compact small data files.

Streaming commits make a snapshot and a few small data files per batch. Both operations
commit optimistically like the sink (a commit another writer overtook is refreshed and
made again), and keep the Kafka offsets the sink resumes from
(:mod:`connectors.iceberg.offsets`):

* :func:`expire` never expires the newest snapshot that carries a sink's offsets;
* :func:`compact` copies every sink's offsets into the snapshot it makes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from connectors.iceberg.offsets import without_rebase

log = logging.getLogger(__name__)

OFFSETS_PREFIX = "threes.kafka.offsets."


@dataclass(frozen=True)
class MaintenanceResult:
    """What an operation did to one table: snapshots or data files before and after."""

    table: str
    before: int
    after: int
    detail: str


def offset_holders(table: Any) -> dict[str, Any]:
    """Per offsets property (one per sink), the newest snapshot of the main branch's ancestry carrying it.

    Returns:
        ``{property: Snapshot}``.
    """
    found: dict[str, Any] = {}
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        for key in props:
            if key.startswith(OFFSETS_PREFIX) and key not in found:
                found[key] = snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return found


def _retrying(attempts: int) -> Retrying:
    from pyiceberg.exceptions import CommitFailedException

    return Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.1, max=5.0),
        retry=retry_if_exception_type(CommitFailedException),
        reraise=True,
    )


def expire(table: Any, older_than_s: float, retain_last: int, attempts: int = 10) -> MaintenanceResult:
    """Expire the snapshots older than ``older_than_s`` seconds, keeping the newest ``retain_last``.

    Uses pyiceberg's ``expire_snapshots().by_ids(...)`` (snapshot metadata only: pyiceberg 0.12
    deletes no data file; files no snapshot references any more are left to an orphan-file
    clean-up, such as Spark's ``remove_orphan_files`` procedure). The current snapshot, branch
    and tag heads, and each sink's newest offsets snapshot are kept.

    Returns:
        Snapshots before and after.
    """
    for attempt in _retrying(attempts):
        with attempt:
            table.refresh()
            snapshots = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
            cutoff_ms = int((datetime.now(UTC) - timedelta(seconds=older_than_s)).timestamp() * 1000)
            keep = {s.snapshot_id for s in snapshots[-retain_last:]} if retain_last > 0 else set()
            keep |= {s.snapshot_id for s in offset_holders(table).values()}
            current = table.current_snapshot()
            if current is not None:
                keep.add(current.snapshot_id)
            doomed = [s.snapshot_id for s in snapshots if s.timestamp_ms < cutoff_ms and s.snapshot_id not in keep]
            if doomed:
                table.maintenance.expire_snapshots().by_ids(doomed).commit()
    table.refresh()
    after = len(table.snapshots())
    return MaintenanceResult(str(table.name()), len(snapshots), after, f"expired {len(snapshots) - after} snapshot(s)")


def data_files(table: Any) -> int:
    """Number of data files of the current snapshot."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.additional_properties.get("total-data-files", 0))


def compact(table: Any, min_files: int = 2, attempts: int = 10) -> MaintenanceResult:
    """Rewrite the table's data files into as few as the table's target file size allows.

    pyiceberg 0.12 has no ``rewrite_data_files`` action: this reads the current snapshot whole
    (into memory, through pyarrow) and overwrites the table with it in one transaction, every
    sink's offsets copied into the new snapshot. It suits tables of up to a few GB; for bigger
    ones use Spark's ``CALL <catalog>.system.rewrite_data_files('<table>')`` on the same catalog.
    A streaming commit made meanwhile makes this commit fail; it is then made again from the new
    snapshot (up to ``attempts`` times).

    Returns:
        Data files before and after.
    """
    from pyiceberg.expressions import AlwaysTrue

    before = data_files(table)
    for attempt in _retrying(attempts):
        with attempt:
            table.refresh()
            before = data_files(table)
            if before < min_files:
                return MaintenanceResult(str(table.name()), before, before, "nothing to compact")
            props = {k: s.summary.additional_properties[k] for k, s in offset_holders(table).items()}
            snapshot_id = table.current_snapshot().snapshot_id
            rows = table.scan(snapshot_id=snapshot_id).to_arrow()
            with without_rebase(table).transaction() as tx:  # a streaming commit meanwhile: read again
                tx.overwrite(rows, overwrite_filter=AlwaysTrue(), snapshot_properties=props)
    table.refresh()
    after = data_files(table)
    log.info("compacted %s: %d data files -> %d", table.name(), before, after)
    return MaintenanceResult(str(table.name()), before, after, f"{before} data file(s) rewritten into {after}")


def describe_offsets(table: Any) -> str:
    """The sinks' offsets the table holds, as JSON (for messages)."""
    return json.dumps(
        {
            k.removeprefix(OFFSETS_PREFIX): json.loads(s.summary.additional_properties[k])
            for k, s in offset_holders(table).items()
        },
        sort_keys=True,
    )
