"""Client factories: the one place where threes builds clients from config.

Every part (sources, sync service, CLI checks, tests) gets its Kafka, SQL,
Elasticsearch and S3 clients here, so timeouts, credentials and loopback
settings are the same everywhere. The heavy client libraries are imported
inside the functions: the stream job never pulls in a database client.
"""

from __future__ import annotations

from typing import Any

from connectors.config.models import (
    ElasticsearchConnection,
    KafkaConfig,
    RdsConnection,
    S3Connection,
)
from connectors.exceptions import SetupError

FETCH_QUEUE_BACKOFF_MS = 50
"""librdkafka's ``fetch.queue.backoff.ms`` for threes' consumers (librdkafka's own default: 1000).

When a partition's prefetch queue passes ``queued.min.messages`` or ``queued.max.messages.kbytes``,
librdkafka waits this long before it fetches that partition again, however soon the application
drains the queue: with the default, a consumer working through a backlog stood still for about a
second each time its queue filled. Measured on the local broker (300k update records of ~100 bytes
in 4 partitions, one consumer draining as fast as it could): 1.28-1.30 s with 1000 ms (no record
for 0.95 s after the first 150k), 0.28-0.31 s with 10 or 50 ms. The queue's bounds, and so the
memory it holds, stay as they are: the fetcher only looks again sooner. ``kafka.client_config``
sets another value.
"""

CONSUMER_DEFAULTS: dict[str, Any] = {"fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS}
"""librdkafka properties of every consumer that reads records, under the pipeline's own ``kafka`` settings."""


def kafka_producer(kafka: KafkaConfig, **overrides: Any) -> Any:
    """An idempotent producer (``acks=all``, ``enable.idempotence``, lz4).

    Args:
        kafka: the pipeline's Kafka config.
        **overrides: librdkafka properties with ``.`` written as ``_``
            (``linger_ms=50`` -> ``linger.ms``).

    Returns:
        A :class:`confluent_kafka.Producer`.
    """
    from confluent_kafka import Producer

    conf = {
        **kafka.librdkafka_config(),
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": "lz4",
        "linger.ms": 20,
    }
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Producer(conf)


def kafka_consumer(kafka: KafkaConfig, group_id: str, **overrides: Any) -> Any:
    """A consumer with manual commits (offsets are committed by the caller, after durable work).

    Its fetcher looks again 50 ms after its prefetch queue was full (:data:`FETCH_QUEUE_BACKOFF_MS`).

    Args:
        kafka: the pipeline's Kafka config.
        group_id: the consumer group.
        **overrides: librdkafka properties with ``.`` written as ``_``.

    Returns:
        A :class:`confluent_kafka.Consumer`.
    """
    from confluent_kafka import Consumer

    conf = {
        **CONSUMER_DEFAULTS,
        **kafka.librdkafka_config(),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Consumer(conf)


def kafka_admin(kafka: KafkaConfig) -> Any:
    """An admin client for topic metadata and creation."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(kafka.librdkafka_config())


def sql_engine(conn: RdsConnection, **kwargs: Any) -> Any:
    """A SQLAlchemy engine with pre-ping and a connect timeout.

    Args:
        conn: the RDS connection config.
        **kwargs: passed to :func:`sqlalchemy.create_engine`.

    Returns:
        A :class:`sqlalchemy.engine.Engine`.

    Raises:
        SetupError: the URL's driver is not installed (one line: what to install).
    """
    from sqlalchemy import create_engine

    url = conn.sqlalchemy_url()
    connect_args: dict[str, Any] = {}
    if url.get_backend_name() in ("postgresql", "mysql", "mariadb"):
        connect_args["connect_timeout"] = int(max(1, conn.connect_timeout_s))
    options: dict[str, Any] = {"pool_pre_ping": True, "connect_args": connect_args}
    if url.get_backend_name() != "sqlite":
        options["pool_size"] = conn.pool_size
    options.update(kwargs)
    try:
        return create_engine(url, **options)
    except ImportError as exc:  # an optional driver: one line that says what to install
        raise SetupError(missing_driver_message(url.drivername, exc)) from exc


_DRIVER_EXTRAS = {"pymysql": "pip install 'threes[mysql]'", "mysqldb": "pip install mysqlclient",
                  "mariadbconnector": "pip install mariadb", "asyncmy": "pip install asyncmy"}


def missing_driver_message(drivername: str, exc: ImportError) -> str:
    """One line naming the missing database driver of ``drivername`` (``mysql+pymysql``) and how to get it."""
    module = getattr(exc, "name", None) or drivername.partition("+")[2] or drivername
    how = _DRIVER_EXTRAS.get(module.lower(), _DRIVER_EXTRAS.get(drivername.partition("+")[2], f"pip install {module}"))
    return f"the database driver {module!r} for {drivername} URLs is not installed: {how}"


def elasticsearch_client(conn: ElasticsearchConnection) -> Any:
    """An Elasticsearch client (major version 9) serializing JSON with orjson.

    orjson writes ``NaN``/``Infinity`` as ``null`` where the standard library
    would write invalid JSON that Elasticsearch refuses.

    Returns:
        An :class:`elasticsearch.Elasticsearch`.
    """
    from elasticsearch import Elasticsearch, OrjsonSerializer

    options: dict[str, Any] = {
        "request_timeout": conn.request_timeout_s,
        "verify_certs": conn.verify_certs,
        # orjson (a dependency) instead of the standard library's json: the bulk helper
        # serializes every action and document with it (elasticsearch-py, "Serializers")
        "serializer": OrjsonSerializer(),
    }
    if conn.ca_certs:
        options["ca_certs"] = conn.ca_certs
    if conn.api_key is not None:
        options["api_key"] = conn.api_key.get_secret_value()
    elif conn.username is not None:
        password = conn.password.get_secret_value() if conn.password else ""
        options["basic_auth"] = (conn.username, password)
    return Elasticsearch(conn.hosts, **options)


def s3_client(conn: S3Connection) -> Any:
    """A boto3 S3 client with adaptive retries.

    Returns:
        A ``botocore`` S3 client.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=conn.region,
        retries={"mode": "adaptive", "max_attempts": 5},
        s3={"addressing_style": "path" if conn.path_style else "auto"},
        connect_timeout=10,
        read_timeout=60,
    )
    return boto3.client(
        "s3",
        endpoint_url=conn.endpoint_url,
        aws_access_key_id=conn.access_key_id,
        aws_secret_access_key=conn.secret_access_key.get_secret_value() if conn.secret_access_key else None,
        aws_session_token=conn.session_token.get_secret_value() if conn.session_token else None,
        config=config,
    )
