"""Class data sharing on a real driver JVM: one run writes the archive, the next maps it, nothing is printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

_DRIVER = textwrap.dedent("""
    import json
    from pyspark import SparkContext
    from connectors.config.stream import SparkSettings
    from threes.local import LocalStack
    from stream_app.session import spark_session

    spark = spark_session(SparkSettings(master="local[1]", app_name="cds-test"), LocalStack().spark_jars())
    assert spark.range(0, 1000, numPartitions=2).selectExpr("sum(id)").first()[0] == 499500
    with open(f"/proc/{SparkContext._gateway.proc.pid}/maps") as maps:  # the JVM's mapped files
        mapped = "driver.jsa" in maps.read()
    spark.stop()
    print(json.dumps({"mapped": mapped}))
""")


def _driver(env: dict[str, str], cwd: Path) -> tuple[bool, str]:
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)["mapped"], done.stdout + done.stderr


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
