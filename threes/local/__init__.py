"""The real local stack without Docker: Kafka, PostgreSQL, Elasticsearch, S3, MariaDB and Spark jars.

Services run as native processes bound to 127.0.0.1 only, on fixed
non-default ports (Kafka 19092, PostgreSQL 15432, Elasticsearch 19200, s3proxy
18090, MariaDB 13306). Every download, data file, log and PID record lives under one folder,
``$THREES_HOME`` or ``./.threes``.

Example:
    >>> from threes.local import LocalStack
    >>> stack = LocalStack()
    >>> stack.up(["kafka", "postgres"])          # doctest: +SKIP
    >>> stack.endpoints().kafka_bootstrap         # doctest: +SKIP
    '127.0.0.1:19092'

Set ``THREES_KAFKA_BOOTSTRAP``, ``THREES_POSTGRES_URL``,
``THREES_ELASTICSEARCH_URL``, ``THREES_MYSQL_URL`` or ``THREES_S3_ENDPOINT_URL`` (with
``THREES_S3_ACCESS_KEY_ID``/``THREES_S3_SECRET_ACCESS_KEY``) to use services
that already run elsewhere: ``up`` then only waits for them. Without them, a service
this folder did not start but whose port answers its health probe is the stack started
from another folder, used as it is (:mod:`threes.local.discovery`).
"""

from .common import LocalStackError
from .endpoints import Endpoints
from .registry import ENV_VARS, SERVERS, SERVICES
from .spark import local_spark_conf
from .stack import LocalStack, ServiceStatus

__all__ = [
    "ENV_VARS",
    "SERVERS",
    "SERVICES",
    "Endpoints",
    "LocalStack",
    "LocalStackError",
    "ServiceStatus",
    "local_spark_conf",
]
