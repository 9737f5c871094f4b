"""A SparkSession for unit tests: no Kafka or other service, only the connector jars on the classpath.

It is the same session the integration tests use (``getOrCreate`` returns the
running one), so it carries the Kafka and Avro jars whichever suite starts it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from connectors.config.stream import SparkSettings
    from stream_app.session import spark_session
    from threes.local import LocalStack

    session = spark_session(
        SparkSettings(master="local[2]", app_name="threes-tests", driver_memory="2g"),
        jars=LocalStack().spark_jars(),
    )
    yield session
    session.stop()
