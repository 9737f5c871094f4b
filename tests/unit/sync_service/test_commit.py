"""A refused asynchronous commit is made again at the next turn (logic only: a recording consumer)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from sync_service.service import SyncService
from threes.config import pipeline_from_dict

TOPIC = "updates"


class RecordingConsumer:
    """Records the offsets of each ``commit`` (the only consumer call ``_commit`` makes)."""

    def __init__(self) -> None:
        self.commits: list[list[tuple[int, int]]] = []

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append([(o.partition, o.offset) for o in offsets])


class Durable:
    """A partition buffer whose first offset not yet written is ``offset``."""

    def __init__(self, offset: int):
        self.offset = offset

    def safe_offset(self) -> int:
        return self.offset


def service(positions: dict[int, int]) -> tuple[SyncService, RecordingConsumer]:
    p = pipeline_from_dict({
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "connections": {"pg": {"type": "rds", "url": "postgresql+psycopg://u@127.0.0.1:1/db", "password": "pw"}},
        "sync": [{"name": "svc", "dead_letter_topic": "dlq",
                  "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [TOPIC],
                             "table": "t", "key": ["id"]}]}],
    })
    svc = SyncService(p.kafka, p.sync[0], dict(p.connections), serve=False)

    class Slot:
        buffers: dict[Any, Any] = {(TOPIC, part): Durable(off) for part, off in positions.items()}

    svc._by_topic = {TOPIC: [Slot()]}  # type: ignore[dict-item]
    svc._assigned = {(TOPIC, part) for part in positions}
    consumer = RecordingConsumer()
    svc.consumer = consumer
    return svc, consumer


def test_a_commit_refused_in_a_rebalance_is_made_again() -> None:
    svc, consumer = service({0: 10, 1: 20})
    svc._commit(asynchronous=True)
    assert consumer.commits == [[(0, 10), (1, 20)]]
    svc._commit(asynchronous=True)
    assert len(consumer.commits) == 1  # nothing new to commit
    # the broker refuses the whole request (the group's generation moved on): both are made again
    refused = KafkaError(KafkaError.ILLEGAL_GENERATION)
    svc._on_commit(refused, [TopicPartition(TOPIC, 0, 10), TopicPartition(TOPIC, 1, 20)])
    svc._commit(asynchronous=True)
    assert consumer.commits[-1] == [(0, 10), (1, 20)]


def test_only_the_refused_partition_is_made_again() -> None:
    svc, consumer = service({0: 10, 1: 20})
    svc._commit(asynchronous=True)
    # librdkafka's TopicPartition has a read-only ``error``: a result with one set on a single partition
    bad = SimpleNamespace(topic=TOPIC, partition=1, offset=20, error=KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
    svc._on_commit(None, [TopicPartition(TOPIC, 0, 10), bad])
    svc._commit(asynchronous=True)
    assert consumer.commits[-1] == [(1, 20)]


def test_a_refusal_overtaken_by_a_newer_commit_is_not_made_again() -> None:
    svc, consumer = service({0: 10})
    svc._commit(asynchronous=True)
    svc._by_topic[TOPIC][0].buffers[(TOPIC, 0)].offset = 15
    svc._commit(asynchronous=True)
    # the result of the first (older) commit arrives late, refused: offset 15 is already on its way
    svc._on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [TopicPartition(TOPIC, 0, 10)])
    svc._commit(asynchronous=True)
    assert consumer.commits == [[(0, 10)], [(0, 15)]]


def test_a_successful_commit_changes_nothing() -> None:
    svc, consumer = service({0: 10})
    svc._commit(asynchronous=True)
    svc._on_commit(None, [TopicPartition(TOPIC, 0, 10)])
    svc._commit(asynchronous=True)
    assert consumer.commits == [[(0, 10)]]


def test_a_lasting_refusal_is_made_again_every_turn_but_logged_once(caplog) -> None:
    import logging

    svc, consumer = service({0: 10})
    caplog.set_level(logging.DEBUG, logger="sync_service.service")
    denied = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
    for _ in range(3):
        svc._commit(asynchronous=True)
        svc._on_commit(denied, [TopicPartition(TOPIC, 0, 10)])
    assert consumer.commits == [[(0, 10)]] * 3  # made again at every turn
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
