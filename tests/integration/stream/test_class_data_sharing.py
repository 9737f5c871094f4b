"""Class data sharing on a real driver JVM: one run writes the archive, the next maps it, nothing is printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

_DRIVER = textwrap.dedent("""
    import json
    from pyspark import SparkContext
    from stream_app.config import SparkSettings
    from threes.local import LocalStack
    from stream_app.session import spark_session

    spark = spark_session(SparkSettings(master="local[1]", app_name="cds-test"), LocalStack().spark_jars())
    assert spark.range(0, 1000, numPartitions=2).selectExpr("sum(id)").first()[0] == 499500
    with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:  # the JVM's mapped files
        mapped = "driver.jsa" in maps.read()
    spark.stop()
    print(json.dumps({"mapped": mapped}))
""")


def _run(script: str, env: dict[str, str], cwd: Path, *args: str) -> tuple[dict, str]:
    """Run a driver script in a process of its own; its last JSON line and its whole output."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line), done.stdout + done.stderr


def _driver(env: dict[str, str], cwd: Path) -> tuple[bool, str]:
    result, output = _run(_DRIVER, env, cwd)
    return result["mapped"], output


def test_a_driver_maps_the_archive_its_predecessor_wrote(stack, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "THREES_CACHE_DIR": str(tmp_path / "cache"), "THREES_HOME": str(stack.home)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))

    mapped, output = _driver(env, tmp_path)
    assert not mapped  # no archive yet: this run trains one, written when its JVM exits
    folders = list((tmp_path / "cache" / "jvm").iterdir())
    assert len(folders) == 1
    assert (folders[0] / "driver.jsa").stat().st_size > 10_000_000
    assert not list(folders[0].glob("*.part")) and not (folders[0] / "training.lock").exists()
    assert "[cds" not in output  # the JVM's hundreds of class-sharing warnings are switched off

    mapped, output = _driver(env, tmp_path)
    assert mapped
    assert "[cds" not in output


_CLUSTER_DRIVER = textwrap.dedent("""
    import json, os, sys
    from stream_app.config import SparkSettings
    from threes.local import LocalStack
    from stream_app.session import spark_session

    def executor_maps(_):
        # a Python worker's parent is PySpark's daemon, whose parent is the executor's JVM
        daemon = int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[1])
        jvm = int(open(f"/proc/{daemon}/stat").read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{jvm}/maps") as maps:
            yield (jvm, "executor.jsa" in maps.read())

    spark = spark_session(SparkSettings(master=sys.argv[1], app_name="cds-executors-test"), LocalStack().spark_jars())
    seen = dict(spark.sparkContext.parallelize(range(8), 8).mapPartitions(executor_maps).collect())
    spark.stop()
    print(json.dumps({"executors": len(seen), "mapped": sorted(set(seen.values()))}))
""")


def test_executors_on_this_host_map_the_archive_their_first_application_recorded(
    stack, spark_cluster_master: str, tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[3]
    cache = tmp_path / "cache"
    env = {**os.environ, "THREES_CACHE_DIR": str(cache), "THREES_HOME": str(stack.home)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))

    def run() -> dict:
        result, output = _run(_CLUSTER_DRIVER, env, tmp_path, spark_cluster_master)
        assert "[cds" not in output
        return result

    first = run()
    assert first["mapped"] == [False]  # no archive yet: the executors record the classes they load
    folders = [f for f in (cache / "jvm").iterdir() if (f / "executor-training.lock").exists()]
    assert len(folders) == 1  # the dump runs in the background after the first driver exited
    folder = folders[0]
    deadline = time.monotonic() + 240
    while (folder / "executor-training.lock").exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert (folder / "executor.jsa").stat().st_size > 10_000_000
    assert not list(folder.glob("executor-*")), "class lists and partial files are removed"
    assert (folder / "executor.classes").stat().st_size > 100_000  # the classes the archive holds

    second = run()
    assert second["executors"] >= 1 and second["mapped"] == [True]
    # it recorded too (the archive grows when an application loads classes it lacks): its dump check
    # ends with no class list left behind
    deadline = time.monotonic() + 240
    while (folder / "executor-training.lock").exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert (folder / "executor.jsa").is_file() and (folder / "executor.classes").is_file()
    assert not list(folder.glob("executor-*"))
