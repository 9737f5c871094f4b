"""A snapshot's bootstrap under the job's Spark defaults against each default turned back, side by side.

Run: ``python benchmarks/bootstrap_settings.py`` (about 9 min at the default 2M keys).

On the local Spark standalone cluster (two workers, 1 core and 1 GB each), with
the children of :mod:`snapshot_scale` (one Spark driver per process, 1 GB): a
snapshot topic of ``THREES_BENCH_BOOT_KEYS`` (2M) keys and 100k events are
written once; then each run is a new application that bootstraps the
partitioned snapshot from the topic into a new checkpoint (a full bootstrap:
read, decode, shuffle, sort, write the version, its lookup files) and runs the
events.

Variants (``THREES_BENCH_BOOT_VARIANTS``, a JSON object of name -> ``stream.spark.conf``):

* ``default``: the job's own settings (no shuffle compression on one host,
  ``stream.spark.jit_inlining: lean``);
* ``shuffle_compressed``: ``spark.shuffle.compress`` and
  ``spark.shuffle.spill.compress`` back to Spark's ``true``;
* ``jvm_inlining``: ``-XX:MaxInlineLevel=15`` in the executors' options (an
  inlining flag of one's own replaces the lean set: HotSpot's limits).

Each variant first runs once uncounted (its executors record their own class
data sharing archive, whose key covers their options; the archives of options
other than the job's are removed at the end), then ``THREES_BENCH_BOOT_ROUNDS``
(2) rounds alternate the variants' order. Figures per run: the bootstrap's
seconds (readiness gate), the executors' task CPU per key (from the run's Spark
event log: the bootstrap's jobs) and the seconds to the end of the first
micro-batch; medians per variant, and ratios against ``default``
(``bootstrap_ratio_<name>``, ``cpu_ratio_<name>``: above 1 means the job's
default is the faster). Prints a table and ends with one JSON line.
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

KEYS = int(os.environ.get("THREES_BENCH_BOOT_KEYS", "2000000"))
EVENTS = 100_000
ROUNDS = int(os.environ.get("THREES_BENCH_BOOT_ROUNDS", "2"))
VARIANTS: dict[str, dict[str, str]] = json.loads(os.environ.get("THREES_BENCH_BOOT_VARIANTS", "null")) or {
    "default": {},
    "shuffle_compressed": {"spark.shuffle.compress": "true", "spark.shuffle.spill.compress": "true"},
    "jvm_inlining": {"spark.executor.extraJavaOptions": "-XX:MaxInlineLevel=15"},
}
FIGURES = ("bootstrap_s", "cpu_us_per_key", "first_batch_s")
log = logging.getLogger("bootstrap_settings")


def run_bootstraps(kafka: KafkaConfig) -> dict[str, Any]:
    """Write the topics, then every variant's bootstraps; returns the figures."""
    run_id = uuid.uuid4().hex[:8]
    base = {"bootstrap": kafka.bootstrap_servers, "master": scale.MASTER, "dlq": f"bench.boot.dlq.{run_id}"}
    snapshot, events = f"bench.boot.snap.{run_id}", f"bench.boot.events.{run_id}"
    scale.run_child({**base, "action": "write", "snapshots": [{"topic": snapshot, "keys": KEYS}],
                     "events": events, "n": EVENTS})
    tmp = Path(tempfile.mkdtemp(prefix="threes-boot-"))
    job = {**base, "action": "job", "snapshot": snapshot, "events": events}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    try:
        with scale.variant_archives_removed():
            for round_ in range(-1, ROUNDS):  # round -1: each variant's archive is recorded, not counted
                for name in names if round_ % 2 == 0 else reversed(names):
                    folder = tmp / f"{name}-{round_ + 1}"
                    args = {**job, "checkpoint": str(folder / "checkpoint"), "spark_conf": VARIANTS[name]}
                    result, _ = scale.run_child(args, event_log=None if round_ < 0 else folder / "eventlog")
                    if round_ < 0:
                        continue
                    boot = result["readiness"]
                    cpu_s = sum(j["task_cpu_s"] for j in scale.bootstrap_jobs(folder / "eventlog"))
                    runs[name].append({"bootstrap_s": boot["elapsed_s"], "cpu_us_per_key": cpu_s / boot["keys"] * 1e6,
                                       "first_batch_s": result["to_first_batch_s"]})
                    log.info("variant=%s round=%d %s", name, round_, runs[name][-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures: dict[str, Any] = {"keys": KEYS, "events": EVENTS, "rounds": ROUNDS, "variants": VARIANTS, "runs": runs}
    figures |= scale.variant_medians(runs, FIGURES, {"bootstrap_ratio": "bootstrap_s", "cpu_ratio": "cpu_us_per_key"})
    return figures


def main() -> None:
    f = scale.on_local_cluster(run_bootstraps)
    print(f"\nbootstrap_settings benchmark: {scale.MASTER}, {f['keys']:,} keys, {ROUNDS} rounds")
    print(f"  {'variant':<20}{'bootstrap s (runs)':>22}{'task CPU us/key':>20}{'to first batch s':>22}")
    for name in VARIANTS:
        cols = [", ".join(f"{r[w]:.1f}" for r in f["runs"][name]) for w in FIGURES]
        print(f"  {name:<20}{cols[0]:>22}{cols[1]:>20}{cols[2]:>22}")
    for name in list(VARIANTS)[1:]:
        print(f"  {name} / {next(iter(VARIANTS))}: bootstrap {f[f'bootstrap_ratio_{name}']:.2f}x, "
              f"task CPU {f[f'cpu_ratio_{name}']:.2f}x (medians)")
    print(json.dumps({"benchmark": "bootstrap_settings", **f}, default=float))


if __name__ == "__main__":
    scale.setup_logging()
    main()
