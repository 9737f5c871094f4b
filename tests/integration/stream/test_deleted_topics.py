"""A snapshot topic deleted, or deleted and created again, on a real Kafka (micro-batch mode).

While the job runs, the end offsets it reads before each micro-batch say so (the topic's
metadata, asked again every 30 s, and its Kafka topic id); at a restart, a snapshot
checkpoint written for the deleted topic is not loaded. Real-time mode's JVM stores:
``test_realtime_lookup.py``.
"""

from __future__ import annotations

import time

import pytest

from kernel.exceptions import FatalError
from kernel.kafka import clients
from kernel.kafka.topics import ensure_compacted_topic
from stream_app.kafka_io import TopicWatermarks

from .conftest import AIRPORTS


def delete(env, topic: str) -> None:
    admin = clients.kafka_admin(env.kafka)
    admin.delete_topics([topic])[topic].result(30)


def create_again(env, topic: str) -> None:
    deadline = time.monotonic() + 60
    while True:  # the broker finishes a deletion in the background
        try:
            ensure_compacted_topic(env.conf, topic, partitions=2)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_the_watermarks_stop_at_a_topic_deleted_or_created_again_while_the_job_runs(env):
    env.put_airport("EWR")
    marks = TopicWatermarks(env.kafka)
    try:
        ids = marks.topic_ids([env.airports])
        assert len(ids[env.airports]) == 22  # base64 of 16 bytes
        assert sum(marks.end_offsets([env.airports])[env.airports].values()) == 1

        delete(env, env.airports)
        with pytest.raises(FatalError, match=f"topic '{env.airports}' was deleted while the job ran"):
            marks.partitions(env.airports, max_age_s=0)  # the metadata refresh of the next micro-batch

        create_again(env, env.airports)
        with pytest.raises(FatalError, match="was deleted and created again while the job ran") as caught:
            marks.partitions(env.airports, max_age_s=0)
        assert ids[env.airports] in str(caught.value)
    finally:
        marks.close()


@pytest.mark.spark
def test_a_restart_does_not_load_the_checkpoint_of_a_snapshot_topic_created_again(spark, env):
    airports = sorted(AIRPORTS)
    for faa in airports:
        env.put_airport(faa)
    first = env.start(spark, available_now=True)
    assert first.readiness["airports"]["source"] == "topics" and first.readiness["airports"]["keys"] == 5
    first.stop()  # writes the snapshot's checkpoint

    delete(env, env.airports)
    create_again(env, env.airports)
    for faa in airports:  # twice each: the new topic's end offsets pass the checkpoint's, which look in range
        env.put_airport(faa, f"{faa} first")
        env.put_airport(faa, f"{faa} again")
    second = env.start(spark, available_now=True)
    restored = second.readiness["airports"]
    second.stop()
    # the checkpoint holds the deleted topic's table (its offsets alone would pass): the new topic is read instead
    assert restored["source"] == "topics" and restored["keys"] == 5 and restored["records"] == 10, restored


@pytest.mark.spark
def test_a_job_whose_snapshot_topic_is_deleted_while_it_runs_stops_and_says_which(spark, env):
    from .test_enrich_job import Flow

    env.put_airport("EWR")
    env.put_airport("LAX")
    job = env.start(spark)
    try:
        with Flow(env, period_s=0.2):
            env.consume(env.enriched, lambda rs: len(rs) >= 3, timeout_s=120)
            delete(env, env.airports)
            deadline = time.monotonic() + 150  # the topic's metadata is asked again every 30 s
            failed = []
            while not failed and time.monotonic() < deadline:
                failed = [q for q in job.queries if not q.isActive and q.exception() is not None]
                time.sleep(1.0)
        assert failed, "the job still runs 150 s after its snapshot topic was deleted"
        said = str(failed[0].exception())
        assert f"topic '{env.airports}' was deleted while the job ran" in said, said[-3000:]
    finally:
        job.stop(checkpoint=False)
