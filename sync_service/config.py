"""Config of the sync services (``sync:`` in connector config YAML).

The ``sinks`` field is added by :func:`threes.config.pipeline_model`
as a discriminated union of the registered sink config models.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from kernel.config.endpoints import metrics_endpoint_problem
from kernel.config.fields import Name, StrictModel, TopicName
from kernel.config.models import SinkConnectorConfig
from kernel.config.policies import BatchPolicy, RetryPolicy


class SyncServiceBase(StrictModel):
    """A sync service: one consumer group writing update topics to targets."""

    name: Name
    # narrowed by threes.config.pipeline_model() to the registered sinks' discriminated union
    sinks: list[SinkConnectorConfig] = Field(default_factory=list)
    group_id: str | None = Field(None, description="consumer group; default threes-sync-<name>")
    batch: BatchPolicy = Field(default_factory=BatchPolicy)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    buffer_max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="bound of consumed record bytes held: librdkafka's prefetch queue (an eighth) + "
        "buffered + in-flight records",
    )
    dead_letter_topic: TopicName
    stop_on_error: bool = Field(False, description="stop instead of sending a bad record to the DLQ")
    group_instance_id: str | None = Field(
        None,
        description="static membership (KIP-345): a stable id per replica, e.g. ${env:HOSTNAME}; "
        "a restart within session.timeout.ms then causes no rebalance",
    )
    max_poll_interval_ms: int = Field(
        300_000, ge=10_000, description="librdkafka max.poll.interval.ms; the service polls every 100 ms"
    )
    session_timeout_ms: int = Field(
        45_000, ge=1_000, description="librdkafka session.timeout.ms: a member silent this long is evicted"
    )
    revoke_timeout_s: float = Field(
        60.0, gt=0, description="on revoke, how long in-flight writes may take before the commit"
    )
    metrics_port: int | None = Field(None, ge=1, le=65535)
    metrics_host: str = Field("127.0.0.1", description="address metrics_port binds; any other than loopback needs "
                              "metrics_token")
    metrics_token: SecretStr | None = Field(None, description="bearer token every request to metrics_port must carry "
                                            "(Authorization: Bearer ...), e.g. ${env:THREES_METRICS_TOKEN}")

    @model_validator(mode="after")
    def _poll_interval_covers_session(self) -> SyncServiceBase:
        if self.max_poll_interval_ms < self.session_timeout_ms:
            raise ValueError("max_poll_interval_ms must be >= session_timeout_ms (a librdkafka rule)")
        return self

    @model_validator(mode="after")
    def _token_off_loopback(self) -> SyncServiceBase:
        problem = metrics_endpoint_problem(self.metrics_host, self.metrics_token)
        if problem:
            raise ValueError(problem)
        return self

    def consumer_group(self) -> str:
        """The consumer group id (``group_id`` or ``threes-sync-<name>``)."""
        return self.group_id or f"threes-sync-{self.name}"
