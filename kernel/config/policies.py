"""The policies connectors and services share: topic creation, retries, errors and restarts, batching."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from kernel.config.fields import StrictModel


class TopicSpec(StrictModel):
    """How a topic is created when it is missing."""

    partitions: int = Field(1, ge=1)
    replication_factor: int | None = Field(
        None,
        ge=1,
        description="replicas when created; default kafka.internal_replication_factor, else min(3, number of "
        "brokers) (schemas.kafka_admin.replication_settings)",
    )
    configs: dict[str, str] = Field(
        default_factory=dict,
        description="topic configs, e.g. min.insync.replicas (default kafka.internal_min_insync_replicas, else 2 "
        "with three replicas, 1 below)",
    )
    compatibility: Literal[
        "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"
    ] = Field(
        "BACKWARD",
        description="schema evolution rule of the topic's value schema, a schema registry's levels, checked by the "
        "Apache Avro library when the source starts with a new schema (BACKWARD: the new schema reads the latest "
        "version's data); an incompatible schema stops the source before it produces anything",
    )


class RetryPolicy(StrictModel):
    """Retries with jittered exponential backoff (tenacity ``wait_random_exponential``).

    How long transient errors are retried is the connector's ``errors.retry_timeout_s``
    (:class:`ErrorPolicy`); ``max_attempts`` is an optional extra bound.
    """

    max_attempts: int | None = Field(
        None, ge=1, description="attempts per failure streak; default: bounded by errors.retry_timeout_s only"
    )
    initial_backoff_s: float = Field(0.2, gt=0)
    max_backoff_s: float = Field(30.0, gt=0)


class ErrorPolicy(StrictModel):
    """What a connector does when an operation fails (Kafka Connect's ``errors.*`` settings).

    Transient errors (a target or the source system unreachable, a timeout) are
    retried with the retry policy's backoff for ``retry_timeout_s``. After that,
    and for errors that no retry cures:

    * ``tolerance: none`` (default): the task stops and the supervisor restarts it
      in process after ``restart_backoff_s`` (doubling per consecutive failure up to
      ``restart_max_backoff_s``); it resumes from its stored position (source) or
      the failing batch (sink), so offsets never pass a batch that was not written.
    * ``tolerance: all`` (sinks): the batch's records go to the dead letter topic
      with the last error in their headers and the sink goes on with the next batch.
      Sources: a row or change that cannot be encoded (a value its Avro type cannot
      carry) goes to the source's ``dead_letter_topic`` and the position moves past
      it; every other failure still stops the task. Under ``none`` such a row stops
      the source without restarts (it would stop on the same row again).
    """

    retry_timeout_s: float = Field(
        300.0,
        description="how long transient errors are retried before the task fails, seconds; -1 retries forever "
        "(Kafka Connect's errors.retry.timeout)",
    )
    tolerance: Literal["none", "all"] = Field(
        "none",
        description="after the retries: none stops the task (restarted with backoff), all sends the batch's "
        "records to the dead letter topic and goes on (sinks); sources: all sends a row that cannot be encoded "
        "to the source's dead_letter_topic and moves on, none stops the source at it (not restarted: it would "
        "stop there again)",
    )
    restart_backoff_s: float = Field(1.0, gt=0, description="delay before the first restart of a failed task, s")
    restart_max_backoff_s: float = Field(60.0, gt=0, description="longest delay between restarts, seconds")

    @field_validator("retry_timeout_s")
    @classmethod
    def _timeout_or_forever(cls, value: float) -> float:
        if value != -1 and value < 0:
            raise ValueError("retry_timeout_s is a number of seconds >= 0, or -1 (retry forever)")
        return value

    @property
    def retries_forever(self) -> bool:
        """``True`` when ``retry_timeout_s`` is -1."""
        return self.retry_timeout_s == -1

    def restart_delay_s(self, failures: int) -> float:
        """Delay before restart number ``failures`` (1-based) of a task, seconds: exponential, capped."""
        return min(self.restart_max_backoff_s, self.restart_backoff_s * 2.0 ** max(0, failures - 1))


class BatchPolicy(StrictModel):
    """When a batch is flushed: whichever limit is reached first."""

    max_records: int = Field(10_000, ge=1)
    max_bytes: int = Field(16 * 1024 * 1024, ge=1)
    max_age_ms: int = Field(1_000, ge=1)
    flush_when_idle: bool = Field(
        True,
        description="also cut a batch as soon as a poll returns fewer records than asked for (the input is "
        "drained for now) instead of waiting for max_age_ms; while a partition's batch is in flight its next "
        "one still grows",
    )


