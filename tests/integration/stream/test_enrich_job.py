"""The stream job against real Kafka and Spark: enrichment, freshness, deletes, dead letters."""

from __future__ import annotations

import time

import pytest

from kernel.dlq import DeadLetter

from .conftest import flight, offsets_header, same_on_every_master

pytestmark = pytest.mark.spark


def test_enriches_events_with_two_lookups_of_one_snapshot(spark, env):
    for faa in ("EWR", "JFK", "LAX"):
        env.put_airport(faa)
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "JFK", "SFO")])
    job = env.start(spark, available_now=True)
    assert job.await_termination(120)
    got = {r["value"]["flight_id"]: r for r in env.consume(env.enriched, lambda rs: len(rs) >= 2)}
    one, two = got[1]["value"], got[2]["value"]
    assert one["origin_name"] == "Newark Liberty Intl" and one["dest_name"] == "Los Angeles Intl"
    assert one["dest_alt"] == 125 and one["origin_tz"] == -5 and "origin_alt" not in one  # fields: [name, tz]
    assert two["origin_name"] == "John F Kennedy Intl" and two["dest_name"] is None  # left join, SFO unknown
    assert got[1]["key"] == b"1"  # the event's key is kept
    # the snapshot offsets the batch joined against travel in a header
    assert sum(offsets_header(got[1])[env.airports].values()) == 3
    assert job.snapshots["airports"].base_rows == 3
    # three records: loaded the way a refresh reads, by the driver's consumer and fastavro (no Spark job)
    assert job.snapshots["airports"].decoded_by == "driver"


class Flow:
    """Produces a flight every ``period_s`` in a thread, remembering when each was produced."""

    def __init__(self, env, origin="EWR", dest="LAX", period_s=0.1, first_id=1):
        import threading

        self.env, self.origin, self.dest, self.period_s = env, origin, dest, period_s
        self.sent: dict[int, float] = {}
        self.next_id = first_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        producer = self.env.producer
        while not self._stop.is_set():
            i = self.next_id
            self.sent[i] = time.time()
            producer.produce(self.env.events, key=str(i).encode(), value=self.env.flight_ser(flight(i, self.origin, self.dest)))
            producer.poll(0)
            self.next_id += 1
            self._stop.wait(self.period_s)
        producer.flush(10)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def by_flight(records):
    return {r["value"]["flight_id"]: r for r in records}


def test_changed_reference_reaches_every_later_event(spark, env):
    for faa in ("EWR", "LAX"):
        env.put_airport(faa)
    # the worker-index engine: the change travels in the overlay shipped with each batch
    snapshots = [{**env.config().model_dump()["snapshots"][0], "index_min_rows": 0}]
    job = env.start(spark, env.config(snapshots=snapshots))
    assert job.snapshots["airports"].mode == "indexed"
    with Flow(env) as flow:
        env.consume(env.enriched, lambda rs: len(rs) >= 5, timeout_s=120)
        partition, offset = env.put_airport("EWR", "Newark RENAMED")
        changed_at = time.time()
        time.sleep(2 * job.config.trigger_interval_s + 1)
    # every event is enriched (the left join keeps them all)
    got = by_flight(env.consume(env.enriched, lambda rs: set(flow.sent) <= set(by_flight(rs)), timeout_s=120))
    before = [i for i, t in flow.sent.items() if t < changed_at - 0.5]
    after = [i for i, t in flow.sent.items() if t > changed_at]
    assert before and len(after) >= 2
    assert all(got[i]["value"]["origin_name"] == "Newark Liberty Intl" for i in before[:3])
    # within two triggers (in fact: from the first batch planned after the change)
    late = [i for i in after if flow.sent[i] >= changed_at + 2 * job.config.trigger_interval_s]
    assert late and all(got[i]["value"]["origin_name"] == "Newark RENAMED" for i in after)
    assert job.snapshots["airports"].decoded_by == "driver"  # a one-record refresh: fastavro, no Spark job
    # staleness and size are exported: the snapshot was caught up before the last batch, seconds ago
    from prometheus_client import REGISTRY

    labels = {"job": job.config.name, "snapshot": "airports"}
    assert REGISTRY.get_sample_value("threes_stream_snapshot_age_seconds", labels) < 60
    assert REGISTRY.get_sample_value("threes_stream_snapshot_keys", labels) + REGISTRY.get_sample_value(
        "threes_stream_snapshot_overlay_records", labels) >= 2
    assert REGISTRY.get_sample_value("threes_stream_records_total", {"job": job.config.name, "kind": "enriched"}) >= 5
    # the header tells which snapshot offsets each event joined against, consistently with its value
    for rec in got.values():
        seen = offsets_header(rec)[env.airports].get(str(partition), 0)
        assert (rec["value"]["origin_name"] == "Newark RENAMED") == (seen > offset)


ENGINES = {"broadcast": {}, "indexed": {"index_min_rows": 0}, "partitioned": {"broadcast_max_rows": 1}}


@pytest.mark.parametrize("join", list(ENGINES))
def test_deleted_reference_gives_nulls_and_a_reinsert_brings_it_back(spark, env, join, outputs_by_master):
    for faa in ("EWR", "LAX", "JFK"):
        env.put_airport(faa)
    snapshots = [{**env.config().model_dump()["snapshots"][0], **ENGINES[join]}]
    lookups = [
        {"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_", "how": "inner"},
        {"snapshot": "airports", "on": {"dest": "faa"}, "prefix": "dest_"},
    ]
    job = env.start(spark, env.config(snapshots=snapshots, lookups=lookups))
    assert job.snapshots["airports"].mode == join
    env.put_flights([flight(1, "EWR", "LAX")])
    env.consume(env.enriched, lambda rs: 1 in by_flight(rs), timeout_s=120)
    env.put_airport("LAX", delete=True)
    env.put_airport("JFK", delete=True)
    env.put_flights([flight(2, "EWR", "LAX"), flight(3, "JFK", "EWR")])  # 3: origin deleted, inner lookup
    env.put_flights([flight(4, "EWR", "EWR")])
    env.consume(env.enriched, lambda rs: 4 in by_flight(rs), timeout_s=120)
    env.put_airport("LAX", "Los Angeles AGAIN")
    env.put_flights([flight(5, "EWR", "LAX")])
    got = by_flight(env.consume(env.enriched, lambda rs: 5 in by_flight(rs), timeout_s=120))
    assert got[1]["value"]["dest_name"] == "Los Angeles Intl"
    assert got[2]["value"]["dest_name"] is None and got[2]["value"]["dest_alt"] is None  # left join: nulls
    assert 3 not in got  # inner join on a deleted origin: dropped
    assert got[5]["value"]["dest_name"] == "Los Angeles AGAIN"  # re-inserted
    # the same enriched events whatever the master (local[2] or the standalone cluster: test_cluster.py)
    same_on_every_master(outputs_by_master, f"tombstones-{join}", spark, {i: r["value"] for i, r in got.items()})


@pytest.mark.parametrize("bootstrap", ["small", "spark"])
def test_undecodable_records_go_to_the_dead_letter_topic_and_the_job_goes_on(spark, env, bootstrap):
    from schemas.serde import MARKER, fingerprint

    from .conftest import FLIGHT

    env.put_airport("EWR")
    env.put_airport("LAX")
    bad_snapshot = env.producer.produce  # a snapshot record that does not decode
    bad_snapshot(env.airports, key=env.key_ser({"faa": "BAD"}), value=b"\xc3\x01" + b"\x00" * 8 + b"junk")
    env.producer.flush(10)
    # "small": the topic is no bigger than overlay_max_rows and is read like a refresh; "spark": a bigger
    # topic's path (a Spark read, decode and window), forced by overlay_max_rows 1
    snapshots = [{**env.config().model_dump()["snapshots"][0], **({"overlay_max_rows": 1} if bootstrap == "spark" else {})}]
    job = env.start(spark, env.config(snapshots=snapshots))
    assert job.snapshots["airports"].decoded_by == "spark"  # the bad record: decoded by the JVM, which names it
    env.put_flights([flight(1)])
    bad = {
        "not avro": env.put_raw_event(b"k1", b"plain text"),
        "unknown fingerprint": env.put_raw_event(b"k2", MARKER + b"\x01" * 8 + b"\x02"),
        "corrupt body": env.put_raw_event(b"k3", MARKER + fingerprint(FLIGHT) + b"\xff\xff\xff"),
        "null value": env.put_raw_event(b"k4", None),
    }
    env.put_flights([flight(2)])
    # one more while the job runs: a small refresh, which the driver's decoder hands to the JVM's
    bad_snapshot(env.airports, key=env.key_ser({"faa": "BAD2"}), value=b"\xc3\x01" + b"\x00" * 8 + b"junk")
    env.producer.flush(10)
    letters = env.consume(env.dlq, lambda rs: len(rs) >= 6, timeout_s=120, deserialize=False)
    got = {(int(r["headers"]["dlq.partition"]), int(r["headers"]["dlq.offset"])): r for r in letters}
    for reason, where in bad.items():
        letter = DeadLetter.from_headers(list(got[where]["headers"].items()))
        assert letter.topic == env.events and letter.stage == "decode" and letter.component == job.config.name, reason
    assert "C3 01" in DeadLetter.from_headers(list(got[bad["not avro"]]["headers"].items())).message
    assert "unknown writer schema" in DeadLetter.from_headers(list(got[bad["unknown fingerprint"]]["headers"].items())).message
    assert "does not decode" in DeadLetter.from_headers(list(got[bad["corrupt body"]]["headers"].items())).message
    assert got[bad["not avro"]]["raw"] == b"plain text" and got[bad["not avro"]]["key"] == b"k1"  # bytes untouched
    snap = [DeadLetter.from_headers(list(r["headers"].items())) for r in letters if r["headers"]["dlq.stage"] == b"snapshot"]
    assert len(snap) == 2 and {s.topic for s in snap} == {env.airports}
    assert all("unknown writer schema" in s.message for s in snap)
    # the job keeps running: good events before and after are enriched
    assert {1, 2} <= set(by_flight(env.consume(env.enriched, lambda rs: {1, 2} <= set(by_flight(rs)), timeout_s=120)))
    assert all(q.isActive for q in job.queries)
    # every event is counted once, as enriched or dead-lettered (the batch counts arrive late, by listener)
    kinds = ("events", "enriched", "dead_letters", "updates")
    deadline = time.monotonic() + 60
    while True:
        totals = {k: sum(c[k] for c in list(job.counts.values())) for k in kinds}
        if totals["events"] >= 6 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert totals == {"events": 6, "enriched": 2, "dead_letters": 4, "updates": 0}
