"""A Spark standalone cluster from the pyspark package's own jars: one master, two workers.

The pip-installed pyspark package is a Spark distribution (its ``jars/``
folder holds every jar of Spark's launcher classes), so the master and the
workers are started as plain JVMs with ``org.apache.spark.deploy.master.Master``
and ``org.apache.spark.deploy.worker.Worker`` on that classpath, exactly what
Spark's ``sbin/start-master.sh`` / ``start-worker.sh`` run (Spark's "Spark
Standalone Mode" docs). Each worker offers one core and 1 GiB to executors and
launches them (and their Python workers) as its own child processes, with
``SPARK_HOME`` set to the pyspark folder.

Addresses (127.0.0.1 only): master ``spark://127.0.0.1:7077`` (web UI 18080),
workers on 17081/17082 (web UIs 18081/18082). Work folders, executor logs and
the applications' files live under ``.threes/spark-worker-<n>/work``.
"""

from __future__ import annotations

import json
import logging
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .common import HOST, Layout, LocalStackError
from .kafka import JAVA_17
from .service import Service
from .system import find_java

if TYPE_CHECKING:
    from .endpoints import Endpoints

logger = logging.getLogger(__name__)

MASTER_PORT = 7077
MASTER_UI_PORT = 18080
WORKER_PORTS = ((17081, 18081), (17082, 18082))
"""(RPC port, web UI port) of each worker."""
WORKER_CORES = 1
WORKER_MEMORY = "1g"
DAEMON_HEAP = "-Xmx256m"
"""Heap of the master and worker daemons themselves (the executors get their own JVMs)."""
MASTER_URL = f"spark://{HOST}:{MASTER_PORT}"


def spark_home() -> Path:
    """Return the pyspark package's folder, a Spark distribution with ``jars/``.

    Raises:
        LocalStackError: If pyspark is not installed in this interpreter.
    """
    try:
        import pyspark
    except ImportError as exc:  # pragma: no cover - pyspark is a dependency
        raise LocalStackError("pyspark is not installed in this Python; run make venv") from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "jars").is_dir():
        raise LocalStackError(f"{home} has no jars/ folder: not a pip-installed pyspark")
    return home


def python_for_workers() -> str:
    """Return the interpreter the executors' Python workers run: this virtualenv's."""
    return str(Path(sys.prefix) / "bin" / "python") if sys.prefix != sys.base_prefix else sys.executable


def _master_state(ui_port: int = MASTER_UI_PORT) -> dict:
    """The master's ``/json`` document (status, alive workers, applications)."""
    with urllib.request.urlopen(f"http://{HOST}:{ui_port}/json/", timeout=3) as response:  # loopback
        return json.load(response)


class _SparkDaemon(Service):
    """What the master and the workers share: the JVM command on pyspark's jars."""

    env_var = "THREES_SPARK_MASTER"
    endpoint_vars: ClassVar[dict[str, str]] = {"spark_master": "THREES_SPARK_MASTER"}
    health_timeout = 60.0
    stop_timeout = 20.0
    main_class: str

    def _args(self) -> list[str]:
        raise NotImplementedError

    def command(self) -> tuple[list[str], dict[str, str], Path]:
        """Return ``java -cp <pyspark>/jars/* <Master|Worker> ...`` and its environment."""
        java_home = find_java(17, prefer=(JAVA_17,))
        home = spark_home()
        self.dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(java_home / "bin" / "java"),
            DAEMON_HEAP,
            "-XX:+ExitOnOutOfMemoryError",
            f"-Dthrees.service={self.marker}",  # our marker in the command line
            "-cp",
            f"{home}/jars/*",
            self.main_class,
            *self._args(),
        ]
        env = {
            "SPARK_HOME": str(home),
            # the worker's launcher asks for it to find jars/ (Spark's load-spark-env.sh sets it)
            "SPARK_SCALA_VERSION": "2.13",
            "JAVA_HOME": str(java_home),  # the executors' java (the worker builds their command)
            "SPARK_LOCAL_IP": HOST,
            "SPARK_PUBLIC_DNS": HOST,
            "PYSPARK_PYTHON": python_for_workers(),
            "SPARK_LOG_DIR": str(self.layout.logs),
        }
        return cmd, env, self.dir

    def address(self, endpoints: Endpoints) -> str:
        """The master URL."""
        return endpoints.spark_master


class SparkMaster(_SparkDaemon):
    """The standalone master (``spark://127.0.0.1:7077``)."""

    name = "spark-master"
    title = "Spark master"
    ports = (MASTER_PORT, MASTER_UI_PORT)
    main_class = "org.apache.spark.deploy.master.Master"

    def _args(self) -> list[str]:
        return ["--host", HOST, "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT)]

    def probe(self, endpoints: Endpoints) -> None:
        """Raise unless the master's web UI says ALIVE (another master: unless its port answers)."""
        if endpoints.spark_master != MASTER_URL:
            external_master_probe(endpoints.spark_master)
            return
        state = _master_state()
        if state.get("status") != "ALIVE":
            raise LocalStackError(f"Spark master status {state.get('status')!r}")


class SparkWorker(_SparkDaemon):
    """Worker ``n`` (1-based): one core, 1 GiB for executors, its own work folder.

    Args:
        layout: The project-local folder.
        n: 1 or 2.
    """

    title = "Spark worker"
    main_class = "org.apache.spark.deploy.worker.Worker"

    def __init__(self, layout: Layout, n: int) -> None:
        self.n = n
        self.name = f"spark-worker-{n}"
        self.port, self.ui_port = WORKER_PORTS[n - 1]
        self.ports = (self.port, self.ui_port)
        self.title = f"Spark worker {n}"
        super().__init__(layout)

    @property
    def work_dir(self) -> Path:
        """Where the worker runs executors (their stdout/stderr, the applications' files)."""
        return self.dir / "work"

    def _args(self) -> list[str]:
        return [
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
            "--cores",
            str(WORKER_CORES),
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(self.work_dir),
            MASTER_URL,
        ]

    def command(self) -> tuple[list[str], dict[str, str], Path]:
        """The worker's command; finished applications' folders are cleaned up after an hour."""
        cmd, env, cwd = super().command()
        # Worker settings are Java system properties (SPARK_WORKER_OPTS in Spark's scripts).
        opts = [
            "-Dspark.worker.cleanup.enabled=true",
            "-Dspark.worker.cleanup.interval=600",
            "-Dspark.worker.cleanup.appDataTtl=3600",
        ]
        java_index = 1
        return [*cmd[:java_index], *opts, *cmd[java_index:]], env, cwd

    def address(self, endpoints: Endpoints) -> str:
        """The worker's RPC address and its master."""
        return f"{HOST}:{self.port} ({endpoints.spark_master})"

    def probe(self, endpoints: Endpoints) -> None:
        """Raise unless the master lists this worker as ALIVE (another master: unless its port answers)."""
        if endpoints.spark_master != MASTER_URL:
            external_master_probe(endpoints.spark_master)
            return
        for worker in _master_state().get("workers", []):
            if worker.get("port") == self.port and worker.get("state") == "ALIVE":
                return
        raise LocalStackError(f"worker on port {self.port} not registered with the master yet")


def cluster_services(layout: Layout) -> list[_SparkDaemon]:
    """Return the master and the two workers, in start order."""
    return [SparkMaster(layout), *(SparkWorker(layout, n) for n in range(1, len(WORKER_PORTS) + 1))]


def external_master_probe(url: str) -> None:
    """Raise unless something accepts connections at the ``spark://host:port`` of ``url``."""
    from .process import port_open

    host, _, port = url.removeprefix("spark://").partition(":")
    if not port_open(int(port or MASTER_PORT), host=host):
        raise LocalStackError(f"nothing answers at {url}")
