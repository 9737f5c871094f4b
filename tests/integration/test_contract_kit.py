"""The contract kit from outside: a third-party connector package proves itself with no edit to threes.

``examples/thirdparty`` (``threes-jsonfile``: a JSON Lines source, a JSON file sink, a
``jsonfile`` connection) is installed with ``pip install -e --no-deps`` into a throwaway
virtualenv that sees the shared virtualenv's packages through a ``.pth`` file (as
``tests/unit/test_packaging.py`` does; pip's build isolation fetches setuptools). Its own
tests, subclasses of :class:`threes.testing.source.SourceContract` and
:class:`threes.testing.sink.SinkContract`, then run in a pytest of that virtualenv against the
real Kafka given by ``--threes-kafka``; and ``threes validate`` reads a pipeline that uses the
package's connectors, which only its entry points make known.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kernel.config.models import KafkaConfig
from tests.conftest import ROOT
from threes.testing.sink import SinkContract
from threes.testing.source import SourceContract

EXAMPLE = ROOT / "examples" / "thirdparty"


class Venv:
    """A throwaway virtualenv with threes-jsonfile installed; threes itself imported from this checkout."""

    def __init__(self, venv: Path, src: Path) -> None:
        self.python = venv / "bin" / "python"
        self.src = src
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST"))}
        self.env.update(PYTHONPATH=str(ROOT), PATH=f"{venv / 'bin'}:/usr/bin:/bin", COLUMNS="200")

    def run(self, *argv: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in argv], cwd=self.src, env={**self.env, **env}, capture_output=True,
                              text=True, timeout=600)

    def threes(self, *argv: str | Path) -> subprocess.CompletedProcess[str]:
        code = "import sys; from threes.cli import run; sys.argv[0] = 'threes'; run()"
        return self.run(self.python, "-c", code, *argv)


@pytest.fixture(scope="module")
def thirdparty(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    base = tmp_path_factory.mktemp("thirdparty")
    src = base / "threes-jsonfile"  # a copy: the editable install writes its egg-info beside the sources
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    shared = Path(sysconfig.get_path("purelib", vars={"base": sys.prefix, "platbase": sys.prefix})).resolve()
    target = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    # a plain path entry: the shared virtualenv's own .pth files (threes' editable install) are not processed,
    # so threes comes from PYTHONPATH (this checkout) and only the example's entry points are new
    (target / "shared-venv.pth").write_text(f"{shared}\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-deps", "-e", str(src)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return Venv(venv, src)


def test_the_example_package_passes_the_contract_kit_against_real_kafka(
    thirdparty: Venv, kafka: KafkaConfig, tmp_path: Path
) -> None:
    report = tmp_path / "junit.xml"
    # the plugin by name, entry-point plugins off: the shared virtualenv's threes metadata may or may not
    # declare pytest11 yet, and the plugin must be registered once
    result = thirdparty.run(
        thirdparty.python, "-m", "pytest", "-p", "threes.testing.plugin", "-p", "no:cacheprovider", "-q",
        "--threes-kafka", kafka.bootstrap_servers, f"--junitxml={report}", "tests",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    cases = ET.parse(report).getroot().iter("testcase")
    passed = {(c.get("classname", "").rsplit(".", 1)[-1], c.get("name")) for c in cases if len(c) == 0}
    contract = {("TestJsonfileSourceContract", n) for n in dir(SourceContract) if n.startswith("test_")}
    contract |= {("TestJsonfileSinkContract", n) for n in dir(SinkContract) if n.startswith("test_")}
    assert contract <= passed, sorted(contract - passed)


def test_the_kit_without_kafka_fails_and_says_how_to_give_it(thirdparty: Venv) -> None:
    result = thirdparty.run(
        thirdparty.python, "-m", "pytest", "-p", "threes.testing.plugin", "-p", "no:cacheprovider", "-q",
        "tests", "-k", "SourceContract and replay", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--threes-kafka" in result.stdout and "THREES_KAFKA_BOOTSTRAP" in result.stdout, result.stdout


def test_threes_validate_knows_the_plugged_in_connectors(thirdparty: Venv) -> None:
    ok = thirdparty.threes("validate", "examples/pipeline.yaml")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 source(s)" in ok.stdout and "1 sink(s)" in ok.stdout, ok.stdout

    # the package's models validate its keys: a typo is an error with its path, as for a built-in connector
    bad = thirdparty.src / "examples" / "typo.yaml"
    bad.write_text((thirdparty.src / "examples" / "pipeline.yaml").read_text().replace("    path: items", "    pth: items"))
    refused = thirdparty.threes("validate", bad)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "sources[0]" in refused.stdout + refused.stderr and "pth" in refused.stdout + refused.stderr
