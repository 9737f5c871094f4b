"""The contract kit's plugin: where the Kafka of the contract tests comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.exceptions import ConfigError
from threes.testing.plugin import draw_unique, kafka_config_from


def test_an_address_alone_is_a_plaintext_cluster() -> None:
    kafka = kafka_config_from("127.0.0.1:9092,127.0.0.1:9093", None)
    assert kafka.librdkafka_config() == {"bootstrap.servers": "127.0.0.1:9092,127.0.0.1:9093",
                                         "security.protocol": "PLAINTEXT"}


def test_a_config_file_gives_the_security_settings_and_the_address_replaces_its_brokers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THREES_KIT_TEST_KAFKA_PASSWORD", "s3cret")
    cfg = tmp_path / "kafka.yaml"
    cfg.write_text("bootstrap_servers: broker:9094\nsecurity_protocol: SASL_SSL\nsasl_mechanism: SCRAM-SHA-512\n"
                   "sasl_username: kit\nsasl_password: ${env:THREES_KIT_TEST_KAFKA_PASSWORD}\n")
    from_file = kafka_config_from(None, str(cfg))
    assert from_file.librdkafka_config() == {
        "bootstrap.servers": "broker:9094", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "kit", "sasl.password": "s3cret",
    }
    assert kafka_config_from("127.0.0.1:19094", str(cfg)).librdkafka_config()["bootstrap.servers"] == "127.0.0.1:19094"


def test_a_bad_config_file_is_a_config_error_with_its_key(tmp_path: Path) -> None:
    cfg = tmp_path / "kafka.yaml"
    cfg.write_text("bootstrap_servers: broker:9094\nsecurity_protocl: SSL\n")
    with pytest.raises(ConfigError, match="security_protocl"):
        kafka_config_from(None, str(cfg))


def test_no_kafka_says_which_option_and_variable_give_one() -> None:
    with pytest.raises(ValueError, match="--threes-kafka") as info:
        kafka_config_from(None, None)
    assert "THREES_KAFKA_BOOTSTRAP" in str(info.value) and "THREES_KAFKA_CONFIG" in str(info.value)


def test_unique_suffixes_differ() -> None:
    assert len({draw_unique() for _ in range(100)}) == 100
