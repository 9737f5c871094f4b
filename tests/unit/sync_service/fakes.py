"""Fake Kafka messages and sinks for unit tests of pure logic (no services)."""

from __future__ import annotations

from typing import Any

from connectors.api.sink import Sink
from connectors.api.sink_records import RecordFailure, SinkBatch
from kernel.config.models import SinkConnectorConfig


class FakeMessage:
    """What the runtime reads of a ``confluent_kafka.Message``."""

    def __init__(self, offset: int, key: bytes | None = b"k", value: bytes | None = b"v", *, topic: str = "t",
                 partition: int = 0, headers: list[tuple[str, bytes]] | None = None, timestamp_ms: int = 1_000):
        self._offset, self._key, self._value = offset, key, value
        self._topic, self._partition, self._headers, self._ts = topic, partition, headers, timestamp_ms

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def error(self) -> None:
        return None


class FakeSinkConfig(SinkConnectorConfig):
    implementation = "tests.unit.sync_service.fakes:ScriptedSink"
    connection_type = "rds"
    type: str = "fake_sink"


class ScriptedSink(Sink):
    """A sink whose ``write`` raises the scripted errors in turn, then records the batch."""

    def __init__(self, script: list[BaseException | list[int]] | None = None, name: str = "fake"):
        super().__init__(FakeSinkConfig(name=name, connection="c", topics=["t"]), None)
        self.script = list(script or [])
        self.batches: list[SinkBatch] = []

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        step = self.script.pop(0) if self.script else []
        if isinstance(step, BaseException):
            raise step
        self.batches.append(batch)
        return [RecordFailure(r, ValueError(f"refused {r.offset}")) for r in batch.records if r.offset in step]


class FakeProducer:
    def __init__(self) -> None:
        self.produced: list[dict[str, Any]] = []

    def produce(self, topic: str, key: Any = None, value: Any = None, headers: Any = None, on_delivery: Any = None):
        self.produced.append({"topic": topic, "key": key, "value": value, "headers": dict(headers or [])})

    def flush(self, timeout: float = 0) -> int:
        return 0
