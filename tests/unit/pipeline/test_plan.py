"""What ``threes run`` starts, in which order, and what each part waits for (no services)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.exceptions import ConfigError, SetupError
from threes.config import load_pipeline
from threes.pipeline.kafka_probe import pipeline_topics
from threes.pipeline.plan import COMPONENTS, parse_only, plan_run
from threes.pipeline.probes import source_cycles, sources_ready

YAML = """
kafka: {bootstrap_servers: 127.0.0.1:1}
connections:
  pg: {type: rds, url: "postgresql+psycopg://u:p@127.0.0.1:1/db"}
  es: {type: elasticsearch, hosts: ["http://127.0.0.1:1"]}
sources:
  - {name: customers, type: rds_source, connection: pg, topic: state.customers, table: customers}
stream:
  events: {topic: orders, value_schema: order.avsc, topic_spec: {partitions: 3}}
  snapshots:
    - {name: customers, topics: [state.customers], key_schema: k.avsc, value_schema: v.avsc}
    - {name: fx, topics: [state.fx], key_schema: k.avsc, value_schema: v.avsc}
  lookups: [{snapshot: customers, on: {customer_id: customer_id}, prefix: customer_}]
  enriched_topic: orders.enriched
  updates: [{topic: updates.orders, key: [order_id]}]
  dead_letter_topic: orders.dlq
  checkpoint_location: cp
sync:
  - name: search
    dead_letter_topic: updates.dlq
    metrics_port: 9555
    sinks:
      - {name: idx, type: elasticsearch_sink, connection: es, topics: [updates.orders, external.topic], index: o}
"""


@pytest.fixture
def pipeline(tmp_path: Path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(YAML)
    return load_pipeline(path), path


def test_only_accepts_repeated_and_comma_separated_parts_in_start_order() -> None:
    assert parse_only(None) == COMPONENTS == ("sources", "stream", "sync")
    assert parse_only(["sync,sources"]) == ("sources", "sync")
    assert parse_only(["sync", " Stream "]) == ("stream", "sync")
    with pytest.raises(ConfigError, match="--only 'sink'"):
        parse_only(["sink"])


def test_whole_run_starts_sources_then_stream_then_sync_each_waiting_for_what_it_needs(pipeline) -> None:
    pl, path = pipeline
    parts = plan_run(pl, path, sources_metrics_port=7001, stream_metrics_port=7002)
    assert [p.name for p in parts] == ["sources", "stream", "sync"]
    sources, stream, sync = parts
    assert sources.args == ["source", "run", str(path), "--offsets-topic", "_threes_offsets", "--metrics-port", "7001"]
    assert sources.topics == [] and not sources.wait_sources_ready
    # the stream job: after the sources' first snapshot; a snapshot topic no source writes is awaited
    assert stream.wait_sources_ready and stream.positions == []
    assert [(t.topic, t.creator) for t in stream.topics] == [("state.fx", "an outside producer")]
    assert stream.create_events is not None and stream.create_events[0] == "orders"
    assert stream.create_events[1].partitions == 3
    assert stream.args == ["stream", "run", str(path), "--metrics-port", "7002"] and stream.metrics_ports == [7002]
    # the sync services: their topics, each named with who creates it
    assert [(t.topic, t.creator) for t in sync.topics] == [
        ("updates.orders", "the stream job"), ("external.topic", "an outside producer")
    ]
    assert sync.metrics_ports == [9555]


def test_stream_alone_waits_for_the_positions_of_sources_run_elsewhere(pipeline) -> None:
    pl, path = pipeline
    (stream,) = plan_run(pl, path, ("stream",), stream_metrics_port=7002)
    assert not stream.wait_sources_ready
    assert stream.positions == ["customers"]
    assert [t.topic for t in stream.topics] == ["state.customers", "state.fx"]
    assert stream.topics[0].creator == "source customers"


def test_a_part_the_config_lacks_is_an_error_naming_what_it_has(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(YAML.split("stream:")[0])
    pl = load_pipeline(path)
    with pytest.raises(ConfigError, match="nothing to run: --only stream,sync but the config has sources"):
        plan_run(pl, path, ("stream", "sync"))


def test_events_topic_spec_defaults_to_four_partitions(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(YAML.replace(", topic_spec: {partitions: 3}", ""))
    assert load_pipeline(path).stream.events.topic_spec.partitions == 4


def test_sources_are_ready_once_each_connector_completed_a_cycle_per_task() -> None:
    text = (
        "# HELP threes_source_cycle_seconds duration\n# TYPE threes_source_cycle_seconds histogram\n"
        'threes_source_cycle_seconds_bucket{connector="a",le="+Inf"} 2.0\n'
        'threes_source_cycle_seconds_count{connector="a"} 2.0\n'
        'threes_source_cycle_seconds_sum{connector="a"} 0.5\n'
        'threes_source_cycle_seconds_count{connector="b"} 1.0\n'
        'threes_source_cycle_seconds_count{connector="c"} 0.0\n'
    )
    cycles = source_cycles(text)
    assert cycles == {"a": 2, "b": 1}
    assert sources_ready(cycles, {"a": 1, "b": 2, "c": 1}) == (["a"], ["b", "c"])


def test_pipeline_topics_in_flow_order(pipeline) -> None:
    pl, _ = pipeline
    assert pipeline_topics(pl) == [
        "state.customers", "state.fx", "orders", "orders.enriched", "updates.orders", "external.topic",
        "orders.dlq", "updates.dlq",
    ]


class _Meta:
    def __init__(self, partitions: int) -> None:
        self.partitions = {p: None for p in range(partitions)}


class _Consumer:
    """Watermarks per partition; ``orders.enriched``'s second partition has no leader yet."""

    def get_watermark_offsets(self, tp, timeout=None):
        from confluent_kafka import KafkaError, KafkaException

        if (tp.topic, tp.partition) == ("orders.enriched", 1):
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "Not leader for partition"))
        return 10, 25


class _GroupConsumer:
    """A consumer of a sync service's group that never subscribes: it reads committed offsets."""

    def __init__(self, away: bool = False) -> None:
        self.away = away

    def committed(self, partitions, timeout=None):
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        if self.away:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))
        return [TopicPartition(tp.topic, tp.partition, 20 if (tp.topic, tp.partition) == ("updates.orders", 0)
                               else -1001) for tp in partitions]


def test_a_partition_between_leaders_leaves_its_topic_unknown_and_the_reading_goes_on(pipeline) -> None:
    # A broker answers NOT_LEADER_FOR_PARTITION for a while after the stream job creates a topic;
    # the supervisor's view of the pipeline must not stop on it (seen on a loaded CI run).
    import time

    from kernel.kafka.topics import GroupOffsets
    from threes.pipeline.kafka_probe import KafkaProbe

    pl, _ = pipeline
    probe = object.__new__(KafkaProbe)
    probe._consumer, probe._suspect_since, probe._renewed_at = _Consumer(), None, time.monotonic()
    probe._groups = GroupOffsets(None)
    probe._groups.consumers.update({svc.consumer_group(): _GroupConsumer() for svc in pl.sync})
    probe._topics = (time.monotonic() + 3600, {t: _Meta(2) for t in ["state.customers", "orders", "orders.enriched",
                                                                      "updates.orders"]})
    flow = probe.flow(pl)
    assert flow.topics["state.customers"] == 30 and flow.topics["orders"] == 30
    assert flow.topics["orders.enriched"] is None  # unknown this time, not an error
    assert flow.topics["state.fx"] is None  # missing
    assert flow.committed["search"] == 10 and flow.lag["search"] == 20  # partition 1: nothing committed


def test_a_group_coordinator_that_does_not_answer_leaves_the_commits_unknown_and_the_reading_goes_on(pipeline) -> None:
    import time

    from kernel.kafka.topics import GroupOffsets
    from threes.pipeline.kafka_probe import KafkaProbe

    pl, _ = pipeline
    probe = object.__new__(KafkaProbe)
    probe._consumer, probe._suspect_since, probe._renewed_at = _Consumer(), None, time.monotonic()
    probe._groups = GroupOffsets(None)
    probe._groups.consumers.update({svc.consumer_group(): _GroupConsumer(away=True) for svc in pl.sync})
    probe._topics = (time.monotonic() + 3600, {t: _Meta(2) for t in ["updates.orders"]})
    flow = probe.flow(pl)
    assert flow.committed["search"] == 0 and flow.lag["search"] == 30


def test_kafka_is_an_error_until_it_answered_once_then_an_outage_to_wait_for(monkeypatch) -> None:
    import kernel.kafka.topics
    from kernel.config.models import KafkaConfig
    from threes.pipeline.kafka_probe import KafkaOutage, KafkaProbe

    answers: list[object] = [SetupError("Kafka at 127.0.0.1:1 did not answer within 10 s")]

    def metadata(config, timeout_s):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(kernel.kafka.topics, "cluster_metadata", metadata)
    probe = object.__new__(KafkaProbe)
    probe.kafka, probe._topics, probe.answered = KafkaConfig(bootstrap_servers="127.0.0.1:1"), None, False
    with pytest.raises(SetupError) as never:
        probe.topics()
    assert not isinstance(never.value, KafkaOutage)  # a wrong address fails at once
    answers += [type("M", (), {"topics": {}})(), SetupError("Kafka at 127.0.0.1:1 did not answer within 10 s")]
    assert probe.topics() == {} and probe.answered
    with pytest.raises(KafkaOutage):
        probe.topics(max_age_s=0)


def test_a_part_waiting_to_start_waits_out_a_kafka_outage(pipeline, tmp_path: Path) -> None:
    from threes.pipeline.kafka_probe import KafkaOutage
    from threes.pipeline.parts import RunOptions
    from threes.pipeline.supervisor import Supervisor

    pl, path = pipeline

    class Outage:
        error: type[SetupError] = KafkaOutage

        def missing(self, topics):
            raise self.error("Kafka at 127.0.0.1:1 did not answer within 10 s")

        def stored_positions(self):
            return set()

        def flow(self, pipeline):
            raise self.error("Kafka at 127.0.0.1:1 did not answer within 10 s")

        def close(self):
            pass

    supervisor = Supervisor(pl, RunOptions(config=path, only=("stream",), log_dir=tmp_path))
    supervisor._probe = Outage()  # type: ignore[assignment]
    supervisor._flow_probe = Outage
    supervisor._flow_isolated = False  # an in-process fake
    supervisor.tick()
    supervisor.tick()
    stream = supervisor.part("stream")
    assert stream is not None and stream.status == "waiting" and stream.child is None
    assert stream.detail.startswith("waiting for Kafka")
    assert [m for _, m in supervisor.events if "waits for Kafka" in m] != []
    assert len([m for _, m in supervisor.events if "waits for Kafka" in m]) == 1  # noted once, not every tick
    Outage.error = SetupError  # a Kafka that never answered: the run stops at once
    with pytest.raises(SetupError):
        supervisor.tick()
    supervisor.close()


def test_a_tick_never_waits_for_a_flow_reading_that_kafka_holds_up(pipeline, tmp_path: Path) -> None:
    # While the broker is away one reading can take the clients' timeouts (seconds per partition);
    # the supervisor must still notice exits and Ctrl-C meanwhile, so the reading runs in a thread.
    import threading
    import time

    from threes.pipeline.kafka_probe import Flow
    from threes.pipeline.parts import RunOptions
    from threes.pipeline.supervisor import Supervisor

    pl, path = pipeline
    answer = threading.Event()

    class HeldUp:
        def missing(self, topics):
            return list(topics)  # the part keeps waiting

        def stored_positions(self):
            return set()

        def flow(self, pipeline):
            answer.wait(30)  # Kafka does not answer until the test says so
            return Flow(at=time.time(), topics={"orders": 7})

        def close(self):
            pass

    supervisor = Supervisor(pl, RunOptions(config=path, only=("stream",), log_dir=tmp_path, flow_every_s=0.05))
    supervisor._probe = HeldUp()  # type: ignore[assignment]
    supervisor._flow_probe = HeldUp
    supervisor._flow_isolated = False  # an in-process fake
    try:
        started = time.monotonic()
        for _ in range(3):
            supervisor.tick()
        assert time.monotonic() - started < 1.0  # not held up by the reading in flight
        assert supervisor.flow is None
        answer.set()
        deadline = time.monotonic() + 10
        while supervisor.flow is None and time.monotonic() < deadline:
            supervisor.tick()
            time.sleep(0.05)
        assert supervisor.flow is not None and supervisor.flow.topics == {"orders": 7}
    finally:
        answer.set()
        supervisor.close()


def test_a_watermark_consumer_that_keeps_failing_is_renewed_and_the_next_one_reads(monkeypatch) -> None:
    # After a broker restart a long-lived probe was seen reading "unknown partition" for good
    # while a new client read the same partition at once: the probe renews its consumer.
    import time

    from confluent_kafka import KafkaError, KafkaException

    import threes.pipeline.kafka_probe as kafka_probe
    from threes.pipeline.kafka_probe import KafkaProbe

    class Stuck:
        closed = False

        def get_watermark_offsets(self, tp, timeout=None):
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "Local: Unknown partition"))

        def close(self):
            self.closed = True

    stuck = Stuck()
    monkeypatch.setattr(kafka_probe.clients, "kafka_consumer", lambda kafka, group: _Consumer())
    monkeypatch.setattr(kafka_probe, "RENEW_AFTER_S", 0.0)
    probe = object.__new__(KafkaProbe)
    probe.kafka, probe._consumer = None, stuck
    probe._suspect_since, probe._renewed_at = None, time.monotonic()
    assert probe.watermarks("orders", 0) is None  # the failing consumer: unknown this time
    assert probe.watermarks("orders", 0) == (10, 25)  # renewed: the new consumer answers
    assert stuck.closed and probe._suspect_since is None
