"""Snapshots without reader schemas read with the writer schemas their topics carry; a mismatch fails at start."""

from __future__ import annotations

import json

import pytest

from kernel.exceptions import ConfigError
from schemas.serde import fingerprint
from stream_app.config import StreamJobConfig
from stream_app.plan import build_plan
from stream_app.plan.writer_match import writers_for

from .test_plan import FLIGHT

KEY = {"type": "record", "name": "airports_key", "namespace": "threes.rds",
       "fields": [{"name": "faa", "type": "string"}]}
VALUE = {"type": "record", "name": "airports", "namespace": "threes.rds",
         "fields": [{"name": "faa", "type": "string"}, {"name": "name", "type": ["null", "string"], "default": None}]}
# the same entity from another source: other record names, the same fields (and one more)
OTHER_VALUE = {"type": "record", "name": "airports_es", "namespace": "threes.elasticsearch",
               "fields": [{"name": "faa", "type": "string"}, {"name": "name", "type": ["null", "string"]},
                          {"name": "alt", "type": "long"}]}
OTHER_KEY = {"type": "record", "name": "airports_es_key", "namespace": "threes.elasticsearch",
             "fields": [{"name": "faa", "type": "string"}]}


def config(tmp_path, **snapshot):
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    return StreamJobConfig.model_validate({
        "events": {"topic": "flights", "value_schema": str(tmp_path / "flight.avsc")},
        "snapshots": [{"name": "airports", "topics": ["state.airports", "state.airports_es"], **snapshot}],
        "lookups": [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_"}],
        "enriched_topic": "flights.enriched",
        "dead_letter_topic": "flights.dlq",
        "checkpoint_location": str(tmp_path / "cp"),
        "updates": [{"topic": "updates.flights", "kind": "projection", "key": ["flight_id"],
                     "fields": ["flight_id", "origin_name"]}],
    })


def store(subjects):
    return lambda subject: [json.dumps(s) for s in subjects.get(subject, [])]


SUBJECTS = {
    "state.airports-key": [KEY], "state.airports-value": [VALUE],
    "state.airports_es-key": [OTHER_KEY], "state.airports_es-value": [OTHER_VALUE],
}


def test_no_reader_schema_reads_with_the_topics_writer_schemas(tmp_path):
    plan = build_plan(config(tmp_path), None, tmp_path, store(SUBJECTS))
    snap = plan.snapshots["airports"]
    assert [f["name"] for f in snap.value.avro["fields"]] == ["faa", "name"]  # the first topic's latest schema
    assert snap.value.avro["aliases"] == ["threes.elasticsearch.airports_es"]  # matched by field names
    assert snap.key.avro["aliases"] == ["threes.elasticsearch.airports_es_key"]
    writers = {fingerprint(s): json.dumps(s) for s in (VALUE, OTHER_VALUE, FLIGHT)}
    assert set(writers_for(writers, snap.value.avro)) == {fingerprint(VALUE), fingerprint(OTHER_VALUE)}  # no DLQ
    assert "origin_name" in [f["name"] for f in plan.enriched.avro["fields"]]


def test_a_hand_written_reader_schema_gets_the_writer_names_as_aliases(tmp_path):
    (tmp_path / "v.avsc").write_text(json.dumps({"type": "record", "name": "Airport", "namespace": "mine",
                                                 "fields": [{"name": "name", "type": ["null", "string"]}]}))
    (tmp_path / "k.avsc").write_text(json.dumps({"type": "record", "name": "AirportKey",
                                                 "fields": [{"name": "faa", "type": "string"}]}))
    cfg = config(tmp_path, key_schema=str(tmp_path / "k.avsc"), value_schema=str(tmp_path / "v.avsc"))
    plan = build_plan(cfg, None, tmp_path, store(SUBJECTS))
    assert plan.snapshots["airports"].value.avro["aliases"] == ["threes.rds.airports", "threes.elasticsearch.airports_es"]


def test_a_writer_the_reader_cannot_read_is_a_start_up_error_naming_topic_record_and_field(tmp_path):
    (tmp_path / "v.avsc").write_text(json.dumps({"type": "record", "name": "Airport",
                                                 "fields": [{"name": "name", "type": ["null", "string"]},
                                                            {"name": "tz", "type": "double"}]}))
    cfg = config(tmp_path, key_schema="nycflights13/airport_key", value_schema=str(tmp_path / "v.avsc"))
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, None, tmp_path, store(SUBJECTS))
    text = str(info.value)
    assert "stream.snapshots[0].value_schema" in text
    assert "topic 'state.airports': writer record threes.rds.airports" in text and "['tz']" in text
    assert "topic 'state.airports_es': writer record threes.elasticsearch.airports_es" in text


def test_a_topic_without_recorded_schemas_is_a_start_up_error(tmp_path):
    with pytest.raises(ConfigError, match="no value schema recorded for topic"):
        build_plan(config(tmp_path), None, tmp_path, store({"state.airports-key": [KEY]}))
