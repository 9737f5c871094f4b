"""Reference changes made while flights stream, and how long they take to show.

The demo renames one airline in the S3 object the ``airlines`` source reads
and one airport in the PostgreSQL table the ``airports`` source reads, each at
a point of the replay (a fraction of the flights). There the replay pauses
while the change is written and until its source has put it in the compacted
state topic, so every flight after the point is enriched with the new value.
With ``exact`` the replay also waits, before the change, until every flight
replayed so far is enriched: the flights before the point then carry the old
value whatever the speeds (the end-to-end test's mode; it costs the pipeline
small micro-batches, so the demo's timed run does not use it).
Each change is timed: written to its system of record, in the state topic,
in the first enriched flight in the Elasticsearch index. Afterwards
:func:`check_boundary` verifies "later flights carry the new value" exactly:
the stream job refreshes its snapshot between micro-batches, so in each
partition of the events topic every affected flight before some offset has
the old value and every one from there on the new value.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from threes.demo.data import TABLES

log = logging.getLogger(__name__)


@dataclass
class ReferenceChange:
    """One change of a reference value.

    Attributes:
        label: for people, e.g. ``airline UA renamed (S3 object)``.
        table: the reference table (``airlines``).
        key: the changed row's key, e.g. ``{"carrier": "UA"}``.
        column: the changed column (``name``).
        new_value: its new value.
        flight_field: the flight field that selects the affected flights (``carrier``).
        enriched_column: the enriched field that carries the value (``airline_name``).
        at_fraction: apply after this fraction of the flights was replayed (and enriched).
        old_value: the value before (set when applied).
        applied_at: ``time.time()`` when the system of record held the change.
        state_at: when the source had written it to the state topic.
        sink_at: when the first flight carrying it was in the Elasticsearch index.
    """

    label: str
    table: str
    key: dict[str, Any]
    column: str
    new_value: str
    flight_field: str
    enriched_column: str
    at_fraction: float
    old_value: Any = None
    applied_at: float | None = None
    state_at: float | None = None
    sink_at: float | None = None
    result: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (seconds from the change)."""
        def since(t: float | None) -> float | None:
            return round(t - self.applied_at, 2) if t is not None and self.applied_at is not None else None

        return {
            "change": self.label, "old": self.old_value, "new": self.new_value,
            "to_state_topic_s": since(self.state_at), "to_elasticsearch_s": since(self.sink_at), **self.result,
        }


def default_changes() -> list[ReferenceChange]:
    """The demo's two changes: United's name (S3) at 25 % of the flights, O'Hare's name (PostgreSQL) at 40 %."""
    return [
        ReferenceChange("airline UA renamed in its S3 object", "airlines", {"carrier": "UA"}, "name",
                        "United Airlines (renamed by threes demo)", "carrier", "airline_name", 0.25),
        ReferenceChange("airport ORD renamed in PostgreSQL", "airports", {"faa": "ORD"}, "name",
                        "Chicago O'Hare International (renamed by threes demo)", "dest", "dest_name", 0.40),
    ]


class ChangeDriver:
    """Apply the changes at their time and watch them travel (call :meth:`poll` about once a second).

    Args:
        pipeline: the validated pipeline (its sources say where each table lives).
        probe: a :class:`~threes.demo.monitor.ProgressProbe` (Elasticsearch counts).
        changes: the changes, in order.
        total: how many flights the run replays (for ``at_fraction``).
        references: table -> the DataFrame currently loaded (changed in place, cumulatively).
        exact: before a change, wait until everything replayed is enriched (see the module docstring).
    """

    def __init__(self, pipeline: Any, probe: Any, changes: list[ReferenceChange], total: int,
                 references: dict[str, Any], exact: bool = False):
        self.pipeline = pipeline
        self.exact = exact
        self.probe = probe
        self.changes = changes
        self.total = total
        self.references = references
        self._deserializer: Any = None
        self._points = {max(1, int(c.at_fraction * total)): c for c in changes}
        self._due: ReferenceChange | None = None
        self._resume = threading.Event()
        self.paused_s = 0.0

    def gate(self, index: int, _row: Any = None, timeout_s: float = 600.0) -> None:
        """Replay hook (its thread): at a change point, pause until :meth:`poll` has made the change.

        Args:
            index: the row just produced (0-based).
            timeout_s: resume anyway after this long (the watching loop reports what is missing).
        """
        change = self._points.get(index + 1)
        if change is None or change.applied_at is not None:
            return
        began = time.monotonic()
        self._resume.clear()
        self._due = change
        self._resume.wait(timeout_s)
        self._due = None
        self.paused_s += time.monotonic() - began

    def _apply(self, change: ReferenceChange) -> None:
        import pandas as pd

        from threes.demo.reference import load_reference

        frame = self.references[change.table]
        mask = pd.Series(True, index=frame.index)
        for column, value in change.key.items():
            mask = mask & (frame[column] == value)
        if int(mask.sum()) != 1:
            raise ValueError(f"{change.label}: {change.key} matches {int(mask.sum())} rows of {change.table}")
        change.old_value = frame.loc[mask, change.column].iloc[0]
        frame.loc[mask, change.column] = change.new_value
        load_reference(self.pipeline, [change.table], frames={change.table: frame})
        change.applied_at = time.time()
        log.info("reference change applied: %s (%r -> %r)", change.label, change.old_value, change.new_value)

    def _state_value(self, change: ReferenceChange) -> Any:
        from kernel.kafka.topics import read_latest_per_key
        from schemas.serde import AvroDeserializer
        from schemas.store import SchemaStore
        from threes.demo.reference import source_for

        conf = self.pipeline.kafka.librdkafka_config()
        if self._deserializer is None:
            self._deserializer = AvroDeserializer(SchemaStore(conf, self.pipeline.kafka.schema_topic))
        topic = source_for(self.pipeline, change.table).topic
        for raw_key, raw_value in read_latest_per_key(conf, topic).items():
            key = self._deserializer(raw_key)
            if all(key.get(k) == v for k, v in change.key.items()):
                return self._deserializer(raw_value).get(change.column)
        return None

    def poll(self, replayed: int, enriched: int) -> None:
        """Make the due change, release the replay, time the changes (about once a second).

        The due change is made at once (``exact``: once everything replayed is
        enriched); the replay goes on once the change is in its state topic.

        Args:
            replayed: flights handed to the producer so far.
            enriched: records in the enriched topic.
        """
        due = self._due
        if due is not None and due.applied_at is None and (enriched >= replayed or not self.exact):
            self._apply(due)
        for change in self.changes:
            if change.applied_at is None:
                continue
            if change.state_at is None and self._state_value(change) == change.new_value:
                change.state_at = time.time()
            if change.sink_at is None and self.probe.es_count({"term": {change.enriched_column: change.new_value}}):
                change.sink_at = time.time()
        if due is not None and due.state_at is not None:
            self._resume.set()

    def pending(self) -> bool:
        """Whether a change has not been applied yet or not yet shown in Elasticsearch."""
        return any(c.applied_at is None or c.sink_at is None for c in self.changes)


def check_boundary(change: ReferenceChange, docs: Any, partitions: int, key_serializer: Any,
                   key_fields: list[str]) -> dict[str, Any]:
    """Verify that, per events partition, the flights with the new value all come after those with the old.

    Args:
        change: an applied change.
        docs: the flights index as read back (``_version`` = the flight event's offset).
        partitions: partitions of the events topic.
        key_serializer: the flights' key serializer (the partition is computed from the key bytes).
        key_fields: the flight key fields.

    Returns:
        ``{"flights_affected", "flights_with_new_value", "flights_with_old_value", "boundary_ok", "problems"}``.
    """
    from threes.demo.replay import partition_for

    affected = docs[docs[change.flight_field] == change.key[next(iter(change.key))]]
    values = affected[change.enriched_column]
    new = values == change.new_value
    old = values == change.old_value
    problems: list[str] = []
    if int((~(new | old)).sum()):
        problems.append(f"{int((~(new | old)).sum())} flight(s) carry neither the old nor the new value")
    types = {f["name"]: f["type"] for f in key_serializer.schema["fields"]}
    parts = [partition_for(key_serializer({k: int(r[k]) if types[k] in ("int", "long") else str(r[k])
                                           for k in key_fields}), partitions)
             for r in affected[key_fields].to_dict("records")]
    frame = affected.assign(_partition=parts, _new=new.to_numpy())
    for part, group in frame.groupby("_partition"):
        offsets_new = group.loc[group["_new"], "_version"]
        offsets_old = group.loc[~group["_new"], "_version"]
        if len(offsets_new) and len(offsets_old) and offsets_old.max() > offsets_new.min():
            problems.append(f"partition {part}: old value at offset {offsets_old.max()} after the new value at "
                            f"offset {offsets_new.min()}")
    return {
        "flights_affected": int(len(affected)),
        "flights_with_new_value": int(new.sum()),
        "flights_with_old_value": int(old.sum()),
        "boundary_ok": not problems and int(new.sum()) > 0,
        "problems": problems[:5],
    }


def expected_rows(table: str) -> int:
    """How many keys a reference table's state topic holds once its source has caught up."""
    return TABLES[table].rows
