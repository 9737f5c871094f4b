"""Fixtures of the operations tests: headless Chromium (Debian's package) and its artefacts, a three-broker cluster."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.ops.brokers import BrokerCluster, link_jars

ARTIFACTS = Path(os.environ.get("THREES_ARTIFACTS", ROOT / ".threes" / "artifacts"))


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's ``chromium``, installed with apt-get on first use (as the local stack installs
    PostgreSQL); a machine where it cannot be installed fails the test with the command to run."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    from threes.local.system import apt_install

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    apt_install("chromium", title="Chromium (status page tests)", missing="chromium not found",
                env_var="PATH", log=ARTIFACTS / "apt-chromium.log")
    found = shutil.which("chromium")
    assert found, "apt-get installed chromium but it is not on PATH"
    return found


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where tests keep artefacts (screenshots): ``.threes/artifacts`` or ``$THREES_ARTIFACTS``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    """A three-broker cluster of its own (``threes local up --brokers 3`` in a tmp folder), stopped after."""
    home = tmp_path_factory.mktemp("kafka3")
    link_jars(home)
    cluster = BrokerCluster(home)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
