"""The JVMs' flags: ``stream.spark.executor_gc`` and ``jit_inlining`` as JVM flags, and a clash named at load time.

The collector's tests set ``jit_inlining: jvm`` so that their flags are the collector's alone.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stream_app.spark_settings import LEAN_INLINING, SparkSettings, memory_mib

EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"


def settings(**kwargs) -> SparkSettings:
    return SparkSettings(jit_inlining="jvm", **kwargs)


def test_the_default_collector_leads_the_executors_own_flags() -> None:
    assert settings().executor_java_options() == "-XX:+UseParallelGC"  # auto, Spark's 1g executors
    own = settings(conf={EXECUTOR_OPTIONS: "-Duser.timezone=UTC -Xss4m"})
    assert own.executor_java_options() == "-XX:+UseParallelGC -Duser.timezone=UTC -Xss4m"
    assert settings(executor_gc="serial").executor_java_options() == "-XX:+UseSerialGC"
    assert settings(executor_gc="g1").executor_java_options() == "-XX:+UseG1GC"


def test_jvm_leaves_the_choice_to_the_jvm() -> None:
    assert settings(executor_gc="jvm").executor_java_options() == ""
    kept = settings(executor_gc="jvm", conf={EXECUTOR_OPTIONS: "-Xss4m"})
    assert kept.executor_java_options() == "-Xss4m"


def test_a_collector_in_the_users_flags_wins_over_the_default() -> None:
    for choice in ("auto", "jvm"):
        chosen = settings(executor_gc=choice, conf={EXECUTOR_OPTIONS: "-XX:+UseG1GC -XX:MaxGCPauseMillis=100"})
        assert chosen.executor_java_options() == "-XX:+UseG1GC -XX:MaxGCPauseMillis=100"


def test_choosing_the_collector_twice_is_a_config_error_naming_both() -> None:
    with pytest.raises(ValidationError, match=r"executor_gc 'serial' and conf 'spark.executor.extraJavaOptions' "
                                              r"\(-XX:\+UseG1GC\) both choose"):
        settings(executor_gc="serial", conf={EXECUTOR_OPTIONS: "-XX:+UseG1GC"})
    with pytest.raises(ValidationError, match="Input should be 'auto', 'parallel', 'serial', 'g1' or 'jvm'"):
        settings(executor_gc="zgc")


def test_auto_keeps_the_jvms_collector_for_executors_above_8g() -> None:
    def auto(memory: str) -> str:
        return settings(conf={"spark.executor.memory": memory}).executor_java_options()

    assert auto("8g") == auto("8192m") == auto("8192") == "-XX:+UseParallelGC"
    assert auto("9g") == auto("16gb") == auto("1t") == ""
    assert settings(executor_gc="parallel", conf={"spark.executor.memory": "64g"}).executor_java_options() \
        == "-XX:+UseParallelGC"  # an explicit choice holds at any size


def test_spark_memory_sizes_in_mib() -> None:
    assert memory_mib("1g") == 1024 and memory_mib("512m") == 512 and memory_mib("2048") == 2048
    assert memory_mib("2048k") == 2 and memory_mib("1GB") == 1024 and memory_mib("1b") == 2.0**-20
    assert memory_mib("lots") is None and memory_mib("1.5g") is None


def test_lean_inlining_leads_both_jvms_flags_by_default() -> None:
    assert LEAN_INLINING.split() == ["-XX:MaxInlineLevel=6", "-XX:InlineSmallCode=1000", "-XX:MaxInlineSize=20",
                                     "-XX:FreqInlineSize=200"]
    default = SparkSettings()
    assert default.executor_java_options() == f"-XX:+UseParallelGC {LEAN_INLINING}"
    assert default.driver_java_options() == LEAN_INLINING
    own = SparkSettings(conf={DRIVER_OPTIONS: "-Xss4m", EXECUTOR_OPTIONS: "-Duser.timezone=UTC"})
    assert own.driver_java_options() == f"{LEAN_INLINING} -Xss4m"
    assert own.executor_java_options() == f"-XX:+UseParallelGC {LEAN_INLINING} -Duser.timezone=UTC"


def test_jvm_inlining_or_a_users_inlining_flag_keeps_the_jvms_defaults() -> None:
    jvm = SparkSettings(jit_inlining="jvm", conf={DRIVER_OPTIONS: "-Xss4m"})
    assert jvm.driver_java_options() == "-Xss4m" and jvm.executor_java_options() == "-XX:+UseParallelGC"
    # a user who tunes inlining for one JVM gets exactly that there; the other JVM keeps lean
    mine = SparkSettings(conf={EXECUTOR_OPTIONS: "-XX:MaxInlineLevel=15"})
    assert mine.executor_java_options() == "-XX:+UseParallelGC -XX:MaxInlineLevel=15"
    assert mine.driver_java_options() == LEAN_INLINING
    with pytest.raises(ValidationError, match="Input should be 'lean' or 'jvm'"):
        SparkSettings(jit_inlining="none")
