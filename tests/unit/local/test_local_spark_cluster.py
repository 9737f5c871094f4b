"""The local stack's Spark standalone cluster: commands built from pyspark's own jars, on 127.0.0.1."""

from __future__ import annotations

import sys
from pathlib import Path

import pyspark

from threes.local.common import Layout
from threes.local.spark import HADOOP_VERSION, SPARK_VERSION, pyspark_hadoop_version, s3a_jars_dir, spark_jars_dir
from threes.local.spark_cluster import MASTER_URL, SparkMaster, cluster_services


def test_master_and_workers_are_pyspark_launcher_classes_bound_to_loopback(tmp_path):
    master, *workers = cluster_services(Layout(tmp_path))
    assert isinstance(master, SparkMaster) and [w.name for w in workers] == ["spark-worker-1", "spark-worker-2"]
    home = Path(pyspark.__file__).resolve().parent
    cmd, env, _ = master.command()
    assert cmd[cmd.index("-cp") + 1] == f"{home}/jars/*" and "org.apache.spark.deploy.master.Master" in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and master.marker in " ".join(cmd)
    cmd, env, cwd = workers[1].command()
    assert "org.apache.spark.deploy.worker.Worker" in cmd and cmd[-1] == MASTER_URL == "spark://127.0.0.1:7077"
    assert cmd[cmd.index("--cores") + 1] == "1" and cmd[cmd.index("--port") + 1] == "17082"
    assert cmd[cmd.index("--work-dir") + 1] == str(tmp_path / "spark-worker-2" / "work")
    assert env["SPARK_HOME"] == str(home) and env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert env["SPARK_SCALA_VERSION"] == "2.13"  # the worker's launcher needs it to find jars/
    assert Path(env["PYSPARK_PYTHON"]).parent == Path(sys.executable).parent  # this virtualenv's Python


def test_hadoop_aws_is_pinned_to_pysparks_hadoop():
    assert pyspark_hadoop_version() == HADOOP_VERSION
    pom = (Path(__file__).parents[3] / "threes" / "local" / "spark-s3a-pom.xml").read_text()
    assert f"<hadoop.version>{HADOOP_VERSION}</hadoop.version>" in pom  # Maven is also given it with -D


def test_connectors_are_pinned_to_the_installed_pyspark_in_folders_named_by_version(tmp_path):
    """The jars of two Spark versions (two checkouts sharing one .threes) never mix."""
    assert pyspark.__version__ == SPARK_VERSION
    pom = (Path(__file__).parents[3] / "threes" / "local" / "spark-pom.xml").read_text()
    assert f"<spark.version>{SPARK_VERSION}</spark.version>" in pom
    assert spark_jars_dir(Layout(tmp_path)) == tmp_path / f"spark-jars-{SPARK_VERSION}"
    assert s3a_jars_dir(Layout(tmp_path)) == tmp_path / f"spark-s3a-jars-{HADOOP_VERSION}"


def test_the_cluster_master_is_exported_only_when_set(monkeypatch) -> None:
    """A config's ${env:THREES_SPARK_MASTER:-local[2]} must not reach a cluster nobody started."""
    from threes.local import Endpoints

    monkeypatch.delenv("THREES_SPARK_MASTER", raising=False)
    env = Endpoints.from_env().as_env()
    assert "THREES_SPARK_MASTER" not in env and "THREES_KAFKA_BOOTSTRAP" in env
    monkeypatch.setenv("THREES_SPARK_MASTER", "spark://127.0.0.1:7077")
    assert Endpoints.from_env().as_env()["THREES_SPARK_MASTER"] == "spark://127.0.0.1:7077"
