"""A driver's start with and without class data sharing (``stream_app.class_data_sharing``).

Run: ``python benchmarks/driver_start.py`` (Spark only; no other service).

Side by side on the same machine, each measurement a new Python process (a new
driver JVM), in a cache folder of its own (``THREES_CACHE_DIR``, a temporary
folder): one training run first (it writes the archive when it exits; its
exit is timed too), then ``THREES_BENCH_ROUNDS`` (3) rounds alternating
``off`` (``class_data_sharing: false``) and ``on`` (the archive mapped).
Each child builds a ``local[2]`` SparkSession with the stack's jars as
``threes stream run`` does, runs one small aggregation (its first query), and
stops.

Prints a table and one JSON line: ``off_session_s``, ``on_session_s``,
``ratio_session_off_vs_on``, ``off_first_query_s``, ``on_first_query_s``,
``ratio_first_query_off_vs_on``, ``off_process_s``, ``on_process_s``,
``ratio_process_off_vs_on`` (medians), ``training_process_s`` and ``archive_mb``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "3"))


def child(sharing: bool) -> dict[str, Any]:
    """One driver: seconds to a session, then to the end of its first query; whether the archive is mapped."""
    started = time.monotonic()
    from pyspark import SparkContext

    from stream_app.session import spark_session
    from stream_app.spark_settings import SparkSettings
    from threes.local import LocalStack

    spark = spark_session(
        SparkSettings(master="local[2]", app_name="threes-bench-driver-start", class_data_sharing=sharing),
        LocalStack().spark_jars(),
    )
    session_s = time.monotonic() - started
    started = time.monotonic()
    spark.range(0, 200_000, numPartitions=2).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
    query_s = time.monotonic() - started
    with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:
        mapped = "driver.jsa" in maps.read()
    spark.stop()
    return {"session_s": session_s, "first_query_s": query_s, "mapped": mapped}


def _run(sharing: bool, cache: str) -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, __file__, "child", "on" if sharing else "off"],
        capture_output=True, text=True, cwd=ROOT, check=True, env={**os.environ, "THREES_CACHE_DIR": cache},
    )
    result = json.loads([ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1])
    result["process_s"] = time.monotonic() - started
    return result


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="threes-bench-cds-") as cache:
        training = _run(True, cache)
        archives = list(Path(cache).glob("jvm/*/driver.jsa"))
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for _ in range(ROUNDS):
            runs["off"].append(_run(False, cache))
            runs["on"].append(_run(True, cache))
        archive_mb = archives[0].stat().st_size / 2**20 if archives else 0.0
    if not all(r["mapped"] for r in runs["on"]) or any(r["mapped"] for r in runs["off"]):
        raise SystemExit("the archive was not mapped as configured: no figures")
    figures: dict[str, Any] = {"benchmark": "driver_start", "rounds": ROUNDS}
    for measure in ("session_s", "first_query_s", "process_s"):
        off = statistics.median(r[measure] for r in runs["off"])
        on = statistics.median(r[measure] for r in runs["on"])
        name = measure[:-2]
        figures |= {f"off_{measure}": off, f"on_{measure}": on, f"ratio_{name}_off_vs_on": off / on}
    figures |= {"training_process_s": training["process_s"], "archive_mb": archive_mb}
    print(f"local[2], {ROUNDS} rounds of new driver processes, medians")
    print(f"{'measure':<28}{'off':>8}{'on':>8}{'ratio':>8}")
    for measure in ("session_s", "first_query_s", "process_s"):
        name = measure[:-2]
        print(f"{name:<28}{figures['off_' + measure]:>8.2f}{figures['on_' + measure]:>8.2f}"
              f"{figures[f'ratio_{name}_off_vs_on']:>8.2f}")
    print(f"training run (writes the archive at exit): {training['process_s']:.1f} s; archive {archive_mb:.0f} MB")
    print(json.dumps(figures))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2] == "on")))
    else:
        main()
