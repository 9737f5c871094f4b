"""A source process's part of the status document (:mod:`kernel.status.document`): its tasks, live.

``threes source`` serves it as ``/status.json``; ``threes status`` merges it with
the positions stored in the offsets topic.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kernel.status.document import now_iso

log = logging.getLogger(__name__)


_BEHIND_TTL_S = 10.0
_behind_cache: dict[int, tuple[float, int | None]] = {}


def records_behind(task: Any) -> int | None:
    """``task.records_behind()`` (rows the system holds past the task's read position), asked at most every 10 s."""
    ask = getattr(task, "records_behind", None)
    if ask is None:
        return None
    now = time.monotonic()
    cached = _behind_cache.get(id(task))
    if cached is not None and now - cached[0] < _BEHIND_TTL_S:
        return cached[1]
    value: int | None
    try:
        value = ask()
    except Exception as exc:  # a status read never fails
        log.debug("records behind unknown: %s", exc)
        value = None
    _behind_cache[id(task)] = (now, value)
    return value


def source_entries(worker: Any) -> list[dict[str, Any]]:
    """The source tasks of a live :class:`~connectors.runtime.standalone.SourceWorker`, for its ``/status``.

    ``records_behind`` is what the system holds past the task's read position
    (rows after the cursor of an RDS source; ``null`` where a connector cannot
    tell cheaply); ``in_flight`` the records produced and not yet acknowledged
    by the broker (what a crash now would read again).
    """
    restarts = worker.restarts()
    out = []
    for key, s in sorted(worker.stats().items()):
        runner = worker.runners.get(key)
        out.append({
            "connector": key.split("#", 1)[0], "task": key, "state": s.state, "position": s.position,
            "position_updated_at": None,
            "records_behind": records_behind(getattr(runner, "task", None)) if s.state != "failed" else None,
            "in_flight": max(0, s.produced - s.acked), "rows_read": s.rows_read,
            "acked": s.acked, "restarts": restarts.get(key, 0), "last_error": s.error,
        })
    return out


def source_document(worker: Any) -> dict[str, Any]:
    """The status document of a source process (its ``/status.json``)."""
    return {"generated_at": now_iso(), "sources": source_entries(worker), "snapshots": [], "sync": [],
            "endpoints": []}

