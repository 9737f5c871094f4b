"""stream_app.python_worker.prepare: a zip on sys.path is read again only when its file changed."""

from __future__ import annotations

import importlib
import sys
import uuid
import zipfile
import zipimport
from pathlib import Path
from typing import Any

import pytest

from stream_app import python_worker

pytestmark = pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="Python 3.12 invalidates zip directories lazily: prepare() does nothing"
)


def _write_zip(path: Path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, source in modules.items():
            zf.writestr(f"{name}.py", source)


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, list[str]]:
    """A zip with one module, first on sys.path and imported; reads of its directory are recorded."""
    name = f"threes_zipped_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "code.zip"
    _write_zip(path, {name: "VALUE = 1\n"})
    monkeypatch.syspath_prepend(str(path))
    # restored after the test: prepare() replaces the method on the class
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches)
    reads: list[str] = []
    original = zipimport._read_directory  # type: ignore[attr-defined]

    def counting(archive: str) -> Any:
        reads.append(archive)
        return original(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counting)
    assert importlib.import_module(name).VALUE == 1
    yield path, name, reads
    sys.modules.pop(name, None)


def test_an_unchanged_zip_is_not_read_again_by_each_invalidation(archive: tuple[Path, str, list[str]]) -> None:
    path, _, reads = archive
    python_worker.prepare()
    python_worker.prepare()  # idempotent: one wrapper, not two
    reads.clear()
    for _ in range(5):  # what PySpark's worker does before every task
        importlib.invalidate_caches()
    assert reads.count(str(path)) == 1  # the first call per importer still reads; Python 3.11 alone reads 5 times


def test_a_changed_zip_is_read_again_and_its_new_module_imports(archive: tuple[Path, str, list[str]]) -> None:
    path, name, reads = archive
    python_worker.prepare()
    importlib.invalidate_caches()
    reads.clear()
    added = f"{name}_added"
    _write_zip(path, {name: "VALUE = 1\n", added: "VALUE = 2\n"})  # a new size and modification time
    importlib.invalidate_caches()
    assert reads.count(str(path)) == 1
    try:
        assert importlib.import_module(added).VALUE == 2
    finally:
        sys.modules.pop(added, None)


def test_without_prepare_every_invalidation_reads_the_whole_zip(archive: tuple[Path, str, list[str]]) -> None:
    """The cost prepare() removes (Python 3.10/3.11, CPython gh-103200)."""
    path, _, reads = archive
    reads.clear()
    for _ in range(3):
        importlib.invalidate_caches()
    assert reads.count(str(path)) == 3
