"""Where each service of the local stack is reached: :class:`Endpoints`, with ``THREES_*`` overrides."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .common import HOST, Layout
from .elasticsearch import HTTP_PORT
from .kafka import SASL_PASSWORD, SASL_SSL_PORT, SASL_USERNAME
from .kafka_cluster import KafkaCluster
from .mysql import MYSQL_URL
from .postgres import PG_DATABASE, PG_PASSWORD, PG_PORT, PG_USER
from .registry import ENV_VARS
from .s3 import ACCESS_KEY_ID, REGION, S3_PORT, SECRET_ACCESS_KEY
from .spark_cluster import MASTER_URL
from .tls import tls_dir


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
        kafka_sasl_bootstrap: ``host:port[,host:port]`` of the brokers' SASL_SSL (SCRAM-SHA-512)
            listeners; empty when Kafka is external and no SASL_SSL address was given.
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

        Kafka's are every broker of the recorded cluster (``threes local up --brokers N``).

        Args:
            home: The stack's folder (for the CA file); ``$THREES_HOME`` or ``./.threes`` when None.
        """
        if home is None:
            home = Path(os.environ.get("THREES_HOME") or ".threes").expanduser().resolve()
        kafka = KafkaCluster.load(Layout(home))
        return cls(
            kafka_bootstrap=kafka.bootstrap(),
            kafka_sasl_bootstrap=kafka.sasl_bootstrap(),
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
