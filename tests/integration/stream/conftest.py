"""Fixtures of the stream job's integration tests: real Kafka, real Spark (the session's local[2]).

Each test gets its own topics and checkpoint folder. Data: airports (the
snapshot, a compacted topic keyed by FAA code) and flights (the events).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from kernel.kafka import clients
from kernel.kafka.topics import ensure_compacted_topic, watermark_offsets
from schemas import load_schema
from schemas.serde import AvroDeserializer, AvroSerializer
from schemas.store import SchemaStore
from stream_app.config import StreamJobConfig
from stream_app.job import StreamJob

AIRPORT = load_schema("nycflights13/airport")
AIRPORT_KEY = load_schema("nycflights13/airport_key")
FLIGHT = {
    "type": "record",
    "name": "Flight",
    "namespace": "threes.test",
    "fields": [
        {"name": "flight_id", "type": "long"},
        {"name": "origin", "type": "string"},
        {"name": "dest", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"], "default": None},
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}
AIRPORTS = {
    "EWR": ("Newark Liberty Intl", 40.69, -74.17, 18, -5),
    "JFK": ("John F Kennedy Intl", 40.64, -73.78, 13, -5),
    "LGA": ("La Guardia", 40.78, -73.87, 22, -5),
    "LAX": ("Los Angeles Intl", 33.94, -118.41, 125, -8),
    "ORD": ("Chicago Ohare Intl", 41.98, -87.90, 668, -6),
}


def airport(faa: str, name: str | None = None) -> dict[str, Any]:
    n, lat, lon, alt, tz = AIRPORTS[faa]
    return {"faa": faa, "name": name or n, "lat": lat, "lon": lon, "alt": alt, "tz": tz, "dst": "A", "tzone": None}


class Env:
    """Topics, serializers and helpers of one test."""

    def __init__(self, kafka, kafka_conf, unique: str, tmp_path: Path):
        self.kafka, self.conf, self.unique, self.tmp = kafka, kafka_conf, unique, tmp_path
        self.events = f"flights.{unique}"
        self.airports = f"state.airports.{unique}"
        self.enriched = f"flights.enriched.{unique}"
        self.dlq = f"flights.dlq.{unique}"
        self.updates = f"updates.flights.{unique}"
        self.delays = f"updates.delays.{unique}"
        self.store = SchemaStore(kafka_conf, kafka.schema_topic)
        self.key_ser = AvroSerializer(AIRPORT_KEY, self.store)
        self.airport_ser = AvroSerializer(AIRPORT, self.store)
        self.flight_ser = AvroSerializer(FLIGHT, self.store)
        self.producer = clients.kafka_producer(kafka, linger_ms=0)
        ensure_compacted_topic(kafka_conf, self.airports, partitions=2)
        admin = clients.kafka_admin(kafka)
        from confluent_kafka.admin import NewTopic

        for f in admin.create_topics([NewTopic(self.events, num_partitions=2)]).values():
            f.result(10)
        (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
        self.jobs: list[StreamJob] = []

    def put_airport(self, faa: str, name: str | None = None, delete: bool = False) -> tuple[int, int]:
        """Write an airport (or its tombstone); returns (partition, offset) once acknowledged."""
        acked: list[Any] = []
        value = None if delete else self.airport_ser(airport(faa, name))
        self.producer.produce(
            self.airports,
            key=self.key_ser({"faa": faa}),
            value=value,
            on_delivery=lambda err, msg: acked.append((err, msg)),
        )
        self.producer.flush(10)
        err, msg = acked[0]
        assert err is None
        return msg.partition(), msg.offset()

    def put_flights(self, flights: list[dict[str, Any]]) -> None:
        for fl in flights:
            self.producer.produce(self.events, key=str(fl["flight_id"]).encode(), value=self.flight_ser(fl))
        assert self.producer.flush(10) == 0

    def put_raw_event(self, key: bytes, value: bytes | None) -> tuple[int, int]:
        acked: list[Any] = []
        self.producer.produce(self.events, key=key, value=value, on_delivery=lambda e, m: acked.append(m))
        self.producer.flush(10)
        return acked[0].partition(), acked[0].offset()

    def config(self, **overrides: Any) -> StreamJobConfig:
        data = {
            "name": f"test-{self.unique}",
            "events": {"topic": self.events, "value_schema": "flight.avsc", "starting_offsets": "earliest"},
            "snapshots": [
                {
                    "name": "airports",
                    "topics": [self.airports],
                    "key_schema": "nycflights13/airport_key",
                    "value_schema": "nycflights13/airport",
                }
            ],
            "lookups": [
                {"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_", "fields": ["name", "tz"]},
                {"snapshot": "airports", "on": {"dest": "faa"}, "prefix": "dest_"},
            ],
            "enriched_topic": self.enriched,
            "dead_letter_topic": self.dlq,
            "trigger_interval_s": 1,
            "checkpoint_location": str(self.tmp / "checkpoint"),
        }
        data.update(overrides)
        return StreamJobConfig.model_validate(data)

    def start(self, spark, config: StreamJobConfig | None = None, available_now: bool = False) -> StreamJob:
        job = StreamJob(config or self.config(), self.kafka, spark, base_dir=self.tmp)
        self.jobs.append(job)
        job.start(available_now=available_now)
        return job

    def consume(
        self,
        topic: str,
        until: Callable[[list[dict[str, Any]]], bool],
        timeout_s: float = 60.0,
        deserialize: bool = True,
    ) -> list[dict[str, Any]]:
        """Read ``topic`` from the start until ``until(records)`` holds; fails after ``timeout_s``."""
        consumer = Consumer(
            {
                **self.conf,
                "group.id": f"t-{self.unique}-{time.monotonic_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        des = AvroDeserializer(self.store)
        got: list[dict[str, Any]] = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + timeout_s
            while not until(got):
                assert time.monotonic() < deadline, (
                    f"{topic}: condition not met after {timeout_s} s, got {len(got)} records"
                )
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                headers = dict(msg.headers() or [])
                got.append(
                    {
                        "key": msg.key(),
                        "raw": msg.value(),
                        "headers": headers,
                        "timestamp_ms": msg.timestamp()[1],
                        "partition": msg.partition(),
                        "offset": msg.offset(),
                        "value": des(msg.value())
                        if deserialize and msg.value() and msg.value()[:2] == b"\xc3\x01"
                        else None,
                    }
                )
        finally:
            consumer.close()
        return got

    def close(self) -> None:
        for job in self.jobs:
            if job.queries:
                job.stop(checkpoint=False)


@pytest.fixture
def env(kafka, kafka_conf, unique, tmp_path) -> Iterator[Env]:
    e = Env(kafka, kafka_conf, unique, tmp_path)
    yield e
    e.close()


def flight(i: int, origin: str = "EWR", dest: str = "LAX", hour: int = 6, delay: float | None = 1.0) -> dict[str, Any]:
    import datetime as dt

    return {
        "flight_id": i,
        "origin": origin,
        "dest": dest,
        "dep_delay": delay,
        "time_hour": dt.datetime(2013, 1, 1, hour, tzinfo=dt.UTC),
    }


def offsets_header(record: dict[str, Any], name: str = "airports") -> dict[str, dict[str, int]]:
    return json.loads(record["headers"][f"snapshot.{name}"])


def end_offsets(kafka_conf, topic: str) -> dict[int, int]:
    consumer = Consumer({**kafka_conf, "group.id": "x"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        return {p: watermark_offsets(consumer, topic, p)[1] for p in meta.partitions}
    finally:
        consumer.close()


@pytest.fixture(autouse=True)
def _job_logs(caplog):
    """Keep the job's INFO lines (readiness, refreshes, batches): pytest shows them when a test fails."""
    import logging

    caplog.set_level(logging.INFO, logger="stream_app")


@pytest.fixture(scope="session")
def spark_cluster_master(stack) -> str:
    """The local stack's Spark standalone cluster (a master and two workers), started if needed."""
    stack.up(["spark"])
    return stack.endpoints().spark_master


@pytest.fixture
def cluster_spark(spark_sessions, spark_cluster_master):
    """A SparkSession on the standalone cluster (the local[2] one is stopped meanwhile).

    The cluster tests live in one module (``test_cluster.py``), so a test session
    switches masters twice, not once per test.
    """
    return spark_sessions.get(spark_cluster_master)


@pytest.fixture(scope="session")
def outputs_by_master() -> dict[str, dict[str, Any]]:
    """What a scenario produced on each master (scenario -> master -> output), to compare across masters."""
    return {}


def same_on_every_master(outputs: dict[str, dict[str, Any]], scenario: str, spark, output: Any) -> None:
    """Record a scenario's output on ``spark``'s master; assert it equals what the other masters produced."""
    master = spark.sparkContext.master
    seen = outputs.setdefault(scenario, {})
    seen[master] = output
    for other, value in seen.items():
        assert value == output, f"{scenario}: the output on {master} differs from the output on {other}"
