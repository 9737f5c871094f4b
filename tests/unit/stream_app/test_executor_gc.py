"""The executors' garbage collector: ``stream.spark.executor_gc`` as JVM flags, and a clash named at load time."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from connectors.config.stream import SparkSettings, memory_mib

EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"


def test_the_default_collector_leads_the_executors_own_flags() -> None:
    assert SparkSettings().executor_java_options() == "-XX:+UseParallelGC"  # auto, Spark's 1g executors
    own = SparkSettings(conf={EXECUTOR_OPTIONS: "-Duser.timezone=UTC -Xss4m"})
    assert own.executor_java_options() == "-XX:+UseParallelGC -Duser.timezone=UTC -Xss4m"
    assert SparkSettings(executor_gc="serial").executor_java_options() == "-XX:+UseSerialGC"
    assert SparkSettings(executor_gc="g1").executor_java_options() == "-XX:+UseG1GC"


def test_jvm_leaves_the_choice_to_the_jvm() -> None:
    assert SparkSettings(executor_gc="jvm").executor_java_options() == ""
    kept = SparkSettings(executor_gc="jvm", conf={EXECUTOR_OPTIONS: "-Xss4m"})
    assert kept.executor_java_options() == "-Xss4m"


def test_a_collector_in_the_users_flags_wins_over_the_default() -> None:
    for choice in ("auto", "jvm"):
        settings = SparkSettings(executor_gc=choice, conf={EXECUTOR_OPTIONS: "-XX:+UseG1GC -XX:MaxGCPauseMillis=100"})
        assert settings.executor_java_options() == "-XX:+UseG1GC -XX:MaxGCPauseMillis=100"


def test_choosing_the_collector_twice_is_a_config_error_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"executor_gc 'serial' and conf 'spark.executor.extraJavaOptions' "
                                              r"\(-XX:\+UseG1GC\) both choose"):
        SparkSettings(executor_gc="serial", conf={EXECUTOR_OPTIONS: "-XX:+UseG1GC"})
    with pytest.raises(ValidationError, match="Input should be 'auto', 'parallel', 'serial', 'g1' or 'jvm'"):
        SparkSettings(executor_gc="zgc")


def test_auto_keeps_the_jvms_collector_for_executors_above_8g() -> None:
    def auto(memory: str) -> str:
        return SparkSettings(conf={"spark.executor.memory": memory}).executor_java_options()

    assert auto("8g") == auto("8192m") == auto("8192") == "-XX:+UseParallelGC"
    assert auto("9g") == auto("16gb") == auto("1t") == ""
    assert SparkSettings(executor_gc="parallel", conf={"spark.executor.memory": "64g"}).executor_java_options() \
        == "-XX:+UseParallelGC"  # an explicit choice holds at any size


def test_spark_memory_sizes_in_mib() -> None:
    assert memory_mib("1g") == 1024 and memory_mib("512m") == 512 and memory_mib("2048") == 2048
    assert memory_mib("2048k") == 2 and memory_mib("1GB") == 1024 and memory_mib("1b") == 2.0**-20
    assert memory_mib("lots") is None and memory_mib("1.5g") is None
