"""Sampled event -> sink latencies of a running demo pipeline.

Latency is measured on a sample of the events (every ``every``-th replayed
flight): the time from its produce call to the first poll that finds it in
a sink. For Elasticsearch that is the document (``mget`` of the sampled ids);
for S3 the archived row (the ``key`` column of each new object); for the
PostgreSQL ``route_stats`` row, the moment the row of its route and day
counts at least as many flights as had been replayed for that group when the
sampled one was. The resolution is the polling interval (about 1 s). The
sinks are read through a :class:`~threes.demo.monitor.ProgressProbe`'s clients.

A pipeline without the PostgreSQL sink (no ``route_stats``) is sampled on its other two sinks only.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from threes.demo.monitor import ProgressProbe


def doc_id(row: dict[str, Any], key: Sequence[str]) -> str:
    """The Elasticsearch ``_id`` of a flight (``ElasticsearchSink``: key fields joined by ``|``)."""
    return "|".join(str(row[k]) for k in key)


def key_id(row: dict[str, Any], key: Sequence[str]) -> str:
    """The archived ``key`` of a flight (``SinkRecord.key_id``: the key as sorted compact JSON)."""
    return json.dumps({k: row[k] for k in key}, sort_keys=True, default=str, separators=(",", ":"))


@dataclass
class Sample:
    """One sampled event and when each sink first showed it.

    Attributes:
        produced: ``time.time()`` of its produce call.
        doc_id: its Elasticsearch ``_id``.
        key_id: its archived key.
        group: its route_stats key.
        group_count: flights of that group replayed up to and including it.
        seen: sink -> ``time.time()`` it was first seen there.
    """

    produced: float
    doc_id: str
    key_id: str
    group: tuple[Any, ...]
    group_count: int
    seen: dict[str, float] = field(default_factory=dict)


class LatencySampler:
    """Sample replayed events and find them in the sinks (see the module docstring).

    Args:
        probe: the sinks' clients (its targets say which sinks are sampled; all of :attr:`SINKS`
            when ``None``).
        key: the flights' key fields.
        group_by: the route_stats key fields.
        every: sample one event in this many.
    """

    SINKS = ("elasticsearch", "postgres", "s3")

    def __init__(self, probe: ProgressProbe, key: Sequence[str], group_by: Sequence[str], every: int = 500):
        self.probe = probe
        self.key = list(key)
        self.group_by = list(group_by)
        self.every = max(1, every)
        self.sinks: tuple[str, ...] = self.SINKS if probe is None else probe.targets.sinks
        self.samples: list[Sample] = []
        self._groups: Counter[tuple[Any, ...]] = Counter()
        self._lock = threading.Lock()
        self._read_objects: set[str] = set()

    def on_produce(self, index: int, row: dict[str, Any]) -> None:
        """Replay hook: count the row's group, and sample it every ``every`` rows (cheap)."""
        group = tuple(row[g] for g in self.group_by)
        self._groups[group] += 1
        if index % self.every == 0:
            sample = Sample(time.time(), doc_id(row, self.key), key_id(row, self.key), group, self._groups[group])
            with self._lock:
                self.samples.append(sample)

    def _pending(self, sink: str) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if sink not in s.seen]

    def poll(self) -> None:
        """Look for the pending samples in each sink once (the archive as the probe last listed it)."""
        self._poll_es()
        self._poll_pg()
        self._poll_s3()

    def _poll_es(self) -> None:
        from elasticsearch import NotFoundError

        pending = self._pending("elasticsearch")[:2000]
        if not pending:
            return
        try:
            docs = self.probe._es.mget(index=self.probe.targets.es[1], ids=[s.doc_id for s in pending],
                                       source=False)["docs"]
        except NotFoundError:
            return
        now = time.time()
        found = {d["_id"] for d in docs if d.get("found")}
        for s in pending:
            if s.doc_id in found:
                s.seen["elasticsearch"] = now

    def _poll_pg(self) -> None:
        from sqlalchemy import select, tuple_

        if "postgres" not in self.sinks:
            return
        pending = self._pending("postgres")
        if not pending:
            return
        tbl = self.probe.pg_table()
        if tbl is None or self.probe._engine is None:
            return
        groups = sorted({s.group for s in pending})
        cols = [tbl.c[g] for g in self.group_by]
        counts: dict[tuple[Any, ...], int] = {}
        with self.probe._engine.connect() as db:
            for i in range(0, len(groups), 500):
                stmt = select(*cols, tbl.c.flights).where(tuple_(*cols).in_(groups[i:i + 500]))
                for row in db.execute(stmt):
                    counts[tuple(row[:-1])] = int(row[-1])
        now = time.time()
        for s in pending:
            if counts.get(s.group, 0) >= s.group_count:
                s.seen["postgres"] = now

    def _poll_s3(self) -> None:
        from threes.demo.sinks import read_parquet_objects

        pending = self._pending("s3")
        if not pending:
            return
        new = [k for k in self.probe.s3_keys() if k.endswith(".parquet") and k not in self._read_objects]
        if not new:
            return
        conn, bucket, _ = self.probe.targets.s3
        table = read_parquet_objects(conn, bucket, new, columns=["key"], client=self.probe._s3)
        self._read_objects.update(new)
        now = time.time()
        archived = set(table.column("key").to_pylist()) if table is not None else set()
        for s in pending:
            if s.key_id in archived:
                s.seen["s3"] = now

    def latencies(self) -> dict[str, dict[str, float | int | None]]:
        """Per sink the pipeline has: samples seen, p50 and p99 latency in seconds (``None`` without samples)."""
        import numpy as np

        out: dict[str, dict[str, float | int | None]] = {}
        with self._lock:
            samples = list(self.samples)
        for sink in self.sinks:
            values = np.array([s.seen[sink] - s.produced for s in samples if sink in s.seen])
            out[sink] = {
                "samples": int(len(values)),
                "of": len(samples),
                "p50_s": round(float(np.percentile(values, 50)), 2) if len(values) else None,
                "p99_s": round(float(np.percentile(values, 99)), 2) if len(values) else None,
            }
        return out
