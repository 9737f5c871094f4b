"""``threes serve``: a pipeline's snapshots as a queryable replica, in a JVM of their own, with no Spark.

The process runs the same state store the job's lookups use (``threes.store.SnapshotStore``: a
consumer assigned every partition of the snapshot's compacted topics, RocksDB in a state folder,
versions with ``retention``) and its query server (``threes.store.QueryServer``). Run more of them
to serve more queries; each keeps its own state folder, so a restart reads only the topics' tail.

This module builds what the JVM needs from the pipeline's config (:func:`store_specs`), starts it
(:class:`StoreServer`) and records where it listens (``server.json`` in the state folder), which
``threes query`` reads to ask a running server instead of loading the snapshot itself
(:func:`running_server`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kernel.exceptions import SetupError
from stream_app.config import StreamJobConfig
from stream_app.realtime import READY_TIMEOUT_MS, lookup_jar

SERVE_MAIN = "threes.store.ServeMain"
SERVER_FILE = "server.json"
TOKEN_ENV = "THREES_SERVE_TOKEN"
"""The environment variable the JVM reads its bearer token from (never its command line)."""


@dataclass(frozen=True)
class ServedSnapshot:
    """What the JVM store of one snapshot is built from.

    Attributes:
        name: ``stream.snapshots[].name``.
        topics: its compacted topics.
        key_schema: the reader key schema JSON; ``None`` for ``key_format: string``.
        value_schema: the reader value schema JSON.
        max_bytes: the heap its in-heap table may take, bytes.
        retention_ms: how long versions stay queryable, ms; ``None`` keeps the latest values only.
    """

    name: str
    topics: tuple[str, ...]
    key_schema: str | None
    value_schema: str
    max_bytes: int
    retention_ms: int | None


def unservable(config: StreamJobConfig) -> list[tuple[str, str]]:
    """The snapshots the JVM store cannot read, ``(path under stream, reason)``: registry, Connect, envelopes."""
    problems = []
    for i, snap in enumerate(config.snapshots):
        for field in ("key_format", "value_format"):
            if getattr(snap, field) in ("confluent_avro", "connect_json"):
                problems.append(
                    (
                        f"snapshots[{i}].{field}",
                        f"{getattr(snap, field)}: the JVM state store reads Avro single-object records only",
                    )
                )
        if snap.envelope != "none":
            problems.append(
                (
                    f"snapshots[{i}].envelope",
                    "the JVM state store keeps each record's value as it is; a "
                    "Debezium envelope is read by the micro-batch job only",
                )
            )
    return problems


def store_specs(plan: Any) -> list[ServedSnapshot]:
    """The snapshots of a job plan (:func:`stream_app.plan.build_plan` with writer versions), as the JVM builds them."""
    out = []
    for name, snap in plan.snapshots.items():
        cfg = snap.config
        out.append(
            ServedSnapshot(
                name,
                tuple(cfg.topics),
                None if cfg.key_format == "string" else snap.key.json,
                snap.value.json,
                cfg.max_bytes,
                cfg.retention_ms,
            )
        )
    return out


def _escape(value: str) -> str:
    """A value of ``java.util.Properties`` text (what ``Properties.load`` reads back as ``value``)."""
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("=", "\\=")
    out = out.replace(":", "\\:").replace("#", "\\#").replace("!", "\\!")
    return "\\ " + out[1:] if out.startswith(" ") else out


def write_specs(snapshots: list[ServedSnapshot], consumer: str, schema_topic: str, state_dir: Path) -> Path:
    """Write the spec file for ``ServeMain`` in a private temporary file (mode 0600: it holds Kafka credentials).

    Returns:
        its path; the JVM deletes it once read.
    """
    lines = [f"snapshots={_escape(','.join(s.name for s in snapshots))}"]
    for s in snapshots:
        fields = {
            "consumer_config": consumer,
            "topics": ",".join(s.topics),
            "schema_topic": schema_topic,
            "value_schema": s.value_schema,
            "max_bytes": str(s.max_bytes),
            "ready_timeout_ms": str(READY_TIMEOUT_MS),
            "state_dir": str(state_dir),
            "retention_ms": str(-1 if s.retention_ms is None else s.retention_ms),
        }
        if s.key_schema is not None:
            fields["key_schema"] = s.key_schema
        lines += [f"{_escape(s.name)}.{k}={_escape(v)}" for k, v in fields.items()]
    fd, name = tempfile.mkstemp(prefix="threes-serve-", suffix=".properties")
    with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp: 0600
        out.write("\n".join(lines) + "\n")
    return Path(name)


def java_command(extra_jars: list[Path] | None, heap: str) -> list[str]:
    """The JVM's command line up to the main class: pyspark's jars, the connector jars, the lookup jar.

    With the local stack's resolved connector jars (``extra_jars``) the JVM starts directly; without them
    ``spark-submit`` resolves ``spark-sql-kafka`` (and its ``kafka-clients``) through Ivy first.

    Raises:
        SetupError: no ``java`` (``JAVA_HOME`` or ``PATH``), or the lookup jar is not built.
    """
    import pyspark

    jar = lookup_jar()
    spark_home = Path(pyspark.__file__).parent
    if extra_jars:
        java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") else shutil.which("java")
        if java is None or not Path(java).exists():
            raise SetupError("threes serve needs a Java runtime (17 or later): set JAVA_HOME or put java on PATH")
        classpath = os.pathsep.join([str(jar), *map(str, extra_jars), str(spark_home / "jars" / "*")])
        return [str(java), f"-Xmx{heap}", "-cp", classpath, SERVE_MAIN]
    version = metadata.version("pyspark")
    return [
        str(spark_home / "bin" / "spark-submit"),
        "--driver-memory",
        heap,
        "--class",
        SERVE_MAIN,
        "--packages",
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}",
        str(jar),
    ]


class StoreServer:
    """A running ``ServeMain`` process.

    Args:
        command: :func:`java_command`.
        spec_file: :func:`write_specs`.
        host: the address to bind.
        port: the port (0: any free one).
        token: the bearer token (passed in the environment), or ``None``.
        log: where the JVM's output goes.
    """

    def __init__(self, command: list[str], spec_file: Path, host: str, port: int, token: str | None, log: Path):
        env = dict(os.environ)
        env.pop(TOKEN_ENV, None)
        if token:
            env[TOKEN_ENV] = token
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self._out = log.open("ab")
        self.process = subprocess.Popen(
            [*command, str(spec_file), host, str(port)], env=env, stdout=subprocess.PIPE, stderr=self._out
        )
        self.host = host
        self.port: int | None = None

    def wait_listening(self, timeout_s: float = 180.0) -> int:
        """Wait for the JVM's ``threes-serve listening <port>`` line; its port.

        Raises:
            SetupError: the process ended first, or said nothing in ``timeout_s``.
        """
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline().decode(errors="replace").strip()
            if line.startswith("threes-serve listening "):
                self.port = int(line.rsplit(" ", 1)[1])
                return self.port
            if not line and self.process.poll() is not None:
                break
        raise SetupError(
            f"threes serve: the state store process did not start (exit {self.process.poll()}); see {self.log}"
        )

    def wait_ready(self) -> list[str]:
        """Block until the JVM says every store is loaded; the lines of stores that failed."""
        assert self.process.stdout is not None
        failed = []
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("threes-serve failed "):
                failed.append(line.removeprefix("threes-serve failed "))
            if line == "threes-serve ready":
                break
        return failed

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (every store checkpoints), then SIGKILL after ``timeout_s``; the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._out.close()
        return self.process.returncode


def write_server_file(state_dir: Path, host: str, port: int, pid: int) -> Path:
    """Record where a server of this state folder listens (``threes query`` reads it)."""
    path = state_dir / SERVER_FILE
    path.write_text(json.dumps({"host": host, "port": port, "pid": pid}))
    return path


def running_server(state_dir: Path) -> str | None:
    """The base URL of a live ``threes serve`` of this state folder, or ``None``."""
    try:
        doc = json.loads((state_dir / SERVER_FILE).read_text())
        os.kill(int(doc["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    host = doc["host"]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{int(doc['port'])}"


def default_state_dir(job_name: str) -> Path:
    """Where ``threes serve`` keeps its stores unless told: ``.threes/serve/<job>`` under the current folder."""
    return Path(".threes") / "serve" / job_name
