"""Adaptive concurrency to a target: additive increase, multiplicative decrease (AIMD).

TCP congestion control's AIMD (RFC 5681), applied to requests in flight, the
way Netflix's ``concurrency-limits`` library and Envoy's adaptive concurrency
filter do: the limit grows by one slot per limit's worth of requests answered
quickly, and is halved when the target answers "too many requests" (HTTP 429, a
lock timeout) or when a request takes much longer than the fastest seen
recently (a queue is building up in the target).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class AdaptiveConcurrency:
    """A limit of requests in flight that adapts to the target's latency and backpressure.

    Args:
        name: the sink's name (logs).
        max_limit: the upper bound of requests in flight.
        initial: the starting limit (default: half of ``max_limit``, at least 1).
        slow_factor: a request is *slow* when its latency exceeds this many times
            what the best latency per record in the window predicts for its size...
        slow_floor_s: ...and exceeds this many seconds (fast targets jitter; a
            request under this is never slow).
        window: requests remembered for the best latency.
        cooldown_s: after a decrease, further decreases wait this long (requests
            already in flight answer late too; one decrease per congestion event, as TCP).
        on_change: called with the new limit whenever the integer limit changes
            (the metrics gauge).

    Thread-safe: worker threads call :meth:`slot`, the runtime reads :attr:`limit`.
    """

    def __init__(
        self,
        name: str,
        max_limit: int,
        *,
        initial: int | None = None,
        slow_factor: float = 4.0,
        slow_floor_s: float = 1.0,
        window: int = 50,
        cooldown_s: float = 1.0,
        on_change: Callable[[int], None] | None = None,
    ):
        if max_limit < 1:
            raise ValueError("max_limit must be >= 1")
        self.name = name
        self.max_limit = max_limit
        self.slow_factor = slow_factor
        self.slow_floor_s = slow_floor_s
        self.cooldown_s = cooldown_s
        self._last_decrease = float("-inf")
        self._window = window
        self._limit = float(initial if initial is not None else max(1, max_limit // 2))
        self._in_use = 0
        self._cond = threading.Condition()
        self._best: list[float] = []
        self._on_change = on_change
        if on_change:
            on_change(int(self._limit))

    @property
    def limit(self) -> int:
        """Requests allowed in flight now (at least 1)."""
        return max(1, int(self._limit))

    @property
    def in_use(self) -> int:
        """Requests in flight now."""
        return self._in_use

    def _decrease(self, why: str) -> None:
        now = time.monotonic()
        if now - self._last_decrease < self.cooldown_s:
            return
        self._last_decrease = now
        self._set(self._limit / 2, why)

    def _set(self, value: float, why: str) -> None:
        before = self.limit
        self._limit = min(float(self.max_limit), max(1.0, value))
        if self.limit != before:
            log.info("sink=%s concurrency %d -> %d (%s)", self.name, before, self.limit, why)
            if self._on_change:
                self._on_change(self.limit)
            self._cond.notify_all()

    @contextmanager
    def slot(self, records: int = 1) -> Iterator[None]:
        """Hold one request slot; blocks while ``limit`` requests are in flight.

        The latency of the block is recorded when it exits normally; an
        exception counts as no observation (the caller reports backpressure).

        Args:
            records: records the request carries (latency is compared per record).
        """
        with self._cond:
            while self._in_use >= self.limit:
                self._cond.wait()
            self._in_use += 1
        start = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._cond:
                self._in_use -= 1
                self._cond.notify()
            if ok:
                self.observe(time.monotonic() - start, records)

    def observe(self, latency_s: float, records: int = 1) -> None:
        """Record one answered request and adapt the limit.

        Args:
            latency_s: how long the request took, seconds.
            records: records it carried.
        """
        per_record = latency_s / max(1, records)
        with self._cond:
            self._best.append(per_record)
            if len(self._best) > self._window:
                del self._best[0]
            predicted = min(self._best) * max(1, records)
            if len(self._best) >= 3 and latency_s > max(self.slow_floor_s, self.slow_factor * predicted):
                self._decrease(f"slow answer {latency_s:.3f} s")
            else:
                self._set(self._limit + 1.0 / max(1.0, self._limit), "fast answers")

    def backpressure(self) -> None:
        """The target asked to slow down: halve the limit."""
        with self._cond:
            self._decrease("backpressure")
