"""A dead letter larger than the dead letter topic takes is written without its value (issue #49, part 1).

Drill: a valid 3 MB update over the sink's ``max_record_bytes`` (1,000,000) among 300 good ones, on real
Kafka and Elasticsearch. The pipeline's producer keeps librdkafka's ``message.max.bytes`` (1,000,000),
so the whole record cannot be dead-lettered: before, the produce failed with ``MSG_SIZE_TOO_LARGE`` and
the partition stopped for good. Now the dead letter keeps its context and size without the value, every
good record is indexed, lag 0, and ``threes dlq replay`` reads the original back from its topic, or says
clearly that the topic no longer holds it.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.elasticsearch.connection import ElasticsearchConnection
from kernel.config.models import KafkaConfig
from kernel.dlq import DeadLetter
from kernel.exceptions import ThreesError
from kernel.kafka.topics import topic_configs
from sync_service.service import SyncService
from tests.integration.sync.helpers import UpdateProducer, group_lag, pipeline, read_topic, run_in_thread, wait_until
from threes.dead_letter_originals import with_originals
from threes.dead_letters import read_letters
from threes.testing.sink import item

pytestmark = pytest.mark.integration

GOOD, LIMIT, BIG = 300, 1_000_000, 3_000_000


def test_a_dead_letter_over_the_producer_limit_is_written_without_its_value_and_nothing_stops(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], es_conn: ElasticsearchConnection, es: Any, unique: str
) -> None:
    topic, dlq, index = f"updates.big.{unique}", f"dlq.big.{unique}", f"big-{unique}"
    admin = AdminClient(kafka_conf)
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1, config={"max.message.bytes": str(8 << 20)})]
    )[topic].result(30)
    # the test's own producer may send 3 MB; the pipeline's keeps librdkafka's default limit
    producer = UpdateProducer(kafka.model_copy(update={"client_config": {"message.max.bytes": 8 << 20}}), topic)
    big_key = GOOD // 3
    for key in range(GOOD + 1):
        if key == big_key:
            producer.send(key, 1, {**item(key, 1), "note": "x" * BIG})
        else:
            producer.send(key, 1)
    producer.flush()
    assert not producer.errors, producer.errors
    p = pipeline(kafka, {"es": {"type": "elasticsearch", "hosts": es_conn.hosts}},
                 [{"name": f"big-{unique}", "dead_letter_topic": dlq,
                   "batch": {"max_records": 100, "max_age_ms": 200},
                   "sinks": [{"name": "search", "type": "elasticsearch_sink", "connection": "es", "topics": [topic],
                              "index": index, "max_record_bytes": LIMIT}]}])
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        group = p.sync[0].consumer_group()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 120, "lag back to 0")
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors

    # the dead letter topic was created with the producer's limit, and the one dead letter fits it
    assert topic_configs(kafka_conf, dlq)["max.message.bytes"] == "1000000"
    (msg,) = read_topic(kafka_conf, dlq, 1)
    assert msg.value() is None and len(msg) < LIMIT
    letter = DeadLetter.from_headers(msg.headers())
    partition, offset = producer.delivered[big_key]
    assert (letter.topic, letter.partition, letter.offset, letter.stage) == (topic, partition, offset, "write")
    assert letter.omitted == ("value",) and letter.original_bytes is not None and letter.original_bytes > BIG
    assert f"is over max_record_bytes ({LIMIT} bytes)" in letter.message
    es.indices.refresh(index=index)
    assert es.count(index=index)["count"] == GOOD
    assert not es.exists(index=index, id=str(big_key))

    # replay reads the original back from its topic while the topic holds it
    (stored,) = read_letters(kafka, [dlq])
    (whole,) = with_originals(kafka, [stored])
    assert whole.key == msg.key() and whole.value is not None and len(whole.value) > BIG
    assert any(name == "version" for name, _ in whole.original_headers())

    # ... and says so, naming the dead letter, once retention has deleted it
    _delete_records(kafka_conf, topic, partition, offset + 1)
    with pytest.raises(ThreesError, match=rf"{stored.id}.*no longer holds it.*deleted by retention"):
        with_originals(kafka, [stored])
    es.indices.delete(index=index)


def _delete_records(kafka_conf: dict[str, Any], topic: str, partition: int, before: int) -> None:
    admin = AdminClient(kafka_conf)
    futures = admin.delete_records([TopicPartition(topic, partition, before)])
    for future in futures.values():
        future.result(30)
