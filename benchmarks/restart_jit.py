"""A restart's cold executors: their JIT compilers' options side by side.

Run: ``python benchmarks/restart_jit.py`` (about 10 min at the default 1M keys).

On the local Spark standalone cluster (two workers, 1 core and 1 GB each), with
the children of :mod:`snapshot_scale` (one Spark driver per process, 1 GB): a
snapshot topic of ``THREES_BENCH_JIT_KEYS`` (1M) keys and
``THREES_BENCH_SCALE_EVENTS`` (500k) events are written once, the job
bootstraps the partitioned snapshot once (a version in its checkpoint), 1k keys
are updated, and then the job is restarted from that checkpoint again and
again (events re-read from the start, the snapshot from its version plus the
1k-record tail), each restart a new application whose executors are new JVMs.

Variants (``THREES_BENCH_JIT_VARIANTS``, a JSON object of name ->
``spark.executor.extraJavaOptions``): ``default`` (none: the job's defaults, the
JVM's tiered compilation with ``stream.spark.jit_inlining: lean``),
``jvm_inlining`` (``-XX:MaxInlineLevel=15``: an inlining flag of one's own
replaces the lean set, so HotSpot's inlining limits), ``threshold_x3``
(``-XX:CompileThresholdScaling=3``: methods compile after three times as many
calls and loops) and ``c1_only``
(``-XX:TieredStopAtLevel=1``: the quick compiler alone). Each variant first runs one
restart that is not counted (its executors record the classes of its own class
data sharing archive, whose key covers the options; the next child waits for the
dump), then ``THREES_BENCH_JIT_ROUNDS`` (2) rounds alternate the variants' order. The
archives the other variants recorded (~130 MB each) are removed at the end.

Figures per variant, each run's and the median: restart to the end of the first
micro-batch (s), the readiness gate's share of it (s), the first micro-batch
alone (s), and the job's steady events/s after it; ratios against ``default``
(``restart_ratio_<name>``: lower is better; ``events_ratio_<name>``: higher is
better). A restart's executor CPU goes mostly to the JIT compilers (an
async-profiler CPU profile of this restart: see ``docs/operations.md``, "The
executors' JIT compilers"); this shows what their options buy and cost. Prints a
table and ends with one JSON line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import snapshot_scale as scale

from kernel.config.models import KafkaConfig

KEYS = int(os.environ.get("THREES_BENCH_JIT_KEYS", "1000000"))
ROUNDS = int(os.environ.get("THREES_BENCH_JIT_ROUNDS", "2"))
VARIANTS: dict[str, str] = json.loads(os.environ.get("THREES_BENCH_JIT_VARIANTS", "null")) or {
    "default": "",
    "jvm_inlining": "-XX:MaxInlineLevel=15",
    "threshold_x3": "-XX:CompileThresholdScaling=3",
    "c1_only": "-XX:TieredStopAtLevel=1",
}
FIGURES = ("restart_s", "gate_s", "first_batch_s", "events_per_s")
log = logging.getLogger("restart_jit")


def run_restarts(kafka: KafkaConfig) -> dict[str, Any]:
    """Write the topics, bootstrap once, then the restarts of every variant; returns the figures."""
    run_id = uuid.uuid4().hex[:8]
    base = {"bootstrap": kafka.bootstrap_servers, "master": scale.MASTER, "dlq": f"bench.jit.dlq.{run_id}"}
    snapshot, events = f"bench.jit.snap.{run_id}", f"bench.jit.events.{run_id}"
    scale.run_child({**base, "action": "write", "snapshots": [{"topic": snapshot, "keys": KEYS}],
                     "events": events, "n": scale.SCALE_EVENTS})
    tmp = Path(tempfile.mkdtemp(prefix="threes-jit-"))
    job = {**base, "action": "job", "snapshot": snapshot, "events": events, "checkpoint": str(tmp / "checkpoint")}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    try:
        boot, _ = scale.run_child(job)
        log.info("bootstrap of %d keys to the first micro-batch: %.1f s", KEYS, boot["to_first_batch_s"])
        tail = [{"topic": snapshot, "keys": scale.UPDATES, "start": 0, "name": "renamed %d", "stride": scale.STRIDE}]
        scale.run_child({**base, "action": "write", "snapshots": tail})
        names = list(VARIANTS)
        with scale.variant_archives_removed():  # the job's own archives stay, the variants' go
            for round_ in range(-1, ROUNDS):  # round -1: each variant's archive is recorded, not counted
                for name in names if round_ % 2 == 0 else reversed(names):
                    result, _ = scale.run_child({**job, "executor_java_options": VARIANTS[name]})
                    if round_ < 0:
                        continue
                    runs[name].append({"restart_s": result["to_first_batch_s"],
                                       "gate_s": result["readiness"]["elapsed_s"],
                                       "first_batch_s": result["first_batch_s"],
                                       "events_per_s": result["steady_events_per_s"]})
                    log.info("variant=%s round=%d %s", name, round_, runs[name][-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures: dict[str, Any] = {"keys": KEYS, "events": scale.SCALE_EVENTS, "rounds": ROUNDS,
                               "bootstrap_to_first_batch_s": boot["to_first_batch_s"],
                               "variants": VARIANTS, "runs": runs}
    figures |= scale.variant_medians(runs, FIGURES, {"restart_ratio": "restart_s", "events_ratio": "events_per_s"})
    return figures


def main() -> None:
    f = scale.on_local_cluster(run_restarts)
    print(f"\nrestart_jit benchmark: {scale.MASTER}, {f['keys']:,} keys, {f['events']:,} events, {ROUNDS} rounds; "
          f"bootstrap to first micro-batch {f['bootstrap_to_first_batch_s']:.1f} s")
    print(f"  {'variant':<14}{'restart s (runs)':>22}{'gate s':>16}{'first batch s':>18}{'steady events/s':>24}")
    for name in VARIANTS:
        cols = [", ".join(f"{r[w]:.1f}" for r in f["runs"][name]) for w in FIGURES[:3]]
        rates = ", ".join(f"{r['events_per_s']:,.0f}" for r in f["runs"][name])
        print(f"  {name:<14}{cols[0]:>22}{cols[1]:>16}{cols[2]:>18}{rates:>24}")
    for name in list(VARIANTS)[1:]:
        print(f"  {name} / {next(iter(VARIANTS))}: restart {f[f'restart_ratio_{name}']:.2f}x, "
              f"steady events/s {f[f'events_ratio_{name}']:.2f}x (medians)")
    print(json.dumps({"benchmark": "restart_jit", **f}, default=float))


if __name__ == "__main__":
    scale.setup_logging()
    main()
