"""The sync service's status document and gauges, and the warning about writes that run too long."""

from __future__ import annotations

import logging
import sys
import time
import traceback
from typing import Any

from kernel.updates import source_ts_of
from sync_service.state import ServiceState, SinkSlot

# the service's log lines keep the logger name they always had
log = logging.getLogger("sync_service.service")

STUCK_WRITE_WARN_S = 60.0
"""A batch written for longer than this (s) is logged as a warning with its worker thread's stack, then again
each time as long again passes: a target that accepts connections but never answers shows in the log (the
clients' own timeouts and retries can hold one write for minutes)."""


class ServiceStatus(ServiceState):
    """The status document, pending ages, long writes (a mixin of ``SyncService``)."""

    def _warn_long_writes(self, now: float | None = None) -> list[Any]:
        """Log each batch written for over :data:`STUCK_WRITE_WARN_S`, with where its worker thread is.

        Returns:
            The jobs warned about this time.
        """
        now = time.monotonic() if now is None else now
        frames = None
        warned = []
        for slot in self.slots:
            for buf in slot.buffers.values():
                job = buf.inflight
                if job is None:
                    continue
                started = job.started_at  # read once: the worker thread clears it when the write returns
                if started is None or now - started < STUCK_WRITE_WARN_S or now - job.warned_at < STUCK_WRITE_WARN_S:
                    continue
                job.warned_at = now
                frames = sys._current_frames() if frames is None else frames  # the documented way
                frame = frames.get(job.thread_id) if job.thread_id is not None else None
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(thread not found)\n"
                log.warning("sink=%s topic=%s partition=%d offsets=%d-%d write in flight for %.0f s (attempt %d); "
                            "its thread is at:\n%s", slot.sink.name, job.topic, job.partition, job.first_offset,
                            job.last_offset, now - started, job.attempts, stack.rstrip())
                warned.append(job)
        return warned

    def _write_in_flight_s(self, slot: SinkSlot, now: float) -> float | None:
        starts = [b.inflight.started_at for b in slot.buffers.values()
                  if b.inflight is not None and b.inflight.started_at is not None]
        return round(now - min(starts), 3) if starts else None

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The service's part of the status document (thread-safe: a copy made by the loop every second).

        Returns:
            ``{"service", "group", "state", "restarts", "lag", "dead_letters", "last_error", "paused":
            [[topic, partition]...], "partitions": [{"topic", "partition", "committed", "end_offset", "lag",
            "paused"}...], "sinks": [{"sink", "state", "restarts", "dead_letters", "last_error",
            "oldest_pending_age_s", "write_in_flight_s"}...]}``; offsets are Kafka offsets, ages seconds
            (``write_in_flight_s``: how long its longest running write has run, ``None`` when none runs).
            A sink's ``state`` is ``running``, ``restarting``, ``recovering`` or ``blocked`` (its target
            refuses any record; ``last_error`` then reads ``blocked: <what the target said>``).
        """
        return self._status_doc

    def _pending_age_s(self, slot: SinkSlot, now: float) -> float:
        oldest: float | None = None
        for buf in slot.buffers.values():
            msg = buf.first_pending()
            if msg is None:
                continue
            ts_ms = source_ts_of(msg.headers())
            if ts_ms is None:
                ts_ms = msg.timestamp()[1]
            if ts_ms > 0 and (oldest is None or ts_ms < oldest):
                oldest = ts_ms
        return 0.0 if oldest is None else max(0.0, now - oldest / 1000.0)

    def _update_status(self, state: str | None = None) -> None:
        """Refresh the pending-age and state gauges and the status document (the loop's thread, every second)."""
        self._last_status = time.monotonic()
        now = time.time()
        name = self.config.name
        sinks = []
        for slot in self.slots:
            age = self._pending_age_s(slot, now)
            self.metrics.oldest_pending_age.labels(name, slot.sink.name).set(age)
            for st in ("running", "restarting", "recovering"):
                self.metrics.sink_state.labels(name, slot.sink.name, st).set(1 if slot.state == st else 0)
            sinks.append({
                "sink": slot.sink.name, "type": slot.sink.config.type,
                "state": "blocked" if slot.blocked and slot.state != "running" else slot.state,
                "restarts": slot.backoff.restarts if slot.backoff else 0, "dead_letters": slot.dead_letters,
                "last_error": slot.last_error, "oldest_pending_age_s": round(age, 3),
                "write_in_flight_s": self._write_in_flight_s(slot, time.monotonic()),
                "next_restart_in_s": round(max(0.0, slot.restart_at - time.monotonic()), 1)
                if slot.state == "restarting" else None,
            })
        partitions = []
        for tp in sorted(self._assigned):
            committed = self._committed.get(tp)
            high = self._highs.get(tp)
            partitions.append({
                "topic": tp[0], "partition": tp[1], "committed": committed, "end_offset": high,
                "lag": None if high is None else max(0, high - (committed or 0)), "paused": tp in self._paused,
            })
        errors = [s["last_error"] for s in sinks if s["state"] != "running" and s["last_error"]]
        if state is None and self.operator.active:
            inflight = any(b.inflight is not None for slot in self.slots for b in slot.buffers.values())
            state = "pausing" if inflight else "paused"  # paused: nothing in flight, nothing handed to a sink
        if state is None and not self._assigned:
            state = "waiting_for_partitions"  # not ready: the group has not given this member partitions (yet)
        if state is None:
            state = "running" if all(s["state"] == "running" for s in sinks) else "degraded"
        self._status_doc = {
            "service": name, "group": self.config.consumer_group(), "state": state,
            "restarts": int(self.metrics.value("threes_sync_service_restarts_total")),
            "lag": sum(p["lag"] or 0 for p in partitions), "dead_letters": sum(s["dead_letters"] for s in sinks),
            "last_error": errors[0] if errors else None,
            "paused": [list(tp) for tp in sorted(self._paused)], "partitions": partitions, "sinks": sinks,
        }

