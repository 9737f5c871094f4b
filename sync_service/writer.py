"""Run one batch through a sink in a worker thread: decode, write with retries, dead-letter.

The outcome goes back to the runtime's loop (:mod:`sync_service.service`),
which alone talks to the consumer (pause, resume, commit).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from tenacity import Retrying, retry_if_exception, wait_random_exponential

from connectors.api.sink import Sink
from connectors.api.sink_records import SinkBatch, SinkRecord
from kernel.config.policies import RetryPolicy
from kernel.dlq import DEFAULT_MESSAGE_MAX_BYTES, OMITTED_HEADER, DeadLetter
from kernel.exceptions import (
    FatalError,
    RetriableError,
    SinkBackpressureError,
    SinkBlockedError,
)
from kernel.supervision import StopRequested, retry_stop, stoppable_sleep
from schemas.columnar import ColumnarDecoder
from sync_service.batching import Job
from sync_service.decode import JobDecoder
from sync_service.isolation import write_isolating
from sync_service.metrics import SyncMetrics

log = logging.getLogger(__name__)

@dataclass
class Outcome:
    """What became of a job.

    Attributes:
        job: the job.
        status: ``"done"``, ``"backpressure"`` (write it again after ``retry_after``),
            ``"blocked"`` (the target refuses any record: the sink is opened again and the
            batch written again after a backoff, never dead-lettered) or ``"failed"`` (the
            sink's task failed: it is restarted with backoff).
        applied: records applied (``done``).
        dead: records dead-lettered (``done``).
        elapsed_s: wall time of this attempt, seconds.
        retry_after: seconds to wait (``backpressure``).
        error: the error (``backpressure``/``failed``).
        newest_timestamp_ms: Kafka timestamp of the newest applied record.
        tolerated: the error of a batch sent whole to the dead letter topic (``errors.tolerance: all``).
    """

    job: Job
    status: str
    applied: int = 0
    dead: int = 0
    elapsed_s: float = 0.0
    retry_after: float = 0.0
    error: BaseException | None = None
    newest_timestamp_ms: int = 0
    tolerated: BaseException | None = None


def _is_transient(exc: BaseException) -> bool:
    # backpressure is not retried here: the runtime pauses the partitions and
    # writes the batch again later, without a bound (quix-streams does the same)
    # neither is a blocked target: it waits for a GRANT or a migration, which may take longer than
    # the retry policy; the runtime waits for it without bound, partitions paused
    return isinstance(exc, RetriableError) and not isinstance(exc, (SinkBackpressureError, SinkBlockedError))


class BatchWriter:
    """Decodes and writes jobs of one sink; dead-letters what cannot be applied.

    Args:
        service: the sync service's name (``dlq.component`` is ``service/sink``).
        sink: the sink.
        deserializer: decodes keys and values (``AvroDeserializer``).
        producer: the dead letter producer (``confluent_kafka.Producer``, thread-safe).
        dead_letter_topic: where dead letters go.
        retry: the retry policy for transient errors.
        metrics: the service's metrics.
        stop_on_error: raise instead of dead-lettering a bad record.
        columnar: the columnar value decoder (shared by the service's writers); one on
            ``deserializer.resolver`` when ``None``.
        stop: the service's stop event: once set, a write's retries end (no attempt after it, a
            backoff it interrupts ends at once) and the batch fails uncommitted (``None``: never).
        dead_letter_max_bytes: the largest record the dead letter topic and ``producer`` take
            (:func:`kernel.dlq.dead_letter_limit`), bytes: a larger dead letter is written without
            its value (``dlq.omitted``), never refused.
    """

    def __init__(
        self,
        service: str,
        sink: Sink,
        deserializer: Any,
        producer: Any,
        dead_letter_topic: str,
        retry: RetryPolicy,
        metrics: SyncMetrics,
        stop_on_error: bool = False,
        columnar: ColumnarDecoder | None = None,
        stop: threading.Event | None = None,
        dead_letter_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
    ):
        self.service = service
        self.dead_letter_max_bytes = dead_letter_max_bytes
        self.stop = stop
        self.sink = sink
        self.deserializer = deserializer
        self.producer = producer
        self.dead_letter_topic = dead_letter_topic
        self.retry = retry
        self.metrics = metrics
        self.stop_on_error = stop_on_error
        self.component = f"{service}/{sink.name}"
        self.columnar = columnar or ColumnarDecoder(deserializer.resolver)
        self.decoder = JobDecoder(sink.name, sink.config.topics, deserializer, self.columnar)
        # set by the runtime when the sink's task failed: the next job closes and opens the sink first
        self.needs_open = False
        self._reopen_lock = threading.Lock()

    # -- decode (sync_service.decode) -------------------------------------------------------

    @property
    def decode_dlq_topics(self) -> set[str]:
        """The topics whose undecodable records this sink dead-letters (see :class:`JobDecoder`)."""
        return self.decoder.decode_dlq_topics

    def decode(self, job: Job) -> SinkBatch:
        """Decode the job's messages (:meth:`JobDecoder.decode`)."""
        return self.decoder.decode(job)

    def decode_one(self, msg: Any) -> SinkRecord:
        """Decode one message (:meth:`JobDecoder.decode_one`)."""
        return self.decoder.decode_one(msg)

    # -- write --------------------------------------------------------------------------------

    def run(self, job: Job) -> Outcome:
        """Write a job (called in a worker thread); never raises.

        Returns:
            The outcome for the runtime.
        """
        start = job.started_at = time.monotonic()
        job.thread_id = threading.get_ident()
        try:
            return self._run(job, start)
        finally:
            job.started_at = job.thread_id = None

    def _run(self, job: Job, start: float) -> Outcome:
        try:
            if self.needs_open:
                self._reopen()
            if job.decoded is None:
                job.decoded = self.decode(job)
            failures = self._write_with_retries(job.decoded, job)
            by_offset = {m.offset(): m for m in job.raw}
            for failure in failures:
                job.dead.append((by_offset[failure.record.offset], failure.error, "write"))
            if job.dead:
                if self.stop_on_error:
                    msg, exc, stage = job.dead[0]
                    raise FatalError(
                        f"{msg.topic()}[{msg.partition()}]@{msg.offset()} failed at {stage}: {exc} "
                        "(stop_on_error is set)"
                    ) from exc
                self._dead_letter(job.dead)
        except SinkBackpressureError as exc:
            return Outcome(job, "backpressure", retry_after=exc.retry_after, error=exc,
                           elapsed_s=time.monotonic() - start)
        except SinkBlockedError as exc:  # never tolerated: the records are not at fault
            return Outcome(job, "blocked", error=exc, elapsed_s=time.monotonic() - start)
        except StopRequested as exc:  # the service stops: the batch stays uncommitted, never dead-lettered
            return Outcome(job, "failed", error=exc, elapsed_s=time.monotonic() - start)
        except Exception as exc:  # every other failure fails the sink's task, reported once
            if self.sink.config.errors.tolerance == "all" and not self.stop_on_error and not self.needs_open:
                return self._tolerate(job, exc, start)
            return Outcome(job, "failed", error=exc, elapsed_s=time.monotonic() - start)
        applied = len(job.decoded.records) - sum(1 for _m, _e, stage in job.dead if stage == "write")
        newest = max((r.timestamp_ms for r in job.decoded.records), default=0)
        return Outcome(job, "done", applied=applied, dead=len(job.dead), elapsed_s=time.monotonic() - start,
                       newest_timestamp_ms=newest)

    def _reopen(self) -> None:
        """Restart the sink: close it and open it again (new connections); the failed batch is written next.

        Raises:
            Exception: whatever ``open`` raises (the sink stays to be reopened).
        """
        with self._reopen_lock:
            if not self.needs_open:
                return
            try:
                self.sink.close()
            except Exception as exc:  # the old connections are dropped either way
                log.debug("sink=%s close before restart failed: %s", self.sink.name, exc)
            self.sink.open()
            self.needs_open = False
            log.info("sink=%s reopened", self.sink.name)

    def _tolerate(self, job: Job, exc: BaseException, start: float) -> Outcome:
        """``errors.tolerance: all``: send every record of the failed batch to the dead letter topic and go on.

        Each record carries the batch's last error (``dlq.error.*`` headers, stage
        ``write``); the records already bound there (undecodable ones) keep their
        own error. If the dead letter topic does not acknowledge them, the batch
        fails like any other (nothing is committed past it).
        """
        already = {m.offset() for m, _e, _s in job.dead}
        dead = list(job.dead) + [(m, exc, "write") for m in job.raw if m.offset() not in already]
        log.error("sink=%s topic=%s partition=%d offsets=%d-%d failed after retries, %d record(s) to the dead "
                  "letter topic (errors.tolerance: all): %s", self.sink.name, job.topic, job.partition,
                  job.first_offset, job.last_offset, len(dead), exc)
        try:
            self._dead_letter(dead)
        except Exception as dlq_exc:  # reported as the batch's failure
            return Outcome(job, "failed", error=dlq_exc, elapsed_s=time.monotonic() - start)
        return Outcome(job, "done", applied=0, dead=len(dead), elapsed_s=time.monotonic() - start, tolerated=exc)

    def _write_with_retries(self, batch: SinkBatch, job: Job) -> list[Any]:
        if not batch.records:
            return []

        def before_sleep(state: Any) -> None:
            self.metrics.retries.labels(self.service, self.sink.name).inc()
            log.warning(
                "sink=%s topic=%s partition=%d offsets=%d-%d attempt=%d failed, retrying in %.2f s: %s",
                self.sink.name, batch.topic, batch.partition, batch.first_offset, batch.last_offset,
                state.attempt_number, state.next_action.sleep if state.next_action else 0.0,
                state.outcome.exception() if state.outcome else "",
            )

        # a stop of the service ends the streak: no attempt after it, and an interrupted backoff raises
        # StopRequested instead of starting the next attempt at once (the pool's shutdown waits for this thread)
        retrying = Retrying(
            stop=retry_stop(self.sink.config.errors, self.retry, self.stop),
            wait=wait_random_exponential(multiplier=self.retry.initial_backoff_s, max=self.retry.max_backoff_s),
            sleep=stoppable_sleep(self.stop),
            retry=retry_if_exception(_is_transient),
            before_sleep=before_sleep,
            reraise=True,
        )

        def write(part: SinkBatch) -> list[Any]:
            if self.sink.splits_requests:
                return self.sink.write(part)
            with self.sink.limiter.slot(len(part.records)):
                return self.sink.write(part)

        try:
            for attempt in retrying:
                with attempt:
                    job.attempts += 1
                    # records over max_record_bytes refused unsent, a refused write bisected, failures
                    # judged by blast radius (sync_service/isolation.py)
                    return write_isolating(write, batch, self.sink.max_record_bytes)
        except RetriableError as exc:
            if self.stop is not None and self.stop.is_set() and _is_transient(exc):
                raise StopRequested(f"sink {self.sink.name!r}: stop requested while retrying: {exc}") from exc
            raise
        return []  # pragma: no cover - Retrying either returns or raises

    # -- dead letters -------------------------------------------------------------------------

    def _dead_letter(self, dead: list[tuple[Any, BaseException, str]]) -> None:
        """Produce dead letters and wait for the broker's acknowledgement.

        Raises:
            RetriableError: the broker did not acknowledge them (the batch is not committed).
        """
        errors: list[Any] = []
        for msg, exc, stage in dead:
            where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
            text = str(exc) if where in str(exc) else f"{where}: {exc}"
            letter = DeadLetter(msg.topic(), msg.partition(), msg.offset(), stage, type(exc).__name__,
                                text[:4000], self.component)
            key, value, headers = letter.record(msg.key(), msg.value(), msg.headers(),
                                                max_bytes=self.dead_letter_max_bytes)
            omitted = dict(headers).get(OMITTED_HEADER)
            log.error("dead letter: %s[%d]@%d stage=%s %s: %s%s", msg.topic(), msg.partition(), msg.offset(),
                      stage, letter.error_class, letter.message,
                      f" (written without its {omitted.decode()}: larger than the dead letter topic's "
                      f"{self.dead_letter_max_bytes} bytes; `threes dlq replay` reads it from "
                      f"{msg.topic()} while the topic holds it)" if omitted else "")
            self.producer.produce(
                self.dead_letter_topic,
                key=key,
                value=value,
                headers=headers,
                on_delivery=lambda err, _m: errors.append(err) if err else None,
            )
        remaining = self.producer.flush(30.0)
        if remaining or errors:
            raise RetriableError(f"dead letters not acknowledged by {self.dead_letter_topic!r}: {errors or 'timeout'}")
        for _msg, _exc, stage in dead:
            self.metrics.dlq.labels(self.service, stage).inc()
