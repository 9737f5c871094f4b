"""The local stack's services, one registry: the servers, the Spark part, their start order and variables.

Every reader derives from :data:`SERVERS`: ``threes local up|down|status|env``
(:class:`~threes.local.stack.LocalStack`), the endpoints (:class:`~threes.local.endpoints.Endpoints`),
the test fixtures and ``threes docs``.
"""

from __future__ import annotations

from .elasticsearch import Elasticsearch
from .kafka import Kafka
from .mysql import MySQL
from .postgres import Postgres
from .s3 import S3
from .service import Service
from .spark_cluster import SparkMaster

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


TLS_CA_VAR = "THREES_TLS_CA"
"""The environment variable of the CA file, shared by every server with TLS (not one service's)."""

ENV_VARS: dict[str, str] = {
    **{field: var for server in (*SERVERS, SparkMaster) for field, var in server.endpoint_vars.items()},  # type: ignore[attr-defined]
    "tls_ca_location": TLS_CA_VAR,
}
"""Endpoints field -> environment variable that overrides it, from each service's ``endpoint_vars``."""
