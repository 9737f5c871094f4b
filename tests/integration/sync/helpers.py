"""Helpers of the sync service tests: produce update records, build configs, run the service, wait."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kernel.config.models import KafkaConfig
from kernel.kafka import clients
from kernel.kafka.topics import watermark_offsets
from kernel.updates import encode_version
from schemas.serde import AvroSerializer
from schemas.store import SchemaStore
from threes.config import pipeline_from_dict
from threes.testing.sink import ITEM_SCHEMA, item


def create_topic(kafka_conf: dict[str, Any], topic: str, partitions: int) -> None:
    admin = AdminClient(kafka_conf)
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)


class UpdateProducer:
    """Produces update records (long key, ``Item`` value, ``version`` header) and remembers their offsets."""

    def __init__(self, kafka: KafkaConfig, topic: str):
        store = SchemaStore(kafka.librdkafka_config(), kafka.schema_topic)
        self.topic = topic
        self.key_ser = AvroSerializer("long", store)
        self.value_ser = AvroSerializer(ITEM_SCHEMA, store)
        self.producer = clients.kafka_producer(kafka, linger_ms=20)
        self.delivered: dict[int, tuple[int, int]] = {}  # key -> (partition, offset) of its last record
        self.errors: list[Any] = []

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered[self.key_of(msg)] = (msg.partition(), msg.offset())

    def key_of(self, msg: Any) -> int:
        import io

        import fastavro

        return fastavro.schemaless_reader(io.BytesIO(msg.key()[10:]), "long")

    def send(self, key: int, version: int, value: dict[str, Any] | None | str = "default",
             raw_value: bytes | None = None) -> None:
        if raw_value is None:
            if value == "default":
                value = item(key, version)
            raw_value = self.value_ser(value)
        while True:
            try:
                self.producer.produce(self.topic, key=self.key_ser(key), value=raw_value,
                                      headers=[("version", encode_version(version))], on_delivery=self._on_delivery)
                break
            except BufferError:
                self.producer.poll(0.1)
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(60) == 0
        assert not self.errors, self.errors


def pipeline(kafka: KafkaConfig, connections: dict[str, Any], services: list[dict[str, Any]]) -> Any:
    return pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": connections,
        "sync": services,
    })


def run_in_thread(service: Any) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            service.run(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="sync-under-test", daemon=True)
    thread.start()
    return thread, stop, errors


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = cond()
        if result:
            return result
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def group_lag(kafka_conf: dict[str, Any], group: str, topic: str) -> int:
    """High watermarks minus the group's committed offsets, summed over partitions."""
    consumer = Consumer({**kafka_conf, "group.id": group, "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p) for p in parts]
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
        lag = 0
        for p in parts:
            high = watermark_offsets(consumer, topic, p)[1]  # waits out a leader that moves
            lag += high - max(0, committed[p])
        return lag
    finally:
        consumer.close()


def read_topic(kafka_conf: dict[str, Any], topic: str, expected: int, timeout_s: float = 30) -> list[Any]:
    """Every record of a topic from the beginning (waits for at least ``expected``)."""
    consumer = Consumer({**kafka_conf, "group.id": f"read-{uuid.uuid4().hex}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg)
            elif msg is None and len(out) >= expected:
                break
    finally:
        consumer.close()
    return out
