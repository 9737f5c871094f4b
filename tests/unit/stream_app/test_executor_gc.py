"""The executors' garbage collector: ``stream.spark.executor_gc`` as JVM flags, and a clash named at load time."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from connectors.config.stream import SparkSettings

EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"


def test_the_default_collector_leads_the_executors_own_flags() -> None:
    assert SparkSettings().executor_java_options() == "-XX:+UseParallelGC"
    own = SparkSettings(conf={EXECUTOR_OPTIONS: "-Duser.timezone=UTC -Xss4m"})
    assert own.executor_java_options() == "-XX:+UseParallelGC -Duser.timezone=UTC -Xss4m"
    assert SparkSettings(executor_gc="serial").executor_java_options() == "-XX:+UseSerialGC"
    assert SparkSettings(executor_gc="g1").executor_java_options() == "-XX:+UseG1GC"


def test_jvm_leaves_the_choice_to_the_jvm() -> None:
    assert SparkSettings(executor_gc="jvm").executor_java_options() == ""
    kept = SparkSettings(executor_gc="jvm", conf={EXECUTOR_OPTIONS: "-Xss4m"})
    assert kept.executor_java_options() == "-Xss4m"


def test_a_collector_in_the_users_flags_wins_over_the_default() -> None:
    settings = SparkSettings(conf={EXECUTOR_OPTIONS: "-XX:+UseG1GC -XX:MaxGCPauseMillis=100"})
    assert settings.executor_java_options() == "-XX:+UseG1GC -XX:MaxGCPauseMillis=100"


def test_choosing_the_collector_twice_is_a_config_error_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"executor_gc 'serial' and conf 'spark.executor.extraJavaOptions' "
                                              r"\(-XX:\+UseG1GC\) both choose"):
        SparkSettings(executor_gc="serial", conf={EXECUTOR_OPTIONS: "-XX:+UseG1GC"})
    with pytest.raises(ValidationError, match="Input should be 'parallel', 'serial', 'g1' or 'jvm'"):
        SparkSettings(executor_gc="zgc")
