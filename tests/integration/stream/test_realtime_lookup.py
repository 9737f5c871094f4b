"""Real-time mode's snapshot lookups in the JVM, in a real ``trigger(realTime=...)`` query on real Kafka.

Kafka source -> from_avro (writer schema) -> the JVM lookup UDF (stream_app/jars/threes-lookup.jar)
-> Kafka sink, all in the JVM. The snapshot is eventually fresh like a GlobalKTable: a reference
change and a tombstone are seen by *later* events, so the test keeps writing events until one sees
the change (bounded by a deadline), then checks that every event after it sees it too.
"""

from __future__ import annotations

import json
import time

import pytest

from schemas.serde import fingerprint, schema_json
from stream_app.avro import decode_avro
from stream_app.realtime import (
    close_stores,
    consumer_properties,
    lookup_column,
    lookup_jar,
    register_lookup,
    store_status,
)

from .conftest import AIRPORT, AIRPORT_KEY, FLIGHT, flight

pytestmark = pytest.mark.spark


def test_lookups_in_a_realtime_query_see_reference_changes_and_tombstones(spark, env):
    from pyspark.sql import functions as f

    lookup_jar()  # built by make jvm; the session's spark.jars carry it (tests/conftest.py)
    for faa in ("EWR", "LAX", "JFK"):
        env.put_airport(faa)
    config = env.config(mode="realtime", checkpoint_interval="5 seconds")
    snapshot = config.snapshots[0]
    key_json, value_json = schema_json(AIRPORT_KEY), schema_json(AIRPORT)
    udf = f"threes_lookup_{env.unique.replace('-', '_')}"
    store_id = register_lookup(
        spark, udf, snapshot, key_json, value_json, consumer_properties(env.kafka.librdkafka_config()),
        env.kafka.schema_topic,
    )
    assert store_id.startswith(f"{snapshot.name}@")
    out_topic = env.enriched
    events = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", env.conf["bootstrap.servers"])
        .option("subscribe", env.events)
        .option("startingOffsets", "earliest")
        .load()
    )
    decoded = events.select(decode_avro(f.col("value"), {fingerprint(FLIGHT): schema_json(FLIGHT)},
                                        schema_json(FLIGHT)).alias("e")).select("e.*")
    origin = lookup_column(udf, f.struct(f.col("origin").alias("faa")), key_json, value_json)
    enriched = decoded.select(
        f.col("flight_id").cast("string").alias("key"),
        f.to_json(f.struct("flight_id", "origin", origin["name"].alias("origin_name"))).alias("value"),
    )
    query = (
        enriched.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", env.conf["bootstrap.servers"])
        .option("topic", out_topic)
        .option("checkpointLocation", str(env.tmp / "rt-checkpoint"))
        .outputMode("update")
        .trigger(realTime="5 seconds")
        .start()
    )
    try:
        def names(records):
            return {json.loads(r["raw"])["flight_id"]: json.loads(r["raw"]).get("origin_name") for r in records}

        env.put_flights([flight(1, "EWR"), flight(2, "JFK"), flight(3, "SFO")])
        got = names(env.consume(out_topic, lambda rs: {1, 2, 3} <= set(names(rs)), timeout_s=180, deserialize=False))
        assert got[1] == "Newark Liberty Intl" and got[2] == "John F Kennedy Intl"
        assert got[3] is None  # SFO is not in the snapshot: a left lookup

        env.put_airport("EWR", "Newark RENAMED")
        env.put_airport("JFK", delete=True)
        # eventually fresh: write pairs of events until a pair sees both changes
        i, deadline, seen_at = 100, time.monotonic() + 120, None
        while seen_at is None:
            assert time.monotonic() < deadline, "the reference change and the tombstone were never seen"
            env.put_flights([flight(i, "EWR"), flight(i + 1, "JFK")])
            got = names(env.consume(out_topic, lambda rs, i=i: {i, i + 1} <= set(names(rs)), timeout_s=120,
                                    deserialize=False))
            if got[i] == "Newark RENAMED" and got[i + 1] is None:
                seen_at = i
            i += 2
        # ...and once seen, never unseen: every later event joins the new value
        env.put_flights([flight(1000 + n, "EWR") for n in range(20)] + [flight(2000, "JFK")])
        got = names(env.consume(out_topic, lambda rs: set(range(1000, 1020)) | {2000} <= set(names(rs)),
                                timeout_s=120, deserialize=False))
        assert {got[1000 + n] for n in range(20)} == {"Newark RENAMED"} and got[2000] is None
        # local[2]: the executors are the driver's JVM, whose store counted the records it applied
        status = store_status(spark)[store_id]
        assert status["keys"] == 2 and status["applied"] and status["tombstones"] == 1 and status["ready"] and status["bad_records"] == 0
        assert status["bytes"] <= status["max_bytes"] == snapshot.max_bytes
    finally:
        query.stop()
        close_stores(spark)  # the store's consumer would tail this test's topics for the rest of the session


def test_the_jvm_store_reads_its_topics_over_sasl_ssl_with_the_pipelines_ca(spark, env, endpoints):
    """The executors' consumer gets the pipeline's SASL login and CA file (PEM trust store)."""
    import io
    import uuid

    import fastavro

    from kernel.config.models import KafkaConfig
    from threes.local.kafka import upsert_scram_user

    lookup_jar()
    user, password = f"rt-{uuid.uuid4().hex[:8]}", 'p"w\\d x'  # a quote and a backslash, JAAS-escaped
    upsert_scram_user(endpoints.kafka_bootstrap, user, password)
    secure = KafkaConfig.model_validate({
        "bootstrap_servers": endpoints.kafka_sasl_bootstrap, "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": user, "sasl_password": password,
        "ssl_ca_location": endpoints.tls_ca_location, "schema_topic": env.kafka.schema_topic,
    })
    env.put_airport("EWR")
    jvm = spark.sparkContext._jvm
    spec = jvm.threes.store.StoreSpec(f"tls-{env.unique}", consumer_properties(secure.librdkafka_config()),
                                      env.airports, secure.schema_topic, schema_json(AIRPORT_KEY),
                                      schema_json(AIRPORT), 1 << 20, 120_000, "", None, -1)
    store = jvm.threes.store.SnapshotStore.forSpec(spec)
    try:
        key = io.BytesIO()
        fastavro.schemaless_writer(key, fastavro.parse_schema(AIRPORT_KEY), {"faa": "EWR"})
        value = store.lookup(bytearray(key.getvalue()))  # waits at the readiness gate
        record = fastavro.schemaless_reader(io.BytesIO(bytes(value)), fastavro.parse_schema(AIRPORT))
        assert record["name"] == "Newark Liberty Intl" and store.keys() == 1
    finally:
        store.close()


def test_a_store_stops_at_a_deleted_topic_and_refuses_its_state_folder_once_the_topic_is_created_again(spark, env):
    """A deleted snapshot topic fails the store's lookups; a RocksDB folder of the deleted topic is never read.

    Without the topic check, the store's consumer waits for the deleted topic without end and the lookups go on
    answering from the old records; without the topic ids in the store's metadata, a restart reads the old table
    and the new topic on top of it.
    """
    import io

    import fastavro
    from py4j.protocol import Py4JJavaError

    from kernel.kafka import clients
    from kernel.kafka.topics import ensure_compacted_topic

    lookup_jar()
    env.put_airport("EWR")
    env.put_airport("JFK")
    jvm = spark.sparkContext._jvm
    spec = jvm.threes.store.StoreSpec(
        f"deleted-{env.unique}", consumer_properties(env.kafka.librdkafka_config()), env.airports,
        env.kafka.schema_topic, schema_json(AIRPORT_KEY), schema_json(AIRPORT), 1 << 20, 120_000, "",
        str(env.tmp / "stores"), -1,
    )
    stores = jvm.threes.store.SnapshotStore
    admin = clients.kafka_admin(env.kafka)

    def name(store, faa: str) -> str | None:
        key = io.BytesIO()
        fastavro.schemaless_writer(key, fastavro.parse_schema(AIRPORT_KEY), {"faa": faa})
        value = store.lookup(bytearray(key.getvalue()))
        return None if value is None else fastavro.schemaless_reader(
            io.BytesIO(bytes(value)), fastavro.parse_schema(AIRPORT))["name"]

    def failure(store, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                name(store, "EWR")
            except Py4JJavaError as exc:
                return str(exc.java_exception.getMessage())
            time.sleep(0.5)
        raise AssertionError(f"the store still answers {timeout_s:.0f} s after its topic was deleted")

    def recreate(*airports: tuple[str, str]) -> None:
        deadline = time.monotonic() + 60
        while True:  # the broker finishes the deletion in the background
            try:
                ensure_compacted_topic(env.conf, env.airports, partitions=2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        for faa, new_name in airports:
            env.put_airport(faa, new_name)

    try:
        store = stores.forSpec(spec)
        assert name(store, "EWR") == "Newark Liberty Intl"
        stores.closeStore(spec)  # a clean stop checkpoints the RocksDB folder
        store = stores.forSpec(spec)
        assert name(store, "JFK") == "John F Kennedy Intl" and store.restoredKeys() == 2  # from the folder

        admin.delete_topics([env.airports])[env.airports].result(30)
        said = failure(store)
        assert f"topic {env.airports} was deleted while the job ran" in said, said
        assert "Restart the job once the topic exists again" in said

        stores.closeStore(spec)
        recreate(("JFK", "JFK renamed"))
        store = stores.forSpec(spec)  # a restart: the folder holds the deleted topic's table
        assert name(store, "JFK") == "JFK renamed"
        assert name(store, "EWR") is None and store.restoredKeys() == -1  # read from the new topic only

        admin.delete_topics([env.airports])[env.airports].result(30)
        recreate(("EWR", None))
        said = failure(store)
        assert f"topic {env.airports} was deleted" in said, said  # and created again, if the check saw it back
    finally:
        stores.closeStore(spec)
