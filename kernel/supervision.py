"""Supervision of tasks: how long transient errors are retried, and restarts of failed tasks.

Kafka Connect's model (KIP-298 ``errors.retry.timeout``, ``errors.tolerance``):
an operation that fails with a transient error is retried with jittered
exponential backoff until the connector's ``errors.retry_timeout_s`` has passed
(``-1``: forever); the task then fails. A failed task is not left dead: its
supervisor restarts it in process after an exponential backoff
(``errors.restart_backoff_s`` doubling up to ``errors.restart_max_backoff_s``),
and it resumes from its stored position (sources) or its first uncommitted
record (sinks). Other tasks and services never stop for it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from tenacity import stop_after_attempt, stop_after_delay, stop_any, stop_never, stop_when_event_set

from kernel.config.policies import ErrorPolicy, RetryPolicy

TASK_STATES = ("starting", "running", "caught_up", "restarting", "failed", "stopped")
"""Every state a supervised task can be in (the ``state`` label of the task state gauges)."""


class StopRequested(Exception):  # not an error: the process was asked to stop
    """A retry loop was left because its stop event was set (SIGTERM / Ctrl-C), not because it failed.

    Raised by :func:`stoppable_sleep` so a backoff interrupted by a stop ends the loop
    instead of starting the next attempt at once (``Event.wait`` returns at once once the
    event is set: a sleep that only waited on it would turn the backoff into a hot loop).
    """


def stoppable_sleep(stop: threading.Event | None) -> Any:
    """A tenacity ``sleep`` that waits on ``stop`` and raises :class:`StopRequested` once it is set.

    Args:
        stop: the stop event of the loop (``None``: plain :func:`time.sleep`).

    Returns:
        A callable ``(seconds) -> None``.

    Raises:
        StopRequested: (from the callable) ``stop`` is set, before or during the sleep.
    """
    if stop is None:
        return time.sleep

    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise StopRequested("stop requested during a retry backoff")

    return sleep


def retry_stop(errors: ErrorPolicy, retry: RetryPolicy, stop: threading.Event | None = None) -> Any:
    """The tenacity stop condition of a failure streak.

    Args:
        errors: the connector's error policy (``retry_timeout_s``, -1 for never).
        retry: the retry policy (``max_attempts`` bounds the streak too when set).
        stop: the loop's stop event: once set, no further attempt is made (the last
            error is raised, or :class:`StopRequested` from :func:`stoppable_sleep`).

    Returns:
        A tenacity ``stop`` strategy.
    """
    stops: list[Any] = [stop_when_event_set(stop)] if stop is not None else []
    if not errors.retries_forever:
        stops.append(stop_after_delay(errors.retry_timeout_s))
    if retry.max_attempts is not None:
        stops.append(stop_after_attempt(retry.max_attempts))
    if not stops:
        return stop_never
    return stops[0] if len(stops) == 1 else stop_any(*stops)


def describe_retry(errors: ErrorPolicy, retry: RetryPolicy) -> str:
    """How long a streak is retried, for log lines (``"for 300 s"``, ``"forever"``)."""
    parts = ["forever" if errors.retries_forever else f"for {errors.retry_timeout_s:g} s"]
    if retry.max_attempts is not None:
        parts.append(f"at most {retry.max_attempts} attempts")
    return ", ".join(parts)


class RestartBackoff:
    """Consecutive failures of one task and the delay before its next restart.

    Args:
        errors: the connector's error policy (restart delays).

    Attributes:
        restarts: restarts so far (never reset: the metric and ``threes status`` show it).
        failures: consecutive failures (reset by :meth:`succeeded`).
        last_error: text of the last failure.
        next_restart: ``time.time()`` of the next restart, or ``None``.
    """

    def __init__(self, errors: ErrorPolicy):
        self.errors = errors
        self.restarts = 0
        self.failures = 0
        self.last_error: str | None = None
        self.next_restart: float | None = None

    def failed(self, error: BaseException | str) -> float:
        """Count a failure; returns the delay before the restart, seconds."""
        self.failures += 1
        self.last_error = str(error)
        delay = self.errors.restart_delay_s(self.failures)
        self.next_restart = time.time() + delay
        return delay

    def restarting(self) -> None:
        """Count the restart that is starting now."""
        self.restarts += 1
        self.next_restart = None

    def succeeded(self) -> None:
        """The task made progress: the next failure waits the initial delay again."""
        self.failures = 0

    def wait(self, stop: threading.Event, delay_s: float) -> bool:
        """Sleep ``delay_s`` unless ``stop`` is set first; ``True`` when the restart should go ahead."""
        return not stop.wait(delay_s)
