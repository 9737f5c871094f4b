"""Fixtures of the supervision and status tests: headless Chromium (Debian's package) and its artefacts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT

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
