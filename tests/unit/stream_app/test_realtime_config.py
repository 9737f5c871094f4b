"""stream.mode: realtime — what Spark 4.2's real-time mode cannot run is a validate error naming the key."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernel.exceptions import ConfigError
from stream_app.config import StreamJobConfig
from stream_app.plan import build_plan
from stream_app.realtime import consumer_properties, realtime_problems

BASE = {
    "events": {"topic": "flights", "value_schema": "nycflights13/flight"},
    "snapshots": [{"name": "airports", "topics": ["state.airports"], "key_schema": "nycflights13/airport_key",
                   "value_schema": "nycflights13/airport"}],
    "lookups": [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_", "fields": ["name"]}],
    "enriched_topic": "flights.enriched",
    "dead_letter_topic": "flights.dlq",
    "checkpoint_location": "/tmp/cp",
    "updates": [{"topic": "updates.flights", "kind": "projection", "key": ["flight_id"], "version": "offset"}],
}
AGG = {"topic": "updates.delays", "kind": "aggregation", "group_by": ["origin"], "event_time": "time_hour",
       "window": "1 day", "watermark": "1 hour", "aggregations": {"flights": "count"}}


def test_microbatch_is_the_default_and_realtime_checkpoints_every_30_s():
    config = StreamJobConfig.model_validate(BASE)
    assert config.mode == "microbatch" and config.checkpoint_interval == "30 seconds"
    assert realtime_problems(config.model_copy(update={"mode": "realtime"})) == []


def test_a_checkpoint_interval_under_5_s_is_refused():
    with pytest.raises(ValidationError, match="at most every 5 seconds"):
        StreamJobConfig.model_validate({**BASE, "mode": "realtime", "checkpoint_interval": "2 seconds"})
    assert StreamJobConfig.model_validate({**BASE, "checkpoint_interval": "5 seconds"}).checkpoint_interval


def test_what_realtime_cannot_run_is_one_problem_per_key_with_the_reason():
    config = StreamJobConfig.model_validate(
        {**BASE, "mode": "realtime", "updates": [*BASE["updates"], AGG], "transform": "transforms.flights:classify",
         "events": {**BASE["events"], "max_offsets_per_trigger": 1000}}
    )
    problems = dict(realtime_problems(config))
    assert sorted(problems) == ["events.max_offsets_per_trigger", "transform", "updates[1].kind"]
    assert "aggregation cannot run in real-time mode on Spark 4.2" in problems["updates[1].kind"]
    assert "Python transform function" in problems["transform"]
    # the same config in micro-batch mode has none of them
    assert realtime_problems(config.model_copy(update={"mode": "microbatch"})) == []


def test_validate_reports_them_with_their_paths_under_stream():
    config = StreamJobConfig.model_validate({**BASE, "mode": "realtime", "updates": [*BASE["updates"], AGG]})
    with pytest.raises(ConfigError) as err:
        build_plan(config, None, None)
    paths = [p.path for p in err.value.problems]
    assert "stream.updates[1].kind" in paths


def test_the_java_consumer_gets_the_connection_and_a_jaas_line_for_sasl():
    text = consumer_properties({"bootstrap.servers": "127.0.0.1:19094", "security.protocol": "sasl_ssl",
                                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "threes",
                                "sasl.password": "s3cret", "ssl.ca.location": "/srv/tls/ca.pem"})
    assert "bootstrap.servers=127.0.0.1\\:19094" in text and "security.protocol=SASL_SSL" in text
    assert "ScramLoginModule required username\\=\"threes\" password\\=\"s3cret\";" in text
    assert "ssl.truststore.type=PEM" in text and "ssl.truststore.location=/srv/tls/ca.pem" in text
