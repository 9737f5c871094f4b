"""``stream.transform`` in the running job: a column it adds reaches an update topic; a needed column it drops
stops the job at start-up."""

from __future__ import annotations

import sys
import textwrap
import uuid

import pytest

from kernel.exceptions import ConfigError

from .conftest import flight

TRANSFORMS = '''\
from pyspark.sql import functions as F


def classify(df):
    """A column from DataFrame code, and a filter that keeps the events routed to the dead letter topic."""
    late = F.when(F.col("dep_delay") > 15, F.lit("late")).otherwise(F.lit("on_time"))
    return df.withColumn("delay_class", late).filter(F.col("__error").isNotNull() | (F.col("flight_id") != 3))


def drop_name(df):
    return df.drop("origin_name")
'''


@pytest.fixture
def transforms(env, monkeypatch):
    """A module of transforms next to the test's config (its folder is the job's base_dir)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"transforms_{uuid.uuid4().hex[:8]}"
    (env.tmp / f"{name}.py").write_text(textwrap.dedent(TRANSFORMS))
    return name


def _updates(env):
    return [{"topic": env.updates, "kind": "projection", "key": ["flight_id"],
             "fields": ["flight_id", "origin_name", "delay_class"]}]


def test_a_column_the_transform_adds_reaches_a_projection_update(spark, env, transforms):
    env.put_airport("EWR")
    env.put_flights([flight(1, delay=30.0), flight(2, delay=1.0), flight(3, delay=40.0)])
    bad = env.put_raw_event(b"k", b"not avro")
    env.put_flights([flight(4, delay=None)])
    config = env.config(updates=_updates(env), transform=f"{transforms}:classify")
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(180)
    job.stop()

    # an Avro string: the CASE of two literals is never null in Spark's type, so neither in the schema
    assert {"name": "delay_class", "type": "string"} in job.plan.enriched.avro["fields"]
    updates = env.consume(env.updates, lambda rs: len(rs) >= 3)
    assert {r["value"]["flight_id"]: r["value"] for r in updates} == {
        1: {"flight_id": 1, "origin_name": "Newark Liberty Intl", "delay_class": "late"},
        2: {"flight_id": 2, "origin_name": "Newark Liberty Intl", "delay_class": "on_time"},
        4: {"flight_id": 4, "origin_name": "Newark Liberty Intl", "delay_class": "on_time"},
    }  # 3: filtered out by the transform
    enriched = env.consume(env.enriched, lambda rs: len(rs) >= 3)
    assert sorted(r["value"]["delay_class"] for r in enriched) == ["late", "on_time", "on_time"]
    letters = env.consume(env.dlq, lambda rs: len(rs) >= 1, deserialize=False)
    assert [(int(r["headers"]["dlq.partition"]), int(r["headers"]["dlq.offset"])) for r in letters] == [bad]


def test_a_transform_that_drops_a_column_an_update_reads_stops_the_job_at_start_up(spark, env, transforms):
    env.put_airport("EWR")
    config = env.config(updates=_updates(env), transform=f"{transforms}:drop_name")
    with pytest.raises(ConfigError) as info:
        env.start(spark, config)
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("stream.transform", "the function drops ['origin_name'], which stream.updates[0].fields reads: keep them "
                             "(a transform adds columns and filters rows)")]
    # a transform must keep the internal columns too
    (env.tmp / f"{transforms}_x.py").write_text("def only_ids(df):\n    return df.select('flight_id')\n")
    with pytest.raises(ConfigError, match=r"stream\.transform: the function dropped the internal columns "
                                          r"\['__key', '__headers'"):
        env.start(spark, env.config(updates=_updates(env)[:0], transform=f"{transforms}_x:only_ids"))
