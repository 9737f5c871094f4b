"""Spark's Kafka client options from the typed Kafka config: JAAS escaping, TLS, client_config."""

from __future__ import annotations

import pytest

from kernel.config.models import KafkaConfig
from stream_app.spark_kafka_options import jaas_quote, sasl_jaas_config, spark_kafka_options


def java_stream_tokenizer_quoted(text: str) -> str:
    """Read one ``"..."`` token the way Java's StreamTokenizer (Kafka's JaasConfig parser) does."""
    assert text[0] == '"'
    escapes = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "a": "\a", "v": "\v"}
    out, i = [], 1
    while text[i] != '"':
        if text[i] == "\\":
            i += 1
            out.append(escapes.get(text[i], text[i]))
        elif text[i] == "\n":
            raise AssertionError("a raw newline ends a quoted token")
        else:
            out.append(text[i])
        i += 1
    assert i == len(text) - 1, "the token ends at the closing quote"
    return "".join(out)


@pytest.mark.parametrize("value", ['p"w', "back\\slash", "\\\"", "ends with \\", "new\nline\ttab", "ü ' ;"])
def test_jaas_values_round_trip(value):
    assert java_stream_tokenizer_quoted(jaas_quote(value)) == value


def test_the_jaas_string_of_a_password_with_a_quote_is_still_one_option():
    jaas = sasl_jaas_config("SCRAM-SHA-512", "u", 'x" evil="1')
    assert jaas == 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="x\\" evil=\\"1";'


def test_typed_security_settings_win_and_verification_stays_on():
    kafka = KafkaConfig(
        bootstrap_servers="127.0.0.1:19094",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="p",
        ssl_ca_location="/ca.pem",
        client_config={"client.id": "job-1", "linger.ms": 5, "enable.idempotence": True, "queue.buffering.max.ms": 5},
    )
    options = spark_kafka_options(kafka)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.ssl.endpoint.identification.algorithm"] == "https"
    assert options["kafka.ssl.truststore.type"] == "PEM" and options["kafka.ssl.truststore.location"] == "/ca.pem"
    # client_config keys the Java client knows by the same name are passed on; librdkafka-only ones are not
    assert options["kafka.client.id"] == "job-1" and options["kafka.linger.ms"] == "5"
    assert options["kafka.enable.idempotence"] == "true"
    assert "kafka.queue.buffering.max.ms" not in options


def test_plaintext_has_no_sasl_or_tls_options():
    options = spark_kafka_options(KafkaConfig(bootstrap_servers="127.0.0.1:19092"))
    assert not [k for k in options if k.startswith(("kafka.sasl.", "kafka.ssl."))]


def test_source_options_defaults_yield_to_the_pipeline_and_reads_stay_committed() -> None:
    from stream_app.spark_kafka_options import SOURCE_DEFAULTS, source_options

    assert source_options({"kafka.bootstrap.servers": "b"}) == {
        **SOURCE_DEFAULTS,
        "kafka.bootstrap.servers": "b",
        "kafka.isolation.level": "read_committed",
    }
    mine = source_options({"kafka.max.partition.fetch.bytes": "1048576", "kafka.isolation.level": "read_uncommitted"})
    assert mine["kafka.max.partition.fetch.bytes"] == "1048576"  # client_config wins over the defaults
    assert mine["kafka.isolation.level"] == "read_committed"  # never an open or aborted transaction's records
    assert mine["kafka.max.poll.records"] == SOURCE_DEFAULTS["kafka.max.poll.records"]
