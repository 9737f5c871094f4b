"""Pure logic of the demo: isolated configs, sink ids, the boundary check, processes, the views."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from connectors.api.sink_records import SinkRecord
from connectors.elasticsearch.sink import doc_id as es_sink_doc_id
from kernel.config.loader import _Yaml12BoolLoader
from kernel.exceptions import FatalError
from schemas import load_schema
from schemas.serde import AvroDeserializer, AvroSerializer
from schemas.store import InMemorySchemaStore
from threes.config import load_pipeline
from threes.demo.changes import ReferenceChange, check_boundary
from threes.demo.data import FLIGHT_KEY
from threes.demo.isolate import isolate, write_isolated
from threes.demo.latency import LatencySampler, doc_id, key_id
from threes.demo.monitor import Progress, Targets
from threes.demo.processes import PipelineProcesses
from threes.demo.replay import partition_for
from threes.demo.reset import pipeline_topics
from threes.demo.run import LiveState
from threes.demo.view import live, summary_table

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "nycflights13" / "pipeline.yaml"
ROW = {"year": 2013, "month": 1, "day": 1, "carrier": "UA", "flight": 1545, "origin": "EWR", "sched_dep_time": 515}


def test_isolated_copy_renames_everything_the_pipeline_owns(tmp_path: Path) -> None:
    original = load_pipeline(EXAMPLE, environ={})
    ports = iter(range(40_000, 40_100))
    copy = load_pipeline(write_isolated(EXAMPLE, tmp_path / "p.yaml", "abc123", lambda: next(ports)), environ={})
    assert not set(pipeline_topics(copy)) & set(pipeline_topics(original))
    assert all(t.endswith(".abc123") for t in pipeline_topics(copy))
    for src in copy.sources:
        if src.type == "rds_source":
            assert (src.schema_name, src.table) == ("threes_abc123", next(s.table for s in original.sources
                                                                          if s.name == src.name))
    assert {s.consumer_group() for s in copy.sync}.isdisjoint({s.consumer_group() for s in original.sync})
    sinks = {s.type: s for svc in copy.sync for s in svc.sinks}
    assert (sinks["elasticsearch_sink"].index, sinks["rds_sink"].table) == ("flights_abc123", "route_stats_abc123")
    assert sinks["s3_sink"].prefix == "abc123/archive/"
    assert copy.stream.checkpoint_location.endswith("nycflights13-abc123")
    assert copy.stream.metrics_port == 40_000 and [s.metrics_port for s in copy.sync] == [40_001, 40_002, 40_003]
    doc = yaml.load(EXAMPLE.read_text(), Loader=_Yaml12BoolLoader)
    assert "metrics_port" not in isolate(doc, "x1")["stream"]
    assert doc["stream"]["metrics_port"] == 9401  # the original document is untouched
    with pytest.raises(ValueError, match="suffix"):
        isolate(doc, "Bad-Suffix")


def test_sampled_ids_are_the_ones_the_sinks_write() -> None:
    store = InMemorySchemaStore()
    key_schema = load_schema("nycflights13/flight_key")
    decoded = AvroDeserializer(store)(AvroSerializer(key_schema, store)(ROW))
    record = SinkRecord(topic="updates.flights", partition=0, offset=0, key=decoded, value={}, version=0)
    assert doc_id(ROW, FLIGHT_KEY) == es_sink_doc_id(decoded) == "2013|1|1|UA|1545|EWR|515"
    assert key_id(ROW, FLIGHT_KEY) == record.key_id


def test_latency_sampler_counts_group_positions_and_samples_every_nth() -> None:
    sampler = LatencySampler(probe=None, key=FLIGHT_KEY, group_by=["origin", "dest"], every=2)
    for i in range(5):
        sampler.on_produce(i, {**ROW, "flight": i, "dest": "IAH" if i < 3 else "ORD"})
    assert [(s.doc_id.split("|")[4], s.group, s.group_count) for s in sampler.samples] == [
        ("0", ("EWR", "IAH"), 1), ("2", ("EWR", "IAH"), 3), ("4", ("EWR", "ORD"), 2)]
    sampler.samples[0].seen["elasticsearch"] = sampler.samples[0].produced + 2.0
    lat = sampler.latencies()
    assert lat["elasticsearch"] == {"samples": 1, "of": 3, "p50_s": 2.0, "p99_s": 2.0}
    assert lat["postgres"]["p50_s"] is None


def _docs(values: list[tuple[int, int, str]]) -> pd.DataFrame:
    """Flights of carrier UA as read back from the index: (flight number, offset, airline name)."""
    rows = [{**ROW, "flight": f, "_version": off, "airline_name": name} for f, off, name in values]
    return pd.DataFrame(rows)


def _change() -> ReferenceChange:
    change = ReferenceChange("rename UA", "airlines", {"carrier": "UA"}, "name", "New", "carrier", "airline_name", 0.2)
    change.old_value, change.applied_at = "Old", time.time()
    return change


def test_boundary_check_accepts_a_clean_switch_per_partition() -> None:
    serializer = AvroSerializer(load_schema("nycflights13/flight_key"))
    partitions = 2
    flights = list(range(40))
    part = {f: partition_for(serializer({**ROW, "flight": f}), partitions) for f in flights}
    assert set(part.values()) == {0, 1}
    # offsets per partition in flight order; the switch happens at the 10th flight of each partition
    offsets, rows = {0: 0, 1: 0}, []
    for f in flights:
        off = offsets[part[f]]
        offsets[part[f]] += 1
        rows.append((f, off, "New" if off >= 10 else "Old"))
    change = _change()
    result = check_boundary(change, _docs(rows), partitions, serializer, list(FLIGHT_KEY))
    assert result["boundary_ok"] and result["flights_with_new_value"] == 40 - 20


def test_boundary_check_finds_an_old_value_after_a_new_one() -> None:
    serializer = AvroSerializer(load_schema("nycflights13/flight_key"))
    flights = [(f, f, "New" if f in (3, 4) else "Old") for f in range(8)]  # one partition: old again at 5..7
    change = _change()
    result = check_boundary(change, _docs(flights), 1, serializer, list(FLIGHT_KEY))
    assert not result["boundary_ok"] and "old value at offset 7 after the new value at offset 3" in result["problems"][0]
    none_new = [(f, f, "Old") for f in range(4)]
    assert not check_boundary(change, _docs(none_new), 1, serializer,
                              list(FLIGHT_KEY))["boundary_ok"]  # no flight shows the change: not shown


def test_a_child_that_exits_is_reported_with_its_exit_code_and_log(tmp_path: Path) -> None:
    procs = PipelineProcesses(EXAMPLE, tmp_path)
    child = procs.start("oops", ["validate", str(tmp_path / "missing.yaml")])
    child.process.wait(60)
    with pytest.raises(FatalError, match=r"(?s)exited with code 1.*cannot read config file"):
        procs.check()
    assert procs.stop() == {"oops": 1}


def test_live_view_and_summary_render() -> None:
    from rich.console import Console

    state = LiveState(phase="pipeline", total=100, events_in=50, progress=Progress(
        at=time.time(), enriched_out=40, es_docs=30, pg_rows=3, pg_flights=20, s3_objects=2,
        committed={"search": 30}, lag={"search": 10}))
    state.changes = [_change()]
    console = Console(record=True, width=120)
    console.print(live(state))
    text = console.export_text()
    assert "events in (replayed)" in text and "lag 10" in text and "rename UA" in text
    summary = json.loads((Path(__file__).parent / "summary_sample.json").read_text())
    console.print(summary_table(summary))
    text = console.export_text()
    assert "full output matches the oracle" in text and "336,776" in text


def test_targets_find_the_three_sinks_of_the_example() -> None:
    targets = Targets.of(load_pipeline(EXAMPLE, environ={}))
    assert (targets.events_topic, targets.enriched_topic) == ("flights", "flights.enriched")
    assert (targets.es[1], targets.pg[1], targets.s3[1:]) == ("flights", "route_stats", ("nycflights13", "archive/"))
    assert targets.groups["archive"] == ("threes-sync-archive", ("updates.flights",))


def test_replay_pauses_at_a_change_point_until_the_change_is_in_its_state_topic() -> None:
    import threading

    from threes.demo.changes import ChangeDriver

    change = ReferenceChange("rename UA", "airlines", {"carrier": "UA"}, "name", "New", "carrier", "airline_name",
                             0.5)

    class Probe:
        def es_count(self, _query: dict) -> int:
            return 1 if change.state_at else 0

    driver = ChangeDriver(pipeline=None, probe=Probe(), changes=[change], total=10, references={}, exact=True)
    in_state: list[bool] = []
    driver._apply = lambda c: setattr(c, "applied_at", time.time())  # the system of record: tested in tests/e2e
    driver._state_value = lambda c: "New" if in_state else "Old"
    produced: list[int] = []

    def replay() -> None:
        for i in range(10):
            produced.append(i)
            driver.gate(i, timeout_s=30)

    thread = threading.Thread(target=replay)
    thread.start()
    deadline = time.time() + 10
    while len(produced) < 5 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(produced) == 5 and thread.is_alive()  # paused after the 5th flight (50 %)
    driver.poll(replayed=5, enriched=3)
    assert change.applied_at is None  # two flights are not enriched yet: not now
    driver.poll(replayed=5, enriched=5)
    assert change.applied_at is not None and len(produced) == 5  # applied; still paused (not in the state topic)
    in_state.append(True)
    driver.poll(replayed=5, enriched=5)
    thread.join(10)
    assert len(produced) == 10 and change.state_at is not None and change.sink_at is not None
    assert driver.paused_s > 0 and not driver.pending()


def test_without_exact_the_change_is_made_at_once_and_the_replay_waits_only_for_the_state_topic() -> None:
    import threading

    from threes.demo.changes import ChangeDriver

    change = ReferenceChange("rename ORD", "airports", {"faa": "ORD"}, "name", "New", "dest", "dest_name", 0.2)
    driver = ChangeDriver(pipeline=None, probe=type("P", (), {"es_count": lambda self, q: 0})(), changes=[change],
                          total=10, references={})
    driver._apply = lambda c: setattr(c, "applied_at", time.time())
    driver._state_value = lambda c: "New"
    thread = threading.Thread(target=driver.gate, args=(1,), kwargs={"timeout_s": 30})
    thread.start()
    while driver._due is None:
        time.sleep(0.01)
    driver.poll(replayed=2, enriched=0)  # nothing enriched yet: applied anyway, and in the state topic
    thread.join(10)
    assert not thread.is_alive() and change.applied_at is not None and change.state_at is not None
    assert driver.pending()  # not yet seen in Elasticsearch


def test_progress_keeps_a_partitions_last_end_offset_while_its_leader_moves() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from threes.demo.monitor import ProgressProbe

    class Meta:
        topics = {"enriched": type("T", (), {"error": None, "partitions": {0: None, 1: None}})()}

    class Consumer:
        def __init__(self) -> None:
            self.ends = {0: 10, 1: 20}
            self.leaderless: set[int] = set()

        def list_topics(self, topic, timeout=None):
            return Meta()

        def get_watermark_offsets(self, tp, timeout=None):
            if tp.partition in self.leaderless:
                raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "Not leader for partition"))
            return 0, self.ends[tp.partition]

    probe = object.__new__(ProgressProbe)
    probe._consumer, probe._ends = Consumer(), {}
    assert probe.end_offsets("enriched") == {0: 10, 1: 20}
    probe._consumer.ends, probe._consumer.leaderless = {0: 15, 1: 30}, {1}
    assert probe.end_offsets("enriched") == {0: 15, 1: 20}  # the last reading, not an error, not 0
    probe._consumer.leaderless = set()
    assert probe.end_offsets("enriched") == {0: 15, 1: 30}


def _realtime_example() -> dict:
    from threes.demo.isolate import realtime_variant

    return realtime_variant(yaml.load(EXAMPLE.read_text(), Loader=_Yaml12BoolLoader))


def test_realtime_variant_keeps_the_projection_and_the_sinks_that_read_it() -> None:
    from stream_app.plan import build_plan
    from threes.config import pipeline_from_dict

    doc = yaml.load(EXAMPLE.read_text(), Loader=_Yaml12BoolLoader)
    pipeline = pipeline_from_dict(_realtime_example(), environ={})
    stream = pipeline.stream
    assert (stream.mode, stream.checkpoint_interval, stream.events.max_offsets_per_trigger) == (
        "realtime", "5 seconds", None)
    assert [(u.topic, u.kind) for u in stream.updates] == [("updates.flights", "projection")]
    assert [(svc.name, [s.type for s in svc.sinks]) for svc in pipeline.sync] == [
        ("search", ["elasticsearch_sink"]), ("archive", ["s3_sink"])]
    assert build_plan(stream, None, EXAMPLE.parent) is not None  # validate's checks, real-time mode's included
    assert doc["stream"]["updates"][1]["kind"] == "aggregation"  # the original document is untouched
    example = load_pipeline(EXAMPLE, environ={})
    assert example.stream.mode == "microbatch" and Targets.of(example).sinks == ("elasticsearch", "postgres", "s3")


def test_a_pipeline_without_route_stats_is_watched_and_sampled_on_its_two_sinks() -> None:
    from threes.config import pipeline_from_dict

    targets = Targets.of(pipeline_from_dict(_realtime_example(), environ={}))
    assert targets.pg is None and targets.sinks == ("elasticsearch", "s3")
    assert set(targets.groups) == {"search", "archive"}
    probe = type("Probe", (), {"targets": targets})()
    sampler = LatencySampler(probe=probe, key=FLIGHT_KEY, group_by=["origin", "dest"], every=1)
    sampler.on_produce(0, {**ROW, "dest": "IAH"})
    sampler._poll_pg()  # no route_stats table to look in: nothing happens, nothing is marked seen
    assert sampler.samples[0].seen == {}
    assert set(sampler.latencies()) == {"elasticsearch", "s3"}
    no_archive = _realtime_example()
    no_archive["sync"] = [svc for svc in no_archive["sync"] if svc["name"] != "archive"]
    with pytest.raises(ValueError, match="no s3_sink"):  # the enriched flights' two sinks are required
        Targets.of(pipeline_from_dict(no_archive, environ={}))


def test_views_say_what_was_skipped_and_show_no_route_stats_row() -> None:
    from rich.console import Console

    state = LiveState(phase="pipeline", total=100, events_in=50, progress=Progress(
        at=time.time(), enriched_out=40, es_docs=30, pg_rows=None, pg_flights=None, s3_objects=2))
    console = Console(record=True, width=160)
    console.print(live(state))
    assert "route_stats" not in console.export_text()
    summary = json.loads((Path(__file__).parent / "summary_sample.json").read_text())
    del summary["sinks"]["postgres"], summary["latency_s"]["postgres"]
    reason = "the pipeline has no PostgreSQL (rds_sink) target for route_stats"
    summary["oracle"]["route_stats"] = {"ok": None, "skipped": reason}
    summary["oracle"]["skipped"] = {"route_stats": reason}
    console.print(summary_table(summary))
    text = console.export_text()
    assert "route stats" in text and "skipped: the pipeline has no PostgreSQL" in text
    assert "PostgreSQL route_stats" not in text
    assert "(skipped: route_stats)" in text
