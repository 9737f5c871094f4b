"""Shared fixtures: the real local stack and clients built through the project's own factories.

Integration tests talk to real Kafka, PostgreSQL, Elasticsearch and an S3
server. By default the session starts the native local stack
(``threes local up``: idempotent, quick when it already runs). Environment
variables point the tests at services that already run instead
(``THREES_KAFKA_BOOTSTRAP``, ``THREES_POSTGRES_URL``, ``THREES_ELASTICSEARCH_URL``,
``THREES_S3_ENDPOINT_URL``, ``THREES_MYSQL_URL`` ...; see ``threes local env``).

Every test gets unique names (topics, tables, indices, buckets) so tests never
see each other's data and need no cleanup between them. At the end of the
session the Kafka topics named after those suffixes are deleted (by the contract
kit's plugin, :mod:`threes.testing.plugin`): a developer's long-lived local stack
would otherwise gain ~100 topics per run (a broker of ~1,000 leftover topics spent
~18 % of a core with nothing running).

The contract kit's fixtures (``threes_kafka``, ``threes_unique``) are this stack's here.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.elasticsearch.connection import ElasticsearchConnection, elasticsearch_client
from connectors.rds import connection as rds_connection
from connectors.rds.connection import RdsConnection
from connectors.s3.connection import S3Connection, s3_client
from kernel.config.models import KafkaConfig
from threes.testing.plugin import draw_unique, remember_kafka

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Register the contract kit's plugin when pytest did not load it through its entry point.

    An installed threes declares it (``pytest11: threes``), but a virtualenv installed from an
    older checkout, or ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``, has no such entry point: the
    plugin is then registered here, under the same name, so it is never registered twice.
    """
    if not config.pluginmanager.has_plugin("threes"):
        config.pluginmanager.register(importlib.import_module("threes.testing.plugin"), "threes")


def sql_engine(conn: RdsConnection) -> Iterator[Any]:
    """The project's SQLAlchemy engine of ``conn``, disposed when the fixture that yields from this ends."""
    engine = rds_connection.sql_engine(conn)
    yield engine
    engine.dispose()


# Tests that use these fixtures share one Spark standalone cluster (two 1-core workers: one application
# at a time) or compare outputs across masters within one process: under pytest-xdist they run in one
# worker, one after another.
CLUSTER_FIXTURES = frozenset({"spark_cluster_master", "cluster_spark", "outputs_by_master"})
CLUSTER_GROUP = "spark-cluster"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by folder (integration/ and e2e/ need the stack) and group them for pytest-xdist.

    ``make test`` runs the suite in two pytest-xdist workers with ``--dist loadgroup``: a
    module's tests stay in one worker (its module-scoped fixtures, such as a whole pipeline
    run, are built once), and the tests of the Spark cluster form one group (see
    ``CLUSTER_FIXTURES``). Tests marked ``serial`` stop shared services; they run after the
    others, alone (``pytest -m serial``).
    """
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts[0] in ("integration", "e2e"):
            item.add_marker(pytest.mark.integration)
        if parts[0] == "e2e":
            item.add_marker(pytest.mark.e2e)
        if not any(item.iter_markers("xdist_group")):
            cluster = CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ()))
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP if cluster else item.nodeid.split("::")[0]))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Refuse what parallel workers would break: a ``serial`` test, or a test pytest-xdist did not group.

    A ``serial`` test stops services other tests are using. A test without its group
    suffix (``nodeid@group``) under ``--dist loadgroup`` would share the Spark cluster or a
    module's fixtures with another worker: pytest-xdist drops the groups silently when
    pytest's node ids change under it (pytest-dev/pytest-xdist#1386).
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    if item.get_closest_marker("serial"):
        pytest.fail(
            "this test stops shared services of the local stack: run it alone, `pytest -m serial` without -n "
            "(make test runs the others in parallel first, then these)",
            pytrace=False,
        )
    if item.config.getvalue("loadgroup") and "@" not in item.nodeid.rsplit("]", 1)[-1]:
        pytest.fail(
            "pytest-xdist did not group this test (--dist loadgroup): this pytest and pytest-xdist do not work "
            "together (pytest-dev/pytest-xdist#1386); install the versions pyproject.toml pins",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def stack() -> Any:
    """The running local stack (started if needed); its endpoints via ``.endpoints()``."""
    from threes.local import SERVERS, LocalStack

    local = LocalStack()
    local.up([server.name for server in SERVERS])  # every server; the Spark cluster only for the tests that ask
    return local


@pytest.fixture(scope="session")
def endpoints(stack: Any) -> Any:
    return stack.endpoints()


@pytest.fixture(scope="session")
def kafka(endpoints: Any) -> KafkaConfig:
    """The pipeline-level Kafka config of the test stack."""
    return KafkaConfig(bootstrap_servers=endpoints.kafka_bootstrap)


@pytest.fixture(scope="session")
def kafka_conf(kafka: KafkaConfig) -> dict[str, Any]:
    """librdkafka properties of the test stack."""
    conf = kafka.librdkafka_config()
    remember_kafka(conf)
    return conf


@pytest.fixture(scope="session")
def threes_kafka(kafka: KafkaConfig) -> KafkaConfig:
    """The contract kit's Kafka: the test stack's (``THREES_KAFKA_BOOTSTRAP`` still points it elsewhere)."""
    return kafka


@pytest.fixture(scope="session")
def pg(endpoints: Any) -> RdsConnection:
    return RdsConnection(type="rds", url=endpoints.postgres_url)


@pytest.fixture(scope="session")
def pg_engine(pg: RdsConnection) -> Iterator[Any]:
    yield from sql_engine(pg)


@pytest.fixture(scope="session")
def mysql(endpoints: Any) -> RdsConnection:
    """The stack's MariaDB (MySQL dialect), database ``threes``."""
    return RdsConnection(type="rds", url=endpoints.mysql_url)


@pytest.fixture(scope="session")
def mysql_engine(mysql: RdsConnection) -> Iterator[Any]:
    yield from sql_engine(mysql)


@pytest.fixture(scope="session")
def es_conn(endpoints: Any) -> ElasticsearchConnection:
    return ElasticsearchConnection(type="elasticsearch", hosts=[endpoints.elasticsearch_url])


@pytest.fixture(scope="session")
def es(es_conn: ElasticsearchConnection) -> Iterator[Any]:
    client = elasticsearch_client(es_conn)
    yield client
    client.close()


@pytest.fixture(scope="session")
def s3_conn(endpoints: Any) -> S3Connection:
    return S3Connection(
        type="s3",
        endpoint_url=endpoints.s3_endpoint_url,
        region=endpoints.s3_region,
        access_key_id=endpoints.s3_access_key_id,
        secret_access_key=endpoints.s3_secret_access_key,
        path_style=True,
    )


@pytest.fixture(scope="session")
def s3(s3_conn: S3Connection) -> Any:
    return s3_client(s3_conn)


@pytest.fixture
def unique() -> str:
    """A short unique suffix for names of topics, tables, indices and buckets (the kit's ``threes_unique``)."""
    return draw_unique()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the SparkSession (the kit's plugin deletes the session's topics; see the module docstring).

    (A run of unit tests alone has no ``spark_sessions`` fixture to stop the session.)
    """
    SPARK_SESSIONS.close()


@pytest.fixture
def topic(unique: str) -> str:
    return f"test.{unique}"


class SparkSessions:
    """The test process's one SparkSession (Spark allows one per process): local[2], or on a cluster.

    Tests ask for a master; a session on another master is stopped first. The
    first session starts the JVM, so every session carries the driver's class path
    for ``s3a://`` (hadoop-aws and the AWS SDK bundle) and the Kafka and Avro
    connectors, whichever test and master come first: unit and integration tests
    share this one object (``SPARK_SESSIONS``), in whatever order a pytest-xdist
    worker runs them.
    """

    LOCAL = "local[2]"

    def __init__(self) -> None:
        self.session: Any = None
        self.master: str | None = None

    def get(self, master: str = LOCAL) -> Any:
        """The running session on ``master``, started (and any other stopped) when needed."""
        from stream_app.session import spark_session
        from stream_app.spark_settings import SparkSettings
        from threes.local import LocalStack

        if self.session is not None and self.master == master and self.session.sparkContext._jsc is not None:
            return self.session
        self.close()
        jars = LocalStack()  # the jars only: resolving them starts no service
        lookup = Path(__file__).parents[1] / "stream_app" / "jars" / "threes-lookup.jar"  # make jvm (realtime mode)
        self.session = spark_session(
            SparkSettings(master=master, app_name="threes-tests", driver_memory="2g"),
            jars=[*jars.spark_jars(), *([lookup] if lookup.is_file() else [])],
            local_jars=jars.spark_s3a_jars(),
        )
        self.master = master
        return self.session

    def close(self) -> None:
        """Stop the current session, if any."""
        if self.session is not None:
            self.session.stop()
        self.session, self.master = None, None


SPARK_SESSIONS = SparkSessions()


@pytest.fixture(scope="session")
def spark_sessions(stack: Any) -> SparkSessions:
    """The process's SparkSession, switched between local[2] and the standalone cluster on demand.

    ``pytest_sessionfinish`` stops it, for unit tests too.
    """
    return SPARK_SESSIONS


@pytest.fixture
def spark(spark_sessions: SparkSessions) -> Any:
    """The local[2] SparkSession of the test session, with the Kafka and Avro connectors (started once)."""
    return spark_sessions.get(SparkSessions.LOCAL)


@pytest.fixture(autouse=True)
def _pandas_allowed_after_each_test() -> Iterator[None]:
    """Undo ``keep_pandas_out`` after a test that ran a sync service's entry point in this process.

    The finder it installs refuses ``import pandas`` for the rest of the process (what a sync service
    wants); a later test in the same pytest worker that needs pandas through pyarrow would fail
    depending on the order the workers were given.
    """
    yield
    import sys

    from connectors.runtime.process import _KeptOut

    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _KeptOut)]
