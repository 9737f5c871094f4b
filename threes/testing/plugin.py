"""The contract kit's pytest plugin: where Kafka is, unique names, and the cleanup of the topics tests made.

Registered as ``[project.entry-points.pytest11] threes = "threes.testing.plugin"``: pytest loads
it in any environment where threes is installed. It imports only pytest at start-up (the
Kafka and config models load when a fixture first needs them), so it costs nothing to test
suites that do not use the kit.

Options, each with an environment variable for CI (the option wins):

* ``--threes-kafka HOST:PORT[,HOST:PORT]`` / ``THREES_KAFKA_BOOTSTRAP``: the brokers;
* ``--threes-kafka-config FILE`` / ``THREES_KAFKA_CONFIG``: a YAML file holding the pipeline's
  ``kafka:`` section (:class:`~kernel.config.models.KafkaConfig`: security protocol, SASL,
  CA file...), for brokers that need more than an address; ``${env:NAME}`` is resolved, so
  the password stays out of the file. ``--threes-kafka`` then only replaces its
  ``bootstrap_servers``;
* ``--threes-keep-topics``: do not delete the topics at the end of the session.

Without a Kafka address the kit's tests fail with a message saying how to give one: a
contract that was not run must not look like one that passed.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kernel.config.models import KafkaConfig

logger = logging.getLogger(__name__)

BOOTSTRAP_ENV = "THREES_KAFKA_BOOTSTRAP"
CONFIG_ENV = "THREES_KAFKA_CONFIG"


class _Drawn:
    """What the session's tests drew: name suffixes and the Kafka config, for the cleanup at the end."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.kafka_conf: dict[str, Any] | None = None


DRAWN = _Drawn()
"""The process's suffixes and Kafka config (one pytest session per process, or per pytest-xdist worker)."""


def draw_unique() -> str:
    """A short unique suffix (10 hex digits) for topic, table, index and bucket names.

    Every topic whose name holds a suffix drawn here is deleted when the session ends
    (unless ``--threes-keep-topics``): a long-lived development cluster would otherwise gain
    a topic or two per test run.
    """
    token = uuid.uuid4().hex[:10]
    DRAWN.tokens.add(token)
    return token


def remember_kafka(conf: dict[str, Any]) -> None:
    """Note the librdkafka config of the session's Kafka, for the cleanup of its topics."""
    DRAWN.kafka_conf = conf


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the kit's options (module docstring)."""
    group = parser.getgroup("threes", "threes connector contract kit")
    group.addoption("--threes-kafka", dest="threes_kafka", default=None, metavar="HOST:PORT",
                    help=f"Kafka bootstrap servers the contract tests use (default ${BOOTSTRAP_ENV})")
    group.addoption("--threes-kafka-config", dest="threes_kafka_config", default=None, metavar="FILE",
                    help=f"YAML file of the kafka: section (security, SASL, CA) (default ${CONFIG_ENV})")
    group.addoption("--threes-keep-topics", dest="threes_keep_topics", action="store_true", default=False,
                    help="keep the topics the contract tests created")


def kafka_config_from(bootstrap: str | None, config_file: str | None) -> KafkaConfig:
    """The Kafka config the kit's tests use.

    Args:
        bootstrap: ``host:port[,host:port]``, or ``None``.
        config_file: a YAML file of a ``kafka:`` section, or ``None``.

    Returns:
        The file's config with ``bootstrap`` as its brokers when both are given; a plaintext
        config of ``bootstrap`` when only it is.

    Raises:
        ConfigError: the file is missing or invalid (every problem, with its line).
        ValueError: neither is given.
    """
    from kernel.config.loader import load_yaml_model
    from kernel.config.models import KafkaConfig

    if config_file:
        kafka = load_yaml_model(KafkaConfig, config_file)
        return kafka.model_copy(update={"bootstrap_servers": bootstrap}) if bootstrap else kafka
    if bootstrap:
        return KafkaConfig(bootstrap_servers=bootstrap)
    raise ValueError(
        f"the threes contract tests need Kafka: pass --threes-kafka HOST:PORT (or set {BOOTSTRAP_ENV}), "
        f"and --threes-kafka-config FILE (or {CONFIG_ENV}) for a broker that needs security settings"
    )


@pytest.fixture(scope="session")
def threes_kafka(pytestconfig: pytest.Config) -> KafkaConfig:
    """The pipeline-level Kafka config of the cluster under test (options and variables: module docstring)."""
    bootstrap = pytestconfig.getoption("threes_kafka", None) or os.environ.get(BOOTSTRAP_ENV) or None
    config_file = pytestconfig.getoption("threes_kafka_config", None) or os.environ.get(CONFIG_ENV) or None
    try:
        return kafka_config_from(bootstrap, config_file)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def threes_kafka_conf(threes_kafka: KafkaConfig) -> dict[str, Any]:
    """The librdkafka properties of :func:`threes_kafka` (secrets revealed: for clients only)."""
    conf = threes_kafka.librdkafka_config()
    remember_kafka(conf)
    return conf


@pytest.fixture
def threes_unique() -> str:
    """A short unique suffix for this test's names (topics, tables, indices, buckets, folders)."""
    return draw_unique()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Delete the topics whose names hold a suffix this session drew (unless ``--threes-keep-topics``)."""
    conf, tokens = DRAWN.kafka_conf, DRAWN.tokens
    if not conf or not tokens or session.config.getoption("threes_keep_topics", False):
        return
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient(conf)
        names = [t for t in admin.list_topics(timeout=10).topics if any(token in t for token in tokens)]
        for future in admin.delete_topics(names, operation_timeout=30).values() if names else ():
            future.result()
    except Exception as exc:  # cleanup only: the tests' outcome stands
        logger.warning("could not delete the test topics: %s", exc)
