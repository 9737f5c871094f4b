"""The status document: what ``threes status``, ``/status`` and ``/status.json`` show.

Shape (JSON; offsets are Kafka offsets, ages seconds, times ISO 8601 UTC)::

    {"generated_at": "2026-11-23T21:00:00Z",
     "sources":   [{"connector", "task", "state", "position", "position_updated_at", "records_behind",
                    "rows_read", "acked", "restarts", "last_error"}],
     "snapshots": [{"job", "snapshot", "keys", "age_s", "offsets": [{"topic", "partition", "end_offset"}]}],
     "sync":      [{"service", "group", "state", "lag", "paused": [[topic, partition]], "dead_letters",
                    "restarts", "last_error",
                    "partitions": [{"topic", "partition", "committed", "end_offset", "lag", "paused"}],
                    "sinks": [{"sink", "type", "state", "restarts", "dead_letters", "last_error",
                               "oldest_pending_age_s"}]}],
     "endpoints": [{"url", "ok", "error"}]}

``state`` of a source task: ``starting``, ``running``, ``caught_up``,
``restarting``, ``failed``, ``stopped``, or ``unknown`` (no process endpoint
answered: only what Kafka stores is known). A sync service is ``starting``,
``waiting_for_partitions`` (subscribed, but the consumer group has not assigned
it a partition yet: not ready, e.g. while a restarted member waits out its old
session), ``running``, ``degraded`` (a sink restarting), ``restarting``,
``stopped`` or ``unknown``.
"""


from __future__ import annotations

import datetime as dt
import json
import urllib.request
from typing import Any


def now_iso() -> str:
    """The current UTC time, ISO 8601 with a ``Z``, second precision."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(ms: int | None) -> str | None:
    """Milliseconds since the epoch as ISO 8601 UTC with a ``Z`` (``None`` for ``None`` or 0)."""
    if not ms:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _request(url: str, token: str | None) -> urllib.request.Request:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return urllib.request.Request(url, headers=headers)  # operator-given http URL


def fetch_json(url: str, timeout_s: float = 3.0, token: str | None = None) -> dict[str, Any]:
    """GET a JSON document (with ``Authorization: Bearer <token>`` when a token is given).

    Raises:
        OSError: the endpoint did not answer (``urllib.error.URLError`` is one; a 401 is an ``HTTPError``).
        ValueError: the answer is not JSON.
    """
    with urllib.request.urlopen(_request(url, token), timeout=timeout_s) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


def fetch_text(url: str, timeout_s: float = 3.0, token: str | None = None) -> str:
    """GET a text document (Prometheus exposition format), with a bearer token when given.

    Raises:
        OSError: the endpoint did not answer.
    """
    with urllib.request.urlopen(_request(url, token), timeout=timeout_s) as resp:
        return str(resp.read().decode())

