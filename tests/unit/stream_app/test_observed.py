"""Reading a micro-batch's observed counts without a JVM exception per read."""

from __future__ import annotations

from typing import Any

from stream_app.progress import observed


def test_observed_equals_observation_get_without_converting_a_java_exception(spark: Any, monkeypatch: Any) -> None:
    import pyspark.errors.exceptions.captured as captured
    from pyspark.sql import Observation
    from pyspark.sql import functions as f

    converted: list[Any] = []
    convert = captured.convert_exception
    monkeypatch.setattr(captured, "convert_exception", lambda e: converted.append(e) or convert(e))

    obs = Observation("counts")
    spark.range(10).observe(obs, f.count(f.lit(1)).alias("n"), f.sum("id").alias("total")).collect()
    assert observed(obs, ("n", "total")) == {"n": 10, "total": 45}
    assert converted == []  # one JVM get per name: no iterator ended by NoSuchElementException
    # pyspark 4.0's Observation.get ended py4j's iterator with a Java exception (converted each read);
    # pyspark 4.2's does not: both read the same counts
    assert obs.get == {"n": 10, "total": 45}
