"""The executors' garbage collector: the job's default (``executor_gc: auto``) against the JVM's G1, side by side.

Run: ``python benchmarks/executor_gc.py`` (about 10 min at the default 10M keys;
``THREES_BENCH_SCALE_KEYS=1000000`` for a check in ~3 min).

On the local Spark standalone cluster (two workers, 1 core and 1 GB each), with
the children of :mod:`snapshot_scale` (one Spark driver per process, 1 GB):
the snapshot topic of ``THREES_BENCH_SCALE_KEYS`` keys and
``THREES_BENCH_SCALE_EVENTS`` events are written once, then the job runs
``THREES_BENCH_GC_PAIRS`` (2) pairs of new applications, each from an empty
checkpoint (a full bootstrap, then every event), alternating which collector
goes first: ``executor_gc: g1`` (the JVM's own default, the baseline) and
``executor_gc: auto`` (the parallel collector on these 1 GB executors).

Figures per collector: the bootstrap's seconds (readiness gate) and the job's
events/s after it, each run's and their medians; ratios
``bootstrap_ratio_auto_vs_g1`` (seconds: lower is better) and
``events_ratio_auto_vs_g1`` (events/s: higher is better). Prints a table and
ends with one JSON line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import snapshot_scale as scale

from kernel.config.models import KafkaConfig

PAIRS = int(os.environ.get("THREES_BENCH_GC_PAIRS", "2"))
COLLECTORS = ("g1", "auto")
log = logging.getLogger("executor_gc")


def run_pairs(kafka: KafkaConfig) -> dict[str, Any]:
    """Write the topics once, then the pairs of runs; returns the figures."""
    run_id = uuid.uuid4().hex[:8]
    base = {"bootstrap": kafka.bootstrap_servers, "master": scale.MASTER, "dlq": f"bench.gc.dlq.{run_id}"}
    snapshot, events = f"bench.gc.snap.{run_id}", f"bench.gc.events.{run_id}"
    scale.run_child({**base, "action": "write", "snapshots": [{"topic": snapshot, "keys": scale.SCALE_KEYS}],
                     "events": events, "n": scale.SCALE_EVENTS})
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in COLLECTORS}
    tmp = Path(tempfile.mkdtemp(prefix="threes-gc-"))
    try:
        for pair in range(PAIRS):
            for collector in COLLECTORS if pair % 2 == 0 else reversed(COLLECTORS):
                checkpoint = tmp / f"{collector}-{pair}" / "checkpoint"
                result, _ = scale.run_child({**base, "action": "job", "snapshot": snapshot, "events": events,
                                             "checkpoint": str(checkpoint), "executor_gc": collector})
                runs[collector].append({"bootstrap_s": result["readiness"]["elapsed_s"],
                                        "events_per_s": result["events_per_s"]})
                log.info("executor_gc=%s pair=%d %s", collector, pair, runs[collector][-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures: dict[str, Any] = {"keys": scale.SCALE_KEYS, "events": scale.SCALE_EVENTS, "pairs": PAIRS, "runs": runs}
    for collector in COLLECTORS:
        for what in ("bootstrap_s", "events_per_s"):
            figures[f"{collector}_{what}"] = statistics.median(r[what] for r in runs[collector])
    figures["bootstrap_ratio_auto_vs_g1"] = figures["auto_bootstrap_s"] / figures["g1_bootstrap_s"]
    figures["events_ratio_auto_vs_g1"] = figures["auto_events_per_s"] / figures["g1_events_per_s"]
    return figures


def main() -> None:
    f = scale.on_local_cluster(run_pairs)
    print(f"\nexecutor_gc benchmark: {scale.MASTER}, {f['keys']:,} keys, {f['events']:,} events, {PAIRS} pairs")
    print(f"  {'collector':<10}{'bootstrap s (runs)':>34}{'events/s (runs)':>34}")
    for c in COLLECTORS:
        boots = ", ".join(f"{r['bootstrap_s']:.1f}" for r in f["runs"][c])
        rates = ", ".join(f"{r['events_per_s']:,.0f}" for r in f["runs"][c])
        print(f"  {c:<10}{boots:>34}{rates:>34}")
    print(f"  auto / g1: bootstrap time {f['bootstrap_ratio_auto_vs_g1']:.2f}x, "
          f"events/s {f['events_ratio_auto_vs_g1']:.2f}x (medians)")
    print(json.dumps({"benchmark": "executor_gc", **f}, default=float))


if __name__ == "__main__":
    scale.setup_logging()
    main()
