"""Concurrency to a sink's target: the :class:`Limiter` protocol and a fixed :class:`FixedLimiter`.

Part of the sink contract (:mod:`connectors.api.sink` re-exports both); the sync service's adaptive limiter
is :class:`sync_service.concurrency.AdaptiveConcurrency`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Limiter(Protocol):
    """Concurrency to a target: how many requests may be in flight (see ``sync_service.concurrency``)."""

    @property
    def limit(self) -> int:
        """Requests allowed in flight now."""

    def slot(self, records: int = 1) -> AbstractContextManager[None]:
        """Context manager held around one request; measures its latency."""

    def backpressure(self) -> None:
        """Report that the target asked to slow down (HTTP 429, lock timeout)."""


class FixedLimiter:
    """A :class:`Limiter` with a constant limit (tests, tools that run a sink alone).

    Args:
        limit: requests allowed in flight.
    """

    def __init__(self, limit: int = 1):
        self._limit = limit
        self._sem = threading.BoundedSemaphore(limit)

    @property
    def limit(self) -> int:
        """The constant limit."""
        return self._limit

    @contextmanager
    def slot(self, records: int = 1) -> Iterator[None]:
        """Hold one of ``limit`` slots for the duration of a request."""
        with self._sem:
            yield

    def backpressure(self) -> None:
        """Nothing to adapt."""


