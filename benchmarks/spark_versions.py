"""Spark 4.0 against Spark 4.2, side by side in one run: the stream job's figures on both (issue #42).

Run: ``python benchmarks/spark_versions.py`` (Kafka from the local stack, as ``stream_join.py``).

The project pins ``pyspark==4.2.0``. This benchmark runs ``benchmarks/stream_join.py`` as a child
process once with that pyspark and once with an earlier one (``THREES_BENCH_SPARK_OLD``, default
4.0.0, the project's Spark before 4.2), alternating ``THREES_BENCH_SPARK_ROUNDS`` times (default 2:
old, new, old, new), so both see the same machine at about the same time. The earlier pyspark is
installed once with pip into ``.threes/bench-pyspark-<version>`` (the package alone: py4j and the
rest come from the project's virtualenv) and put first on the child's ``PYTHONPATH``; the job then
resolves the Kafka and Avro connectors of that version (``stream_app.session.SPARK_VERSION`` is the
installed pyspark's), into ``.threes/spark-jars-<version>``.

Each child runs ``stream_join``'s parts ``THREES_BENCH_SPARK_PARTS`` (default
``throughput,latency20k,bootstrap``) with one round each and part 1's configurations
``THREES_BENCH_SPARK_RUNS`` (default ``no_join,job_10k,job_1m``): enriched events/s of the job
without a join, with a 10k-key and a 1M-key snapshot; p50/p99 event -> enriched latency at
20,000 events/s in micro-batch mode; snapshot bootstrap keys/s at 100k and 1M keys and the
refresh of 1k updates into the 1M-key snapshot. A figure of a version is the median of its rounds.

Ratios are the speed-up of the new Spark over the old one, so above 1 means 4.2 is better:
events/s and keys/s new / old; latencies (``latency_*``, the refresh included) old / new.
Printed as a table, then one JSON line (``results.py record spark_versions``).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results import last_json_line

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("spark_versions")

OLD = os.environ.get("THREES_BENCH_SPARK_OLD", "4.0.0")
ROUNDS = max(1, int(os.environ.get("THREES_BENCH_SPARK_ROUNDS", "2")))
PARTS = os.environ.get("THREES_BENCH_SPARK_PARTS", "throughput,latency20k,bootstrap")
RUNS = os.environ.get("THREES_BENCH_SPARK_RUNS", "no_join,job_10k,job_1m")
THROUGHPUT = [r for r in RUNS.split(",") if r]
LATENCY = ("latency_p50_ms_microbatch_20k", "latency_p99_ms_microbatch_20k")
BOOTSTRAP = ("bootstrap_100k", "bootstrap_1m")


def old_pyspark(version: str = OLD) -> Path:
    """The folder holding pyspark ``version`` alone, installed with pip on first use."""
    target = ROOT / ".threes" / f"bench-pyspark-{version}"
    if not (target / "pyspark" / "__init__.py").is_file():
        log.info("installing pyspark==%s into %s (once)", version, target)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), f"pyspark=={version}"],
            check=True,
        )
    return target


def run_child(pyspark_dir: Path | None) -> dict[str, Any]:
    """One ``stream_join`` run; ``pyspark_dir`` first on the path (``None``: the project's pyspark)."""
    env = dict(os.environ)
    env.update({"THREES_BENCH_PARTS": PARTS, "THREES_BENCH_ROUNDS": "1", "THREES_BENCH_THROUGHPUT_RUNS": RUNS})
    paths = [str(pyspark_dir)] if pyspark_dir is not None else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    version = subprocess.run(
        [sys.executable, "-c", "import pyspark; print(pyspark.__version__)"], env=env, check=True,
        capture_output=True, text=True,
    ).stdout.strip()
    log.info("stream_join with pyspark %s", version)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stream_join.py")], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"stream_join with pyspark {version} failed:\n{done.stderr[-3000:]}")
    figures = last_json_line(done.stdout)
    figures["pyspark"] = version
    figures["wall_s"] = round(time.monotonic() - started, 1)
    return figures


def figures_of(run: dict[str, Any]) -> dict[str, float]:
    """The compared figures of one run: events/s per configuration, latency p50/p99 (ms), snapshot keys/s."""
    out = {f"events_per_s_{name}": float(run[name]["events_per_s"]) for name in THROUGHPUT if name in run}
    out.update({name: float(run[name]) for name in LATENCY if name in run})
    out.update({f"{name}_keys_per_s": float(run[name]["keys_per_s"]) for name in BOOTSTRAP if name in run})
    if "refresh_1k_of_1m" in run:  # seconds: lower is better, like the latencies
        out["latency_refresh_1k_of_1m_ms"] = round(float(run["refresh_1k_of_1m"]["refresh_s"]) * 1000, 1)
    return out


def main() -> None:
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    old_dir = old_pyspark()
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for round_ in range(ROUNDS):
        for side, path in (("old", old_dir), ("new", None)):
            log.info("round %d: %s Spark", round_ + 1, side)
            runs[side].append(run_child(path))
    versions = {side: runs[side][0]["pyspark"] for side in runs}
    medians = {side: {} for side in runs}
    for side, side_runs in runs.items():
        per_run = [figures_of(r) for r in side_runs]
        for name in per_run[0]:
            medians[side][name] = statistics.median(f[name] for f in per_run if name in f)
    ratios = {}
    for name, new in medians["new"].items():
        old = medians["old"].get(name)
        if old is None or not old or not new:
            continue
        ratios[name] = round(old / new if name.startswith("latency") else new / old, 3)
    print(f"\nspark_versions: pyspark {versions['old']} vs {versions['new']}, {ROUNDS} rounds each, alternating "
          f"(median of the rounds); ratio > 1: {versions['new']} is better")
    width = max(len(n) for n in medians["new"])
    print(f"  {'figure':<{width}}  {versions['old']:>12}  {versions['new']:>12}  ratio")
    for name in medians["new"]:
        print(f"  {name:<{width}}  {medians['old'].get(name, float('nan')):>12,.1f}  "
              f"{medians['new'][name]:>12,.1f}  {ratios.get(name, float('nan')):.2f}")
    print(json.dumps({
        "benchmark": "spark_versions",
        "old": versions["old"],
        "new": versions["new"],
        "rounds": ROUNDS,
        "parts": PARTS,
        "median_old": medians["old"],
        "median_new": medians["new"],
        **{f"speedup_spark_{versions['new']}_vs_{versions['old']}_{name}": r for name, r in ratios.items()},
        "runs": {side: [figures_of(r) | {"wall_s": r["wall_s"]} for r in rs] for side, rs in runs.items()},
    }))


if __name__ == "__main__":
    main()
