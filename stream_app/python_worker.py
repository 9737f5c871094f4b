"""What the job's code sets up once in each Spark Python worker process (the executors' side).

**Zip directories read again by every task (Python 3.10 and 3.11).** Before
each task, PySpark's worker calls ``importlib.invalidate_caches()`` so that
files added with ``addPyFile`` become importable (``pyspark.worker_util.
setup_spark_files``). On Python 3.10 and 3.11 that makes every
``zipimport.zipimporter`` on ``sys.path`` read its archive's whole central
directory again, eagerly (CPython issue gh-103200, fixed in 3.12 by making it
lazy). A Spark worker holds about fifteen of them over three large archives
(``pyspark.zip`` once per sub-package imported from it, the py4j zip, and the
``spark-core`` jar that Spark also puts on the workers' path), so each task
began with a re-read of them before its UDF ran (in a py-spy profile of the
executors' workers running this project's lookup UDF, more of a worker's samples
than the lookups themselves; ``python_worker`` in benchmarks/RESULTS.md). Spark fixed
the caller on its master branch (SPARK-54744: invalidate only when a new file
came), after the 4.0 release this project runs.

:func:`prepare` backports the 3.12 behaviour's effect without changing what is
importable: an importer reads its archive's directory again only when the
archive's file changed (inode, size or modification time differ from its last
read). The first call per importer still reads, so nothing read before
``prepare`` ran is trusted. Every UDF and worker function of the job calls it
first; it is a no-op on Python 3.12 and later, and after its first call in a
process.
"""

from __future__ import annotations

import os
import sys
import zipimport
from typing import Any

_MARK = "_threes_read_when_changed"
_STAT = "_threes_archive_stat"


def _archive_stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read_when_changed(original: Any) -> Any:
    def invalidate_caches(self: Any) -> None:
        stat = _archive_stat(self.archive)
        if stat is not None and getattr(self, _STAT, None) == stat:
            return  # the archive is the file this importer last read: its directory is still true
        original(self)
        setattr(self, _STAT, stat)

    invalidate_caches.__doc__ = original.__doc__
    setattr(invalidate_caches, _MARK, True)
    return invalidate_caches


def prepare() -> None:
    """Make per-task cache invalidation cheap in this Python worker (idempotent).

    On Python 3.10/3.11, replaces ``zipimport.zipimporter.invalidate_caches``
    (which reads the whole archive again on every call) by one that reads it
    again only when the archive's file changed. Python 3.12 and later: nothing.
    """
    if sys.version_info >= (3, 12):
        return
    current = zipimport.zipimporter.invalidate_caches
    if getattr(current, _MARK, False):
        return
    zipimport.zipimporter.invalidate_caches = _read_when_changed(current)  # type: ignore[method-assign]
