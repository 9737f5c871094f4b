"""Orchestration of the local stack: up, down, status, endpoints, Spark jars.

The services are listed in :mod:`threes.local.registry`; where they are reached in
:mod:`threes.local.endpoints`.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .common import Layout, LocalStackError, wait_until
from .discovery import Presence, ServiceStatus, find, held_message, status_of, with_ca
from .endpoints import Endpoints
from .kafka import Kafka
from .kafka_cluster import MAX_BROKERS, KafkaCluster
from .process import PidRecord
from .registry import _START_ORDER, SERVERS, SERVICES, SPARK
from .service import Service
from .spark import resolve_s3a_jars, resolve_spark_jars, s3a_jars_dir, spark_jars_dir
from .spark_cluster import cluster_services, external_master_probe

logger = logging.getLogger(__name__)


class LocalStack:
    """The project-local services, run as native processes bound to 127.0.0.1.

    Args:
        home: Folder for all downloads, data, logs and PID records. Defaults to
            ``$THREES_HOME`` or ``./.threes``, resolved when the object is created.
    """

    def __init__(self, home: Path | str | None = None) -> None:
        if home is None:
            home = os.environ.get("THREES_HOME") or ".threes"
        self.home = Path(home).expanduser().resolve()
        self.layout = Layout(self.home)
        self._services: dict[str, Service] = {cls.name: cls(self.layout) for cls in SERVERS}
        self._cluster = cluster_services(self.layout)

    # -- public API -----------------------------------------------------------------

    def endpoints(self) -> Endpoints:
        """Return the endpoints, with ``THREES_*`` environment overrides applied.

        When this folder has no CA file and Kafka runs from another folder, that folder's CA
        (none when it is not known: see :mod:`.discovery`).
        """
        endpoints = Endpoints.from_env(home=self.home)
        if not endpoints.tls_ca_location or Path(endpoints.tls_ca_location).is_file():
            return endpoints
        kafka = self._services["kafka"]
        if self._is_external(kafka) or kafka.running() is not None:
            return endpoints
        found = find(kafka, endpoints)
        return with_ca(endpoints, self.layout, found.home) if found.presence is Presence.ELSEWHERE else endpoints

    def up(
        self, services: Sequence[str] | None = None, *, brokers: int | None = None, kafka_port: int | None = None
    ) -> None:
        """Install what is missing, start what is down and wait until all are healthy.

        Idempotent: running services are only health-checked; stale PID records
        are cleaned; half-done installs are repaired. Services given by an
        environment override are not started, only waited for; a service without a
        PID record here whose port answers its health probe (started from another
        folder) is used as it is (:mod:`.discovery`).

        Args:
            services: Subset of :data:`SERVICES`; all of them when None (the Spark
                cluster only when ``spark`` is named).
            brokers: Kafka brokers to run (each also a KRaft controller); None keeps the
                recorded number (one on a new stack). A different number than the recorded
                one formats new Kafka storage (its topics are dropped); Kafka must be down.
            kafka_port: PLAINTEXT port of the first broker (see :mod:`.kafka_cluster`);
                None keeps the recorded one (19092 on a new stack).

        Raises:
            LocalStackError: Unknown service, a new Kafka shape while Kafka runs, a port held by
                something that is not the service, or one could not be installed, started or
                reached (one message covering every failure).
        """
        names = self._select(services)
        cluster = services is not None and SPARK in names
        self.layout.create()
        started = time.monotonic()
        errors: dict[str, str] = {}
        with self._lock():
            if "kafka" in names and not self._is_external(self._services["kafka"]):
                self._shape_kafka(brokers, kafka_port)
            endpoints = self.endpoints()
            threads = [
                threading.Thread(
                    target=self._up_one,
                    args=(name, endpoints, errors, cluster),
                    name=f"threes-up-{name}",
                    daemon=True,
                )
                for name in _START_ORDER
                if name in names
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if errors:
            raise LocalStackError("; ".join(errors[n] for n in _START_ORDER if n in errors))
        logger.info("local stack up in %.1f s (logs in %s)", time.monotonic() - started, self.layout.logs)

    def down(self, services: Sequence[str] | None = None) -> None:
        """Stop the processes this stack started (by their PID records).

        Each gets a graceful signal (PostgreSQL: ``pg_ctl stop -m fast``) and is
        killed after a timeout. Processes that are not ours are never touched.

        Args:
            services: Subset of :data:`SERVICES` (``spark``: the standalone cluster); all when None.

        Raises:
            LocalStackError: Unknown service.
        """
        names = self._select(services)
        if not self.layout.run.exists():
            return
        with self._lock():
            stopping = [svc for svc in self._servers(every_kafka_node=True) if svc.name.split("-")[0] in names]
            if SPARK in names:
                stopping += self._cluster
            threads = [
                threading.Thread(target=svc.stop, name=f"threes-down-{svc.name}", daemon=True) for svc in stopping
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    def status(self) -> list[ServiceStatus]:
        """Return the state of each server (:data:`SERVERS` in order, then the Spark cluster).

        A server without a PID record here that answers its health probe on its port is
        running, started elsewhere (:mod:`.discovery`).
        """
        endpoints = self.endpoints()
        return [status_of(svc, endpoints, self._is_external(svc)) for svc in [*self._servers(), *self._cluster]]

    def spark_s3a_jars(self) -> list[Path]:
        """Return hadoop-aws (Spark's Hadoop version) and the AWS SDK bundle, resolving them on first call.

        Append them to the driver's and the executors' class path, read in place
        (``stream_app.session``: ``SPARK_DIST_CLASSPATH``): the SDK bundle is ~560 MB,
        which ``spark.jars`` would copy into every executor of every application; on
        ``extraClassPath`` its unshaded slf4j 1.x would come before Spark's and
        silence Spark's logging.

        Raises:
            LocalStackError: If they are missing and Maven cannot resolve them.
        """
        target = s3a_jars_dir(self.layout)
        if target.is_dir():
            return sorted(target.glob("*.jar"))
        self.layout.create()
        with self._lock():
            return resolve_s3a_jars(self.layout)

    def spark_jars(self) -> list[Path]:
        """Return the Spark Kafka + Avro connector jars, resolving them on first call.

        Returns:
            Absolute paths of the jars (with their runtime dependencies not
            already in pyspark), usable as ``spark.jars`` offline.

        Raises:
            LocalStackError: If they are missing and Maven cannot resolve them.
        """
        target = spark_jars_dir(self.layout)
        if target.is_dir():
            return sorted(target.glob("*.jar"))
        self.layout.create()
        with self._lock():
            return resolve_spark_jars(self.layout)

    # -- internals ------------------------------------------------------------------

    def _kafka_nodes(self, every: bool = False) -> list[Kafka]:
        """The Kafka nodes of the recorded cluster; ``every``: also nodes left with a PID record."""
        shape = KafkaCluster.load(self.layout)
        count = shape.brokers
        if every:
            recorded = [n for n in range(2, MAX_BROKERS + 1) if self.layout.pid_file(shape.service_name(n)).exists()]
            count = max([count, *recorded])
            shape = KafkaCluster(count, shape.port)
        return [Kafka(self.layout, node, shape) for node in shape.nodes]

    def _servers(self, every_kafka_node: bool = False) -> list[Service]:
        """The servers in :data:`SERVERS` order, Kafka as its nodes."""
        result: list[Service] = []
        for svc in self._services.values():
            result += self._kafka_nodes(every_kafka_node) if svc.name == "kafka" else [svc]
        return result

    def _group(self, name: str) -> list[Service]:
        """The processes of server ``name``: Kafka's nodes, else the one server."""
        return list(self._kafka_nodes()) if name == "kafka" else [self._services[name]]

    def _shape_kafka(self, brokers: int | None, port: int | None) -> None:
        """Record the Kafka cluster's shape; a new one makes every node format new storage.

        Raises:
            LocalStackError: The shape changes while a node of the old one runs.
        """
        current = KafkaCluster.load(self.layout)
        wanted = KafkaCluster(brokers or current.brokers, port or current.port)
        if wanted != current:
            running = [node.name for node in self._kafka_nodes(every=True) if node.running() is not None]
            if running:
                raise LocalStackError(
                    f"Kafka runs with {current.brokers} broker(s) from port {current.port}; stop it before "
                    f"changing to {wanted.brokers} from port {wanted.port}: threes local down --service kafka"
                )
            nodes = [Kafka(self.layout, node, wanted) for node in range(1, MAX_BROKERS + 1)]
            if any((node.dir / ".formatted").exists() for node in nodes):
                logger.warning(
                    "kafka: %d broker(s) from port %d, was %d from port %d: formatting new KRaft storage "
                    "(the old topics are dropped)",
                    wanted.brokers,
                    wanted.port,
                    current.brokers,
                    current.port,
                )
            for node in nodes:  # a node's storage belongs to one quorum: format it again
                (node.dir / ".formatted").unlink(missing_ok=True)
        wanted.save(self.layout)
        self._services["kafka"] = Kafka(self.layout, 1, wanted)

    @staticmethod
    def _select(services: Sequence[str] | None) -> set[str]:
        if services is None:
            return set(SERVICES)
        if isinstance(services, str):
            services = [services]
        unknown = sorted(set(services) - set(SERVICES))
        if unknown:
            raise LocalStackError(f"unknown service(s) {', '.join(unknown)}; choose from {', '.join(SERVICES)}")
        return set(services)

    @staticmethod
    def _is_external(svc: Service) -> bool:
        return bool(os.environ.get(svc.env_var))

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise up/down across processes with ``run/stack.lock``."""
        self.layout.run.mkdir(parents=True, exist_ok=True)
        with (self.layout.run / "stack.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _up_one(self, name: str, endpoints: Endpoints, errors: dict[str, str], cluster: bool = False) -> None:
        began = time.monotonic()
        try:
            if name == SPARK:
                jars = resolve_spark_jars(self.layout)
                logger.info("spark: %d connector jars in %s", len(jars), spark_jars_dir(self.layout))
                if cluster:
                    resolve_s3a_jars(self.layout)
                    self._up_cluster(endpoints)
                return
            group = self._group(name)
            svc = group[0]
            address = svc.address(endpoints)
            if self._is_external(svc):
                logger.info("%s: using %s (from %s)", name, address, svc.env_var)
                wait_until(
                    lambda: svc.probe(endpoints),
                    timeout=svc.health_timeout,
                    what=f"{svc.title} at {address} (from {svc.env_var})",
                )
                return
            found = find(svc, endpoints)
            if found.presence is Presence.ELSEWHERE:
                logger.info("%s: using the one running at %s (started from another folder)", name, address)
                return
            if found.presence is Presence.HELD and found.port is not None:
                raise LocalStackError(held_message(svc.title, found.port, svc.env_var, found.pid, found.reason))
            records = [self._start(node) for node in group]  # every node before waiting: a quorum needs most
            svc.bootstrap()
            wait_until(
                lambda: svc.probe(endpoints),
                timeout=svc.health_timeout,
                what=svc.title,
                log=self._relative(svc.log),
                alive=lambda: all(node.alive(record) for node, record in zip(group, records, strict=True)),
            )
            logger.info(
                "%s: healthy at %s after %.1f s (pid %s, log %s)",
                name,
                address,
                time.monotonic() - began,
                ", ".join(str(record.pid) for record in records),
                self._relative(svc.log),
            )
        except LocalStackError as exc:
            errors[name] = str(exc)
        except Exception as exc:  # reported as one line, details in debug log
            logger.debug("%s failed", name, exc_info=True)
            errors[name] = f"{name}: unexpected error: {type(exc).__name__}: {exc}"

    @staticmethod
    def _start(svc: Service) -> PidRecord:
        """Start ``svc`` unless it runs (install, prepare, start); return its PID record."""
        record = svc.running()
        if record is None:
            svc.check_ports()
            svc.install()
            svc.prepare()
            return svc.start()
        logger.info("%s: already running (pid %d)", svc.name, record.pid)
        return record

    def _up_cluster(self, endpoints: Endpoints) -> None:
        """Start the master, wait for it, then the workers (they register with a running master)."""
        if os.environ.get("THREES_SPARK_MASTER"):
            logger.info("spark: using %s (from THREES_SPARK_MASTER)", endpoints.spark_master)
            wait_until(lambda: external_master_probe(endpoints.spark_master), timeout=30, what="Spark master")
            return
        master, *workers = self._cluster
        began = time.monotonic()
        for group in ([master], workers):
            records = {}
            for svc in group:
                if find(svc, endpoints).presence is Presence.ELSEWHERE:
                    logger.info("%s: using the one running (started from another folder)", svc.name)
                    continue
                record = svc.running()
                if record is None:
                    svc.check_ports()
                    record = svc.start()
                records[svc.name] = record
            for svc in group:
                wait_until(
                    functools.partial(svc.probe, endpoints),
                    timeout=svc.health_timeout,
                    what=svc.title,
                    log=self._relative(svc.log),
                    alive=functools.partial(svc.alive, records[svc.name]) if svc.name in records else None,
                )
        logger.info(
            "spark: cluster at %s with %d workers after %.1f s (logs %s)",
            endpoints.spark_master,
            len(workers),
            time.monotonic() - began,
            self._relative(self.layout.logs),
        )

    @staticmethod
    def _relative(path: Path) -> Path:
        try:
            return path.relative_to(Path.cwd())
        except ValueError:
            return path


def resolved_spark_jars() -> list[Path] | None:
    """The connector jars of the local stack (``THREES_HOME`` or ``.threes``) when resolved, else ``None``."""
    from .spark import spark_jars_dir

    stack = LocalStack()
    return stack.spark_jars() if spark_jars_dir(stack.layout).is_dir() else None
