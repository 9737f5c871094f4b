"""The project's code as a zip for the executors: what ``spark-submit --py-files`` ships.

On a cluster the executors' Python workers import ``stream_app`` (UDFs, the
snapshot's worker-side index) and what it imports (``schemas``,
``kernel``). Nothing guarantees the package is installed where the
executors run, and an installed copy may be another version than the
driver's, so the driver zips the packages it imported itself and ships the zip
with ``SparkContext.addPyFile`` (Spark's "Python Package Management" docs:
``--py-files`` / ``spark.submit.pyFiles`` / ``addPyFile``). Each Python worker
puts it first on its ``sys.path`` (``pyspark.worker`` inserts the files of
``addPyFile`` at position 1), so the shipped code wins over any installed copy.

Third-party dependencies (pyarrow, pandas, fastavro, xxhash...) are not in
the zip: they have native code, and belong in the executors' Python
environment (``spark.pyspark.python``, or a packed virtualenv shipped with
``spark.archives``; see ``docs/operations.md``).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import logging
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGES = ("stream_app", "schemas", "kernel")
"""Top-level packages the executors may import: the job and everything it imports from this project."""

_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same code gives the same bytes (and the same name)


def package_dir(name: str) -> Path:
    """Return the folder a top-level package is imported from in this process.

    Raises:
        ImportError: the package cannot be found, or is not a regular folder (a namespace or a zip).
    """
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if len(locations) != 1 or not Path(locations[0]).is_dir():
        raise ImportError(f"cannot ship package {name!r}: found at {locations or 'nowhere'}, expected one folder")
    return Path(locations[0])


def build_code_zip(target_dir: Path | str | None = None, packages: Sequence[str] = PACKAGES) -> Path:
    """Zip the packages' folders (sources and package data, no bytecode) for ``addPyFile``.

    Args:
        target_dir: folder of the zip (default: a new temporary folder, removed when this
            process exits: Spark serves the file to executors for the application's lifetime).
        packages: top-level package names; each lands at the zip's root (``stream_app/...``).

    Returns:
        The zip's path, ``threes-code-<first 12 hex digits of its SHA-256>.zip``: the name
        changes with the content, so a new version never collides with a file Spark
        already distributed under the old name.

    Raises:
        ImportError: a package is not a folder this process imports from.
    """
    if target_dir is None:
        target = Path(tempfile.mkdtemp(prefix="threes-pyfiles-"))
        atexit.register(shutil.rmtree, target, ignore_errors=True)
    else:
        target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    tmp = target / "threes-code.zip.tmp"
    files = 0
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in packages:
            root = package_dir(name)
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root.parent)
                if path.is_dir() or _SKIP_DIRS & set(rel.parts) or path.name.endswith(_SKIP_SUFFIXES):
                    continue
                info = zipfile.ZipInfo(rel.as_posix(), date_time=_EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
                files += 1
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()[:12]
    out = target / f"threes-code-{digest}.zip"
    tmp.replace(out)
    log.info(
        "code zip for the executors path=%s packages=%s files=%d bytes=%d",
        out,
        ",".join(packages),
        files,
        out.stat().st_size,
    )
    return out
