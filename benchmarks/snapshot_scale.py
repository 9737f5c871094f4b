"""The snapshot at scale (issue #11): 10M keys on the standalone cluster, a driver of 1 GB.

Run: ``python benchmarks/snapshot_scale.py`` (or part ``scale`` of
``benchmarks/stream_join.py``, whose JSON line then carries these figures).
Starts Kafka and the local Spark standalone cluster (a master and two workers,
1 core and 1 GB each) if needed. Every Spark driver here is a child process of
its own with ``spark.driver.memory=1g`` and ``spark.driver.maxResultSize`` left
at its default; this process samples the resident memory of each child's
process tree (the Python driver and its JVM; the executors are the workers'
children, not counted) every 0.5 s. The executors map the installation's class data
sharing archive (:mod:`stream_app.class_data_sharing`); a child's exit may dump it again
with classes it lacked, in the background: each child starts after that dump ended
(``executor_class_data_sharing`` in the JSON line says whether the measured ones had one).

One run, side by side, on the same events (``THREES_BENCH_SCALE_EVENTS``,
500k, in micro-batches of ``THREES_BENCH_BATCH``) referencing 10k keys:

1. the job with a 10k-key snapshot (broadcast engine) and with a
   ``THREES_BENCH_SCALE_KEYS`` (10M) snapshot (partitioned engine: state on the
   executors, versioned as bucketed Parquet in the checkpoint location), each
   with a fresh checkpoint: events/s with the readiness gate left out (as in
   ``stream_join.py``), ``ratio_10m_vs_10k`` (target >= 0.5);
2. the 10M run's bootstrap: keys/s of the readiness gate (target >= 500k/s)
   and the time from ``start()`` to the end of the first micro-batch;
3. a restart of the 10M job from its checkpoint after 1k updates (events
   re-read from the start, the snapshot from its newest version plus the
   topic's tail): time to the end of the first micro-batch, ``ratio`` to the
   full bootstrap's (target <= 0.2);
4. a large delta (``THREES_BENCH_SCALE_DELTA``, 100k updates, more than
   ``overlay_max_rows``): merged by the executors into a new version at start;
5. ``driver_peak_rss_mb_10m``: the largest driver tree RSS of the 10M runs
   (target <= 1536 MB);
6. where the 10M bootstrap's time goes: the run writes Spark's event log, and
   ``bootstrap_10m_jobs`` lists each Spark job before the first micro-batch
   (what it did, wall seconds, the executors' task CPU seconds: JVM threads
   only, not the Python workers' or the JIT compilers'), with
   ``bootstrap_10m_executor_cpu_us_per_key`` their task CPU per key: the figure
   that divides by the executors' cores to size a bootstrap.

Prints a table and one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_topics import BenchTopics  # noqa: E402
from stream_join import (  # noqa: E402
    BATCH,
    EVENT,
    KEY,
    SMALL,
    VALUE,
    Bench,
    write_events_topic,
    write_snapshot_topic,
)

from kernel.config.models import KafkaConfig  # noqa: E402

SCALE_KEYS = int(os.environ.get("THREES_BENCH_SCALE_KEYS", "10000000"))
SCALE_EVENTS = int(os.environ.get("THREES_BENCH_SCALE_EVENTS", "500000"))
SCALE_DELTA = int(os.environ.get("THREES_BENCH_SCALE_DELTA", "100000"))
MASTER = os.environ.get("THREES_BENCH_SCALE_MASTER", "spark://127.0.0.1:7077")
STRIDE = max(1, SCALE_KEYS // SMALL)  # the events' 10k keys, spread over the whole key range
UPDATES = 1000
log = logging.getLogger("snapshot_scale")


# -- children: one Spark driver each ---------------------------------------------------------------


def _session(
    master: str, executor_gc: str = "auto", executor_java_options: str = "", spark_conf: dict[str, str] | None = None
) -> Any:
    from stream_app.session import spark_session
    from stream_app.spark_settings import SparkSettings
    from threes.local import LocalStack

    conf = dict(spark_conf or {})
    if executor_java_options:
        conf["spark.executor.extraJavaOptions"] = executor_java_options
    settings = SparkSettings(master=master, app_name="threes-bench-scale", driver_memory="1g", executor_gc=executor_gc,
                             conf=conf)
    return spark_session(settings, LocalStack().spark_jars())


def _job_config(args: dict[str, Any], folder: Path) -> Any:
    from stream_app.config import StreamJobConfig

    for name, schema in (("key", KEY), ("value", VALUE), ("event", EVENT)):
        (folder / f"{name}.avsc").write_text(json.dumps(schema))
    return StreamJobConfig.model_validate(
        {
            "name": f"bench-scale-{uuid.uuid4().hex[:6]}",
            "events": {
                "topic": args["events"],
                "value_schema": "event.avsc",
                "starting_offsets": "earliest",
                "max_offsets_per_trigger": BATCH,
            },
            "snapshots": [
                {
                    "name": "airports",
                    "topics": [args["snapshot"]],
                    "key_schema": "key.avsc",
                    "value_schema": "value.avsc",
                }
            ],
            "lookups": [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_"}],
            "enriched_topic": f"bench.scale.enriched.{uuid.uuid4().hex[:6]}",
            "dead_letter_topic": args["dlq"],
            "trigger_interval_s": 1,
            "checkpoint_location": args["checkpoint"],
        }
    )


def _run_job(spark: Any, kafka: KafkaConfig, args: dict[str, Any]) -> dict[str, Any]:
    from stream_app.job import StreamJob

    checkpoint = Path(args["checkpoint"])
    for part in ("events", "snapshot-offsets"):  # events from the start again; the snapshot's versions stay
        shutil.rmtree(checkpoint / part, ignore_errors=True)
    checkpoint.mkdir(parents=True, exist_ok=True)
    job = StreamJob(_job_config(args, checkpoint.parent), kafka, spark, base_dir=checkpoint.parent)
    started = time.monotonic()
    job.start(available_now=True)
    query, first_batch_s = job.queries[0], None
    while query.isActive:
        if first_batch_s is None and any(p["numInputRows"] for p in query.recentProgress):
            first_batch_s = time.monotonic() - started
        time.sleep(0.1)
    if first_batch_s is None:
        first_batch_s = time.monotonic() - started
    stats = Bench.throughput(query, job.gate_wait_s)
    snapshot = job.snapshots["airports"]
    stats.update(
        engine=snapshot.mode,
        readiness=job.readiness["airports"],
        to_first_batch_s=first_batch_s,
        keys=snapshot.live_keys(),
        version=snapshot.base.version,
    )
    job.stop(checkpoint=False)
    return stats


def child(args: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this process: ``write`` topics, or run the ``job`` once."""
    kafka = KafkaConfig(bootstrap_servers=args["bootstrap"])
    spark = _session(
        args["master"], args.get("executor_gc", "auto"), args.get("executor_java_options", ""), args.get("spark_conf")
    )
    try:
        if args["action"] == "write":
            from schemas.store import SchemaStore

            store = SchemaStore(kafka.librdkafka_config(), kafka.schema_topic)
            for schema in (KEY, VALUE, EVENT):  # the writer schemas, as a source registers them
                store.register(schema)
            for spec in args["snapshots"]:
                write_snapshot_topic(spark, kafka, **spec)
            if args.get("events"):
                write_events_topic(spark, kafka, args["events"], args["n"], stride=STRIDE)
            return {}
        return _run_job(spark, kafka, args)
    finally:
        spark.stop()


# -- the parent: orchestration and memory sampling -------------------------------------------------


def _tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and its descendants (``/proc``), bytes."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            with open(f"/proc/{current}/statm") as statm:
                total += int(statm.read().split()[1]) * page
        except OSError:
            continue
    return total


def run_child(args: dict[str, Any], event_log: Path | None = None) -> tuple[dict[str, Any], float]:
    """Run :func:`child` in a new process; returns its result and the peak RSS of its tree, MB.

    ``event_log``: a folder where the child's Spark driver writes its event log (uncompressed).
    """
    env = dict(os.environ)
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": event_log.as_uri(),
            "spark.eventLog.compress": "false",
        }
        env["PYSPARK_SUBMIT_ARGS"] = " ".join(f"--conf {k}={v}" for k, v in conf.items()) + " pyspark-shell"
    executor_archive_ready()  # no background dump of the executors' classes during a measurement
    proc = subprocess.Popen(
        [sys.executable, __file__, "child", json.dumps(args)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss_bytes(proc.pid))
        time.sleep(0.5)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"child {args['action']} failed with exit code {proc.returncode}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), peak / 2**20


def bootstrap_jobs(event_log: Path) -> list[dict[str, Any]]:
    """The Spark jobs of a run's event log before its first micro-batch: what, wall s, executors' task CPU s.

    A job is named by its description (``threes snapshot <name>: ...``, set by the snapshot), else by the
    call site of its stage; micro-batch jobs carry the query's ``-enrich-`` job description.
    """
    events = []
    for path in sorted(event_log.rglob("*")):
        if path.is_file() and path.name.startswith(("events_", "app-", "local-")):
            events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    stage_job: dict[int, int] = {}
    jobs: dict[int, dict[str, Any]] = {}
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            description = (e.get("Properties") or {}).get("spark.job.description") or ""
            jobs[e["Job ID"]] = {
                "start": e["Submission Time"],
                "batch": "-enrich-" in description,
                "cpu_s": 0.0,
                "stage": description.removeprefix("threes snapshot "),
            }
            stage_job.update({sid: e["Job ID"] for sid in e["Stage IDs"]})
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            job = jobs.get(stage_job.get(info["Stage ID"], -1))
            if job is not None and not job["stage"]:  # no description: the call site
                job["stage"] = info["Stage Name"].split(" at ")[-1].rsplit("/", 1)[-1]
        elif kind == "SparkListenerTaskEnd" and e["Stage ID"] in stage_job:
            metrics = e.get("Task Metrics") or {}
            jobs[stage_job[e["Stage ID"]]]["cpu_s"] += metrics.get("Executor CPU Time", 0) / 1e9
    out = []
    for job_id in sorted(jobs):
        job = jobs[job_id]
        if job["batch"]:
            break
        out.append(
            {
                "job": job_id,
                "at": job["stage"],
                "wall_s": (job.get("end", job["start"]) - job["start"]) / 1000,
                "task_cpu_s": job["cpu_s"],
            }
        )
    return out


def executor_archive_ready(timeout_s: float = 300.0) -> bool:
    """Wait for a background dump of the executors' class data sharing archive; whether one exists."""
    from stream_app.class_data_sharing import cache_dir
    from stream_app.executor_class_data_sharing import EXECUTOR_ARCHIVE, EXECUTOR_LOCK

    jvm = cache_dir() / "jvm"
    deadline = time.monotonic() + timeout_s
    while any(jvm.glob(f"*/{EXECUTOR_LOCK}")) and time.monotonic() < deadline:
        time.sleep(1.0)
    return any(jvm.glob(f"*/{EXECUTOR_ARCHIVE}"))


@contextlib.contextmanager
def variant_archives_removed() -> Iterator[None]:
    """Remove, on leaving, the class data sharing archives recorded inside the block.

    Every set of JVM options is its own archive key (~130 MB each): benchmarks that try options
    other than the job's keep the archives that existed before (the job's own) and nothing else.
    """
    from stream_app.class_data_sharing import cache_dir

    jvm = cache_dir() / "jvm"
    executor_archive_ready()
    kept = set(jvm.glob("*"))
    try:
        yield
    finally:
        executor_archive_ready()
        for folder in set(jvm.glob("*")) - kept:
            shutil.rmtree(folder, ignore_errors=True)


def variant_medians(
    runs: dict[str, list[dict[str, float]]], figures: Sequence[str], ratios: dict[str, str]
) -> dict[str, float]:
    """Medians per variant and ratios against the first variant, for benchmarks that alternate variants.

    Args:
        runs: variant name (the baseline first) -> one dict of figures per run.
        figures: the figures to take medians of: ``<variant>_<figure>``.
        ratios: ratio name -> figure: ``<ratio>_<variant>`` = the variant's median / the baseline's.
    """
    names = list(runs)
    out = {f"{name}_{what}": statistics.median(r[what] for r in runs[name]) for name in names for what in figures}
    for name in names[1:]:
        for ratio, what in ratios.items():
            out[f"{ratio}_{name}"] = out[f"{name}_{what}"] / out[f"{names[0]}_{what}"]
    return out


def run_scale(kafka: KafkaConfig) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """The whole scale measurement; returns the figures and table rows."""
    run_id = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix="threes-scale-"))
    small, big = f"bench.scale.snap10k.{run_id}", f"bench.scale.snap10m.{run_id}"
    events, dlq = f"bench.scale.events.{run_id}", f"bench.scale.dlq.{run_id}"
    base = {"bootstrap": kafka.bootstrap_servers, "master": MASTER, "dlq": dlq}
    results: dict[str, Any] = {"scale_keys": SCALE_KEYS, "scale_events": SCALE_EVENTS, "scale_master": MASTER}
    try:
        started = time.monotonic()
        snapshots = [
            {"topic": small, "keys": SMALL, "stride": STRIDE},
            {"topic": big, "keys": SCALE_KEYS},
        ]
        run_child({**base, "action": "write", "snapshots": snapshots, "events": events, "n": SCALE_EVENTS})
        log.info("scale: topics written in %.1f s", time.monotonic() - started)
        results["executor_class_data_sharing"] = executor_archive_ready()
        job = {**base, "action": "job", "events": events}
        r10k, rss10k = run_child({**job, "snapshot": small, "checkpoint": str(tmp / "cp10k" / "checkpoint")})
        cp = str(tmp / "cp10m" / "checkpoint")
        r10m, rss_boot = run_child({**job, "snapshot": big, "checkpoint": cp}, event_log=tmp / "eventlog")
        boot_jobs = bootstrap_jobs(tmp / "eventlog")
        updates = [{"topic": big, "keys": UPDATES, "start": 0, "name": "renamed %d", "stride": STRIDE}]
        run_child({**base, "action": "write", "snapshots": updates})
        restart, rss_restart = run_child({**job, "snapshot": big, "checkpoint": cp})
        delta = [{"topic": big, "keys": SCALE_DELTA, "start": 0, "name": "delta %d", "stride": 1}]
        run_child({**base, "action": "write", "snapshots": delta})
        merged, rss_merge = run_child({**job, "snapshot": big, "checkpoint": cp})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    boot = r10m["readiness"]
    results.update(
        {
            "job_10k_cluster": r10k,
            "job_10m_cluster": r10m,
            "restart_10m": restart,
            "large_delta_10m": merged,
            "ratio_10m_vs_10k": r10m["events_per_s"] / r10k["events_per_s"],
            "bootstrap_10m_keys_per_s": boot["keys"] / boot["elapsed_s"],
            "bootstrap_10m_to_first_batch_s": r10m["to_first_batch_s"],
            "restart_10m_to_first_batch_s": restart["to_first_batch_s"],
            "ratio_restart_vs_bootstrap_10m": restart["to_first_batch_s"] / r10m["to_first_batch_s"],
            "large_delta_10m_merge_s": merged["readiness"]["elapsed_s"],
            "driver_peak_rss_mb_10k": rss10k,
            "bootstrap_10m_jobs": boot_jobs,
            "bootstrap_10m_executor_cpu_us_per_key": sum(j["task_cpu_s"] for j in boot_jobs) / boot["keys"] * 1e6,
            "driver_peak_rss_mb_10m": max(rss_boot, rss_restart, rss_merge),
        }
    )
    r = results
    rows = [
        ("events/s job 10k (cluster)", f"{r10k['events_per_s']:,.0f}", f"engine {r10k['engine']}"),
        (
            f"events/s job {SCALE_KEYS / 1e6:g}M (cluster)",
            f"{r10m['events_per_s']:,.0f}",
            f"engine {r10m['engine']}, steady {r10m['steady_events_per_s']:,.0f}/s",
        ),
        ("job 10M / job 10k", f"{r['ratio_10m_vs_10k']:.2f}x", "target >= 0.5"),
        (
            "bootstrap 10M keys/s",
            f"{r['bootstrap_10m_keys_per_s']:,.0f}",
            f"{boot['keys']:,} keys in {boot['elapsed_s']:.1f} s (target >= 500,000/s); "
            f"first batch done {r10m['to_first_batch_s']:.1f} s after start",
        ),
        (
            "bootstrap 10M executors' task CPU",
            f"{r['bootstrap_10m_executor_cpu_us_per_key']:.2f} us/key",
            "; ".join(f"{j['at']} {j['wall_s']:.1f} s wall, {j['task_cpu_s']:.1f} s CPU" for j in boot_jobs),
        ),
        (
            "restart 10M to first batch",
            f"{restart['to_first_batch_s']:.1f} s",
            f"{r['ratio_restart_vs_bootstrap_10m']:.2f} of the bootstrap's (target <= 0.2); "
            f"source {restart['readiness']['source']}, records read {restart['readiness']['records']:,}",
        ),
        (
            f"large delta ({SCALE_DELTA:,} updates) merged",
            f"{r['large_delta_10m_merge_s']:.1f} s",
            f"by the executors at start, new version {merged['version']}",
        ),
        (
            "driver peak RSS 10M",
            f"{r['driver_peak_rss_mb_10m']:,.0f} MB",
            f"driver_memory 1g, maxResultSize default (target <= 1536 MB); 10k: {rss10k:,.0f} MB",
        ),
    ]
    return results, rows


def on_local_cluster(run: Any) -> Any:
    """``run(kafka)`` against the local stack's Kafka and Spark cluster (started if needed); the ``bench.``
    topics it created are deleted after."""
    from threes.local import LocalStack

    stack = LocalStack()
    stack.up(["kafka", "spark"])
    kafka = KafkaConfig(bootstrap_servers=stack.endpoints().kafka_bootstrap)
    topics = BenchTopics(kafka.librdkafka_config())
    try:
        return run(kafka)
    finally:
        topics.drop()


def setup_logging() -> None:
    """The benchmarks' log lines: ``THREES_BENCH_LOG`` sets the level (INFO by default); py4j's left out."""
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def main() -> None:
    results, rows = on_local_cluster(run_scale)
    width = max(len(r[0]) for r in rows)
    print(f"\nsnapshot_scale benchmark: {MASTER}, {SCALE_EVENTS:,} events in micro-batches of {BATCH:,}")
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>14}  {note}")
    print(json.dumps({"benchmark": "snapshot_scale", **results}, default=float))


if __name__ == "__main__":
    setup_logging()
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        print(json.dumps(child(json.loads(sys.argv[2])), default=float))
    else:
        main()
