"""A task's fixed cost in a Spark Python worker, with and without ``stream_app.python_worker.prepare``.

Run: ``python benchmarks/python_worker.py`` (Spark only; no other service).

Before each task PySpark's worker calls ``importlib.invalidate_caches()``; on
Python 3.10/3.11 that reads the whole directory of every zip on the worker's
``sys.path`` again (``pyspark.zip`` once per sub-package imported from it, the
py4j zip, the ``spark-core`` jar). Every UDF of the stream job calls
``prepare()`` first, which keeps those reads for archives that changed.

Side by side on the same machine: applications run one after the other in
child processes (a new JVM and new Python workers each), alternating
``plain`` (a scalar pandas UDF that only adds 1) and ``prepare`` (the same UDF
calling ``prepare()`` first), ``THREES_BENCH_ROUNDS`` (2) of each. Each
application runs ``THREES_BENCH_JOBS`` (40) timed jobs of
``THREES_BENCH_TASKS`` (2) tasks over 20,000 rows after 5 untimed ones, on
``THREES_BENCH_MASTER`` (``local[2]``; ``spark://127.0.0.1:7077`` for the
local stack's standalone cluster). A micro-batch of the job with a lookup in
Python is one such job, with the lookup's work on top.

Prints a table and one JSON line: ``plain_job_s`` and ``prepare_job_s`` (the
median job of each mode's best application), ``ratio_job_plain_vs_prepare``,
``saved_per_job_ms`` (the tasks run in parallel).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MASTER = os.environ.get("THREES_BENCH_MASTER", "local[2]")
ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "2"))
JOBS = int(os.environ.get("THREES_BENCH_JOBS", "40"))
TASKS = int(os.environ.get("THREES_BENCH_TASKS", "2"))


def _udf(prepare: bool) -> Any:
    import pandas as pd
    from pyspark.sql import functions as f
    from pyspark.sql import types as T

    def run(batches: typing.Iterator[pd.Series]) -> typing.Iterator[pd.Series]:
        if prepare:
            from stream_app.python_worker import prepare as prepare_worker

            prepare_worker()
        for batch in batches:
            yield batch + 1

    run.__annotations__ = {"batches": typing.Iterator[pd.Series], "return": typing.Iterator[pd.Series]}
    return f.pandas_udf(run, T.LongType())  # type: ignore[call-overload]


def child(mode: str) -> dict[str, Any]:
    """One application: the median and fastest of ``JOBS`` timed jobs, seconds."""
    from pyspark.sql import functions as f

    from stream_app.session import spark_session
    from stream_app.spark_settings import SparkSettings
    from threes.local import LocalStack

    spark = spark_session(
        SparkSettings(master=MASTER, app_name=f"threes-bench-python-worker-{mode}", driver_memory="1g"),
        LocalStack().spark_jars(),
    )
    try:
        df = spark.range(0, 20_000, numPartitions=TASKS).select(_udf(mode == "prepare")(f.col("id")).alias("x"))
        times = []
        for i in range(5 + JOBS):
            started = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            if i >= 5:
                times.append(time.perf_counter() - started)
    finally:
        spark.stop()
    return {"median_s": statistics.median(times), "min_s": min(times)}


def main() -> None:
    results: dict[str, list[dict[str, Any]]] = {"plain": [], "prepare": []}
    for _ in range(ROUNDS):
        for mode in ("plain", "prepare"):
            out = subprocess.run(
                [sys.executable, __file__, "child", mode], capture_output=True, text=True, cwd=ROOT, check=True
            ).stdout
            results[mode].append(json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1]))
    best = {mode: min(r["median_s"] for r in runs) for mode, runs in results.items()}
    figures = {
        "benchmark": "python_worker",
        "python": sys.version.split()[0],
        "master": MASTER,
        "jobs": JOBS,
        "tasks": TASKS,
        "rounds": ROUNDS,
        "plain_job_s": best["plain"],
        "prepare_job_s": best["prepare"],
        "ratio_job_plain_vs_prepare": best["plain"] / best["prepare"],
        "saved_per_job_ms": (best["plain"] - best["prepare"]) * 1000,
        "medians_s": {mode: [r["median_s"] for r in runs] for mode, runs in results.items()},
    }
    print(f"Python {figures['python']}, {MASTER}, {JOBS} jobs of {TASKS} tasks per application, {ROUNDS} rounds")
    print(f"{'mode':<10}{'median job, s (each application)':>36}")
    for mode in ("plain", "prepare"):
        print(f"{mode:<10}{', '.join(f'{s:.3f}' for s in figures['medians_s'][mode]):>36}")
    print(
        f"plain / prepare: {figures['ratio_job_plain_vs_prepare']:.2f}x, "
        f"{figures['saved_per_job_ms']:.0f} ms saved per job"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2])))
    else:
        main()
