"""Reading a partition's watermarks while its leader moves (no broker: a stand-in consumer)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from kernel.exceptions import SetupError
from kernel.kafka.topics import watermark_offsets


class LeaderMoving:
    """Answers ``NOT_LEADER_FOR_PARTITION`` the first ``failures`` times, then the watermarks."""

    def __init__(self, failures: int):
        self.failures, self.calls = failures, 0

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "Not leader for partition"))
        return 3, 42


def test_a_partition_without_a_leader_for_a_moment_is_asked_again() -> None:
    consumer = LeaderMoving(failures=3)
    assert watermark_offsets(consumer, "orders", 1, timeout_s=5) == (3, 42)
    assert consumer.calls == 4


def test_a_partition_that_stays_without_a_leader_is_a_setup_error_naming_it() -> None:
    with pytest.raises(SetupError, match=r"orders\[1\].*Not leader"):
        watermark_offsets(LeaderMoving(failures=10**6), "orders", 1, timeout_s=0.3)


def test_no_answer_within_the_timeout_is_a_setup_error_naming_the_partition() -> None:
    class Silent:
        def get_watermark_offsets(self, tp, timeout=None, cached=False):
            return None  # librdkafka's answer when the request timed out

    with pytest.raises(SetupError, match=r"offsets of orders\[0\] within 0.3 s"):
        watermark_offsets(Silent(), "orders", 0, timeout_s=0.3)
