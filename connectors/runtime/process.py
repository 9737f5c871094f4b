"""Process-wide settings of a long-running part (a source, the sync service, the stream job's driver).

CPython's cyclic garbage collector runs a collection every 700 net allocations
of container objects (``gc.get_threshold()`` ``(700, 10, 10)``), and a full
collection walks every tracked object alive. The data path allocates a few
objects per record (consumed ``confluent_kafka.Message`` objects, which the
collector tracks; ``SinkRecord``; the rows a source encodes) while it holds
tens of thousands of records in its buffers, so with the default thresholds
a sync service spent about half its CPU in collections that find nothing:
records are freed by reference counting, not by the cycle collector.
Measured with ``benchmarks/sync_sinks.py --only pg`` (10k-record batches, 4
partitions): the PostgreSQL sink at 40.4k rows/s with the defaults, 73.4k with
a first-generation threshold of 200,000 (``gc_threshold_0``).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_GC_THRESHOLD_0 = 200_000
"""Net allocations of tracked objects between two young collections (CPython's default: 700)."""

GC_ENV = "THREES_GC_THRESHOLD_0"
"""Overrides :data:`DEFAULT_GC_THRESHOLD_0`; ``0`` keeps CPython's own thresholds."""


def tune_gc(threshold_0: int | None = None) -> tuple[int, int, int]:
    """Set the collector's thresholds for a data-path process; freeze what start-up allocated.

    The objects alive after start-up (modules, configs, clients) move to the
    permanent generation (``gc.freeze``), so no collection walks them again.
    Cyclic garbage is still collected, later: records are acyclic and freed by
    reference counting, so memory does not grow by this.

    Args:
        threshold_0: the first generation's threshold; ``None`` reads
            ``THREES_GC_THRESHOLD_0`` (default :data:`DEFAULT_GC_THRESHOLD_0`);
            ``0`` leaves CPython's thresholds as they are.

    Returns:
        The thresholds now in force (``gc.get_threshold()``).

    Raises:
        ValueError: ``THREES_GC_THRESHOLD_0`` is not a non-negative integer.
    """
    if threshold_0 is None:
        raw = os.environ.get(GC_ENV, "").strip()
        try:
            threshold_0 = int(raw) if raw else DEFAULT_GC_THRESHOLD_0
        except ValueError:
            raise ValueError(f"{GC_ENV}={raw!r}: expected a non-negative integer") from None
        if threshold_0 < 0:
            raise ValueError(f"{GC_ENV}={raw!r}: expected a non-negative integer")
    if threshold_0:
        _young, older, oldest = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(threshold_0, older, oldest)
    log.debug("gc thresholds %s, %d objects frozen", gc.get_threshold(), gc.get_freeze_count())
    return gc.get_threshold()


PANDAS_ENV = "THREES_SYNC_PANDAS"
"""``1`` lets pandas load in a sync service process (a plugin sink of the user's that needs it)."""


class _KeptOut:
    """A ``sys.meta_path`` finder that refuses a top-level package: its import raises ``ModuleNotFoundError``."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        """Refuse ``package`` and its modules; leave every other import to the next finders."""
        if fullname == self.package or fullname.startswith(self.package + "."):
            raise ModuleNotFoundError(f"{fullname} is kept out of this process ({PANDAS_ENV}=1 lets it load)",
                                      name=fullname)


def keep_pandas_out() -> bool:
    """Keep pandas from loading in a process whose code never uses it (the sync service).

    pyarrow imports pandas on its first call (``pa.array``, ``to_numpy``...) whenever it is
    installed, to recognise pandas objects; pandas is a dependency of threes (the stream job
    uses it), so every sync service process held it, a large share of its peak RSS
    (``pandas_import_mb`` of ``sync_sinks/rss`` in benchmarks/RESULTS.md). A finder first in ``sys.meta_path`` makes
    ``import pandas`` raise ``ModuleNotFoundError``, and pyarrow and polars go on as if pandas
    were not installed (a ``None`` in ``sys.modules`` would not do: pyarrow's compiled import
    takes it for the module). Call it at the start of the process.

    Returns:
        ``True`` when pandas is kept out; ``False`` when it is loaded already or
        ``THREES_SYNC_PANDAS=1`` lets it load.
    """
    if "pandas" in sys.modules or os.environ.get(PANDAS_ENV, "").strip() == "1":
        return False
    if not any(isinstance(f, _KeptOut) for f in sys.meta_path):
        sys.meta_path.insert(0, _KeptOut("pandas"))
    log.debug("pandas kept out of this process (%s=1 lets it load)", PANDAS_ENV)
    return True
