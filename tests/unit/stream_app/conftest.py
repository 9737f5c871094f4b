"""A SparkSession for unit tests: no Kafka or other service, only the connector jars on the classpath.

It is the session the integration tests use (``tests.conftest.SPARK_SESSIONS``,
one per process), so it carries the same class path whichever suite starts it,
and it is a running local[2] session even after a cluster test switched masters.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import SPARK_SESSIONS


@pytest.fixture
def spark() -> Any:
    return SPARK_SESSIONS.get(SPARK_SESSIONS.LOCAL)
