"""Orchestration of the local stack: up, down, status, endpoints, Spark jars."""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .common import HOST, Layout, LocalStackError, wait_until
from .elasticsearch import HTTP_PORT, Elasticsearch
from .kafka import KAFKA_PORT, SASL_PASSWORD, SASL_SSL_PORT, SASL_USERNAME, Kafka
from .mysql import MYSQL_URL, MySQL
from .postgres import PG_DATABASE, PG_PASSWORD, PG_PORT, PG_USER, Postgres
from .s3 import ACCESS_KEY_ID, REGION, S3, S3_PORT, SECRET_ACCESS_KEY
from .service import Service
from .spark import resolve_s3a_jars, resolve_spark_jars, s3a_jars_dir, spark_jars_dir
from .spark_cluster import MASTER_URL, SparkMaster, cluster_services, external_master_probe
from .tls import tls_dir

logger = logging.getLogger(__name__)

SERVERS: tuple[type[Service], ...] = (Kafka, Postgres, Elasticsearch, S3, MySQL)
"""The stack's servers, the one list of them: ``threes local up|down|status|env``, the test
fixtures (``tests/conftest.py``) and ``threes docs`` read it. Listed in this order by
``status``; a new service is a :class:`~threes.local.service.Service` subclass added here."""

SPARK = "spark"
"""The name of the Spark part: connector jars, and the standalone cluster when named explicitly."""

SERVICES: tuple[str, ...] = (*(server.name for server in SERVERS), SPARK)
"""Every service name ``up`` accepts.

``spark`` named explicitly (``up --service spark``) resolves the Spark connector and
S3A jars and starts the standalone cluster (a master and two workers); a plain ``up``
only resolves the connector jars, so the demo and ``local[*]`` jobs do not pay for a
cluster they do not use.
"""

# Start order: the slowest to become healthy first (Elasticsearch), waited for in parallel;
# sorted() is stable, so servers of equal timeout keep the order of SERVERS.
_START_ORDER: tuple[str, ...] = (
    *(server.name for server in sorted(SERVERS, key=lambda server: -server.health_timeout)),
    SPARK,
)


@dataclass(frozen=True)
class Endpoints:
    """Where each service of the stack is reached.

    Attributes:
        kafka_bootstrap: Kafka ``bootstrap.servers`` (``host:port[,host:port]``).
        postgres_url: SQLAlchemy URL, ``postgresql+psycopg://user:password@host:port/db``.
        elasticsearch_url: Elasticsearch HTTP URL.
        s3_endpoint_url: S3 endpoint URL (path-style addressing).
        s3_access_key_id: S3 access key id.
        s3_secret_access_key: S3 secret access key.
        s3_region: S3 region name.
        mysql_url: SQLAlchemy URL of the MySQL-compatible server (MariaDB),
            ``mysql+pymysql://user:password@host:port/db?charset=utf8mb4``.
        spark_master: Master URL of the Spark standalone cluster (``spark://host:port``).
        kafka_sasl_bootstrap: ``host:port`` of the broker's SASL_SSL (SCRAM-SHA-512)
            listener; empty when Kafka is external and no SASL_SSL address was given.
        kafka_sasl_username: SCRAM user of that listener.
        kafka_sasl_password: Its password.
        tls_ca_location: PEM file of the CA that signed the stack's server
            certificates (Kafka SASL_SSL, PostgreSQL); clients verify against it.
    """

    kafka_bootstrap: str
    postgres_url: str
    elasticsearch_url: str
    s3_endpoint_url: str
    s3_access_key_id: str
    s3_secret_access_key: str
    s3_region: str = REGION
    mysql_url: str = MYSQL_URL
    spark_master: str = MASTER_URL
    kafka_sasl_bootstrap: str = f"{HOST}:{SASL_SSL_PORT}"
    kafka_sasl_username: str = SASL_USERNAME
    kafka_sasl_password: str = SASL_PASSWORD
    tls_ca_location: str = ""

    @classmethod
    def local(cls, home: Path | None = None) -> Endpoints:
        """Return the endpoints of the project-local services (no overrides).

        Args:
            home: The stack's folder (for the CA file); ``$THREES_HOME`` or ``./.threes`` when None.
        """
        if home is None:
            home = Path(os.environ.get("THREES_HOME") or ".threes").expanduser().resolve()
        return cls(
            kafka_bootstrap=f"{HOST}:{KAFKA_PORT}",
            postgres_url=(f"postgresql+psycopg://{PG_USER}:{PG_PASSWORD}@{HOST}:{PG_PORT}/{PG_DATABASE}"),
            elasticsearch_url=f"http://{HOST}:{HTTP_PORT}",
            s3_endpoint_url=f"http://{HOST}:{S3_PORT}",
            s3_access_key_id=ACCESS_KEY_ID,
            s3_secret_access_key=SECRET_ACCESS_KEY,
            s3_region=REGION,
            mysql_url=MYSQL_URL,
            spark_master=MASTER_URL,
            tls_ca_location=str(tls_dir(Layout(home)) / "ca.pem"),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, home: Path | None = None) -> Endpoints:
        """Return the local endpoints with ``THREES_*`` environment overrides applied.

        An external Kafka (``THREES_KAFKA_BOOTSTRAP``) has no SASL_SSL address
        unless ``THREES_KAFKA_SASL_BOOTSTRAP`` gives one.

        Args:
            environ: Mapping to read (defaults to ``os.environ``, read at call time).
            home: The stack's folder (see :meth:`local`).
        """
        env = os.environ if environ is None else environ
        base = cls.local(home)
        values = {field: env.get(var) or getattr(base, field) for field, var in ENV_VARS.items()}
        if env.get("THREES_KAFKA_BOOTSTRAP") and not env.get("THREES_KAFKA_SASL_BOOTSTRAP"):
            values["kafka_sasl_bootstrap"] = ""
        return cls(**values)

    def as_env(self) -> dict[str, str]:
        """Return the ``THREES_*`` variables that describe these endpoints.

        ``THREES_SPARK_MASTER`` only when it is set already: the standalone cluster is
        started on request (``--service spark``), and a config's
        ``${env:THREES_SPARK_MASTER:-local[2]}`` must not point at a cluster nobody started.
        """
        return {
            var: getattr(self, field)
            for field, var in ENV_VARS.items()
            if (field != "spark_master" or os.environ.get(var)) and getattr(self, field)
        }


TLS_CA_VAR = "THREES_TLS_CA"
"""The environment variable of the CA file, shared by every server with TLS (not one service's)."""

ENV_VARS: dict[str, str] = {
    **{field: var for server in (*SERVERS, SparkMaster) for field, var in server.endpoint_vars.items()},  # type: ignore[attr-defined]
    "tls_ca_location": TLS_CA_VAR,
}
"""Endpoints field -> environment variable that overrides it, from each service's ``endpoint_vars``."""


@dataclass(frozen=True)
class ServiceStatus:
    """State of one service.

    Attributes:
        name: Service name (``kafka``, ``postgres``, ``elasticsearch``, ``s3``, ``mysql``).
        running: Whether our process is alive (for an external service: whether it answers).
        pid: Our process id, None when not running or external.
        address: Where it is reached (no secrets).
        since: When our process was started (UTC), None when not running or external.
        log_path: The service's log file, None when external.
        external: True when an environment variable points at a service we do not run.
    """

    name: str
    running: bool
    pid: int | None
    address: str
    since: datetime | None
    log_path: Path | None
    external: bool


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
        """Return the endpoints, with ``THREES_*`` environment overrides applied."""
        return Endpoints.from_env(home=self.home)

    def up(self, services: Sequence[str] | None = None) -> None:
        """Install what is missing, start what is down and wait until all are healthy.

        Idempotent: running services are only health-checked; stale PID records
        are cleaned; half-done installs are repaired. Services given by an
        environment override are not started, only waited for.

        Args:
            services: Subset of :data:`SERVICES`; all of them when None (the Spark
                cluster only when ``spark`` is named).

        Raises:
            LocalStackError: Unknown service, or one could not be installed,
                started or reached (one message covering every failure).
        """
        names = self._select(services)
        cluster = services is not None and SPARK in names
        self.layout.create()
        started = time.monotonic()
        endpoints = self.endpoints()
        errors: dict[str, str] = {}
        with self._lock():
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
            stopping = [svc for svc in self._services.values() if svc.name in names]
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
        """Return the state of each server (:data:`SERVERS` in order, then the Spark cluster)."""
        endpoints = self.endpoints()
        result = []
        for svc in [*self._services.values(), *self._cluster]:
            name = svc.name
            address = svc.address(endpoints)
            if self._is_external(svc):
                try:
                    svc.probe(endpoints)
                    answering = True
                except Exception:  # noqa: BLE001 - any failure means "not answering"
                    answering = False
                result.append(ServiceStatus(name, answering, None, address, None, None, True))
                continue
            record = svc.running()
            result.append(
                ServiceStatus(
                    name=name,
                    running=record is not None,
                    pid=record.pid if record else None,
                    address=address,
                    since=record.started if record else None,
                    log_path=svc.log,
                    external=False,
                )
            )
        return result

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
            svc = self._services[name]
            address = svc.address(endpoints)
            if self._is_external(svc):
                logger.info("%s: using %s (from %s)", name, address, svc.env_var)
                wait_until(
                    lambda: svc.probe(endpoints),
                    timeout=svc.health_timeout,
                    what=f"{svc.title} at {address} (from {svc.env_var})",
                )
                return
            record = svc.running()
            if record is None:
                svc.check_ports()
                svc.install()
                svc.prepare()
                record = svc.start()
            else:
                logger.info("%s: already running (pid %d)", name, record.pid)
            svc.bootstrap()
            wait_until(
                lambda: svc.probe(endpoints),
                timeout=svc.health_timeout,
                what=svc.title,
                log=self._relative(svc.log),
                alive=lambda: svc.alive(record),
            )
            logger.info(
                "%s: healthy at %s after %.1f s (pid %d, log %s)",
                name,
                address,
                time.monotonic() - began,
                record.pid,
                self._relative(svc.log),
            )
        except LocalStackError as exc:
            errors[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - reported as one line, details in debug log
            logger.debug("%s failed", name, exc_info=True)
            errors[name] = f"{name}: unexpected error: {type(exc).__name__}: {exc}"

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
                    alive=functools.partial(svc.alive, records[svc.name]),
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
