"""The code zip shipped to the executors: the project's packages as imported, deterministic."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from stream_app.pyfiles import PACKAGES, build_code_zip, package_dir


def test_zip_holds_the_packages_sources_and_data_without_bytecode(tmp_path):
    first = build_code_zip(tmp_path / "a")
    with zipfile.ZipFile(first) as zf:
        names = set(zf.namelist())
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names
    assert "stream_app/snapshot/indexed.py" in names  # what the executors' UDFs import
    assert any(n.startswith("schemas/") and n.endswith(".avsc") for n in names)  # package data too
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    root = package_dir("stream_app").parent
    with zipfile.ZipFile(first) as zf:
        assert zf.read("stream_app/job.py") == (root / "stream_app" / "job.py").read_bytes()
    # the same code gives the same bytes and name (content-addressed)
    second = build_code_zip(tmp_path / "b")
    assert first.name == second.name and first.read_bytes() == second.read_bytes()
    assert first.name.startswith("threes-code-") and Path(first).suffix == ".zip"


def test_a_temporary_zip_folder_is_removed_when_the_process_exits():
    code = "from stream_app.pyfiles import build_code_zip; print(build_code_zip())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    zipped = Path(out.strip().splitlines()[-1])
    assert zipped.name.startswith("threes-code-")
    assert not zipped.parent.exists()  # one folder per driver start would pile up in /tmp otherwise


def test_the_executors_modules_import_from_the_zip_alone(tmp_path):
    """What the UDFs import on an executor comes from the zip, and never needs the ``threes`` tool package.

    The child has no repository on its path and no editable install (``-S``: site's ``.pth`` files are not
    read), only the zip and the third-party libraries; a ``threes`` import raises there.
    """
    import sysconfig

    zipped = build_code_zip(tmp_path)
    code = "\n".join([
        "import sys",
        f"sys.path[:] = [{str(zipped)!r}, *[p for p in sys.path if 'site-packages' not in p], "
        f"{sysconfig.get_paths()['purelib']!r}, {sysconfig.get_paths()['platlib']!r}]",
        "import importlib.abc",
        "class NoTool(importlib.abc.MetaPathFinder):",
        "    def find_spec(self, name, path=None, target=None):",
        "        if name == 'threes' or name.startswith('threes.'):",
        "            raise ModuleNotFoundError(name)",
        "sys.meta_path.insert(0, NoTool())",
        "import stream_app.python_worker, stream_app.snapshot.mapped, stream_app.snapshot.indexed",
        "import stream_app.enrich, stream_app.records",
        "print(stream_app.snapshot.mapped.__file__)",
    ])
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(zipped))
