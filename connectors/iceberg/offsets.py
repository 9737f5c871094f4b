"""The Kafka offsets an Iceberg table holds: recorded in its snapshots' summaries, as Kafka Connect's sink does.

Each commit of the sink sets the snapshot summary property ``threes.kafka.offsets.<sink name>``
to a JSON object ``{"<topic>": {"<partition>": <last offset written>}}`` that carries every
partition the sink ever wrote (the previous snapshot's map, updated by the batch). The table
is therefore the source of truth of what it holds: a record at or below its partition's offset
there is already in the table and is skipped, whatever the consumer group's committed offset says.
"""

from __future__ import annotations

import json
from typing import Any

OffsetMap = dict[str, dict[str, int]]


def offsets_property(sink_name: str) -> str:
    """The snapshot summary property of a sink's offsets."""
    return f"threes.kafka.offsets.{sink_name}"


def recorded_offsets(table: Any, prop: str) -> OffsetMap:
    """The offsets recorded by the newest snapshot (of the main branch's ancestry) that has ``prop``.

    Snapshots made by others (a compaction, a Spark job) carry no offsets: their ancestors are
    searched, newest first, as Kafka Connect's Iceberg sink does.

    Returns:
        ``{topic: {partition (as text): last offset in the table}}``; empty for a new table.
    """
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary
        text = summary.additional_properties.get(prop) if summary is not None else None
        if text is not None:
            raw = json.loads(text)
            return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return {}


def offset_of(offsets: OffsetMap, topic: str, partition: int) -> int:
    """The last offset of a partition in the table; -1 when none."""
    return offsets.get(topic, {}).get(str(partition), -1)


def with_offset(offsets: OffsetMap, topic: str, partition: int, last_offset: int) -> str:
    """The property's new JSON value: ``offsets`` with the partition moved up to ``last_offset``."""
    merged = {t: dict(parts) for t, parts in offsets.items()}
    parts = merged.setdefault(topic, {})
    parts[str(partition)] = max(parts.get(str(partition), -1), last_offset)
    return json.dumps(merged, sort_keys=True, separators=(",", ":"))


def without_rebase(table: Any) -> Any:
    """``table`` with pyiceberg's own commit retries off, in this process's copy of its metadata only.

    pyiceberg 0.12 retries a commit another writer overtook by rebasing the new snapshots onto
    the winner's (``commit.retry.num-retries``, default 4), without asking the caller: a batch
    would then be appended on top of a snapshot whose offsets already cover it. The sink (and
    the maintenance commands) instead get the ``CommitFailedException``, refresh, check the
    offsets again and decide anew. The table's stored properties, which other engines read,
    are left as they are.

    Returns:
        ``table`` (its metadata changed in place; a ``refresh`` undoes it).
    """
    table.metadata.properties["commit.retry.num-retries"] = "0"
    return table
