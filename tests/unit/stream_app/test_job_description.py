"""Spark jobs a snapshot starts are named in Spark's UI, history server and event log."""

from __future__ import annotations

from typing import Any

from stream_app.session import job_description

DESCRIPTION = "spark.job.description"


def _job_descriptions(spark: Any) -> list[str]:
    """The descriptions of the jobs Spark's status store holds (what the UI lists)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    found = []
    for i in range(jobs.size()):
        description = jobs.apply(i).description()
        if description.isDefined():
            found.append(description.get())
    return found


def test_jobs_started_inside_carry_the_description_and_the_thread_gets_its_own_back(spark: Any) -> None:
    context = spark.sparkContext
    context.setJobDescription("the caller's own")
    try:
        with job_description(spark, "threes snapshot airports: bootstrap"):
            spark.range(7).count()
            with job_description(spark, "threes snapshot airports: lookup files of p1"):
                spark.range(5).count()
            assert context.getLocalProperty(DESCRIPTION) == "threes snapshot airports: bootstrap"
        assert context.getLocalProperty(DESCRIPTION) == "the caller's own"
    finally:
        context.setLocalProperty(DESCRIPTION, None)
    assert context.getLocalProperty(DESCRIPTION) is None
    described = _job_descriptions(spark)
    assert "threes snapshot airports: bootstrap" in described
    assert "threes snapshot airports: lookup files of p1" in described


def test_the_description_is_removed_after_an_error(spark: Any) -> None:
    context = spark.sparkContext
    try:
        with job_description(spark, "threes snapshot airports: refresh"):
            assert context.getLocalProperty(DESCRIPTION) == "threes snapshot airports: refresh"
            raise RuntimeError("Kafka went away")
    except RuntimeError:
        pass
    assert context.getLocalProperty(DESCRIPTION) is None
