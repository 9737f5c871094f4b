"""The local stack's TLS: a CA and a server certificate for 127.0.0.1/localhost, the broker's SASL_SSL listener."""

from __future__ import annotations

import ipaddress
import ssl
import stat

from cryptography import x509

from threes.local.common import Layout
from threes.local.kafka_cluster import SASL_SSL_PORT
from threes.local.kafka_properties import server_properties
from threes.local.tls import ensure_certificates


def test_certificates_are_made_once_for_loopback_and_verify_with_the_ca(tmp_path):
    certs = ensure_certificates(Layout(tmp_path))
    cert = x509.load_pem_x509_certificate(certs.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert stat.S_IMODE(certs.key.stat().st_mode) == 0o600
    assert stat.S_IMODE((certs.ca.parent / "ca.key").stat().st_mode) == 0o600
    # OpenSSL accepts the pair as a server, and a client trusting only the CA verifies it
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.cert, certs.key)
    client = ssl.create_default_context(cafile=str(certs.ca))
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    # a second call keeps the files (clients that trust ca.pem keep working)
    before = certs.ca.read_bytes(), certs.cert.read_bytes()
    again = ensure_certificates(Layout(tmp_path))
    assert (again.ca.read_bytes(), again.cert.read_bytes()) == before


def test_a_missing_server_certificate_is_made_again_under_the_same_ca(tmp_path):
    certs = ensure_certificates(Layout(tmp_path))
    ca = certs.ca.read_bytes()
    certs.cert.unlink()
    again = ensure_certificates(Layout(tmp_path))
    assert again.cert.exists() and again.ca.read_bytes() == ca
    issued = x509.load_pem_x509_certificate(again.cert.read_bytes())
    assert issued.issuer == x509.load_pem_x509_certificate(ca).subject


def test_broker_properties_add_a_sasl_ssl_listener_and_keep_plaintext(tmp_path):
    props = dict(
        line.split("=", 1)
        for line in server_properties(tmp_path / "data", tmp_path / "ks.p12", "pw").splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert props["listeners"].split(",") == [
        "PLAINTEXT://127.0.0.1:19092",
        "CONTROLLER://127.0.0.1:19093",
        f"SASL_SSL://127.0.0.1:{SASL_SSL_PORT}",
    ]
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:19092,SASL_SSL://127.0.0.1:{SASL_SSL_PORT}"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.name.sasl_ssl.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.sasl_ssl.ssl.keystore.location"] == str(tmp_path / "ks.p12")
    assert "SASL_SSL" not in server_properties(tmp_path / "data")


def test_endpoints_export_the_sasl_listener_and_the_ca(monkeypatch, tmp_path):
    from threes.local import Endpoints

    monkeypatch.delenv("THREES_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("THREES_KAFKA_SASL_BOOTSTRAP", raising=False)
    env = Endpoints.from_env(environ={}, home=tmp_path).as_env()
    assert env["THREES_KAFKA_SASL_BOOTSTRAP"] == f"127.0.0.1:{SASL_SSL_PORT}"
    assert env["THREES_TLS_CA"] == str(tmp_path / "tls" / "ca.pem")
    # an external broker has no SASL_SSL address unless one is given
    external = Endpoints.from_env(environ={"THREES_KAFKA_BOOTSTRAP": "kafka:9092"}, home=tmp_path)
    assert external.kafka_sasl_bootstrap == "" and "THREES_KAFKA_SASL_BOOTSTRAP" not in external.as_env()


def test_a_broker_started_before_the_sasl_listener_existed_is_named_with_the_fix(tmp_path):
    import pytest

    from threes.local.common import LocalStackError
    from threes.local.kafka import Kafka

    kafka = Kafka(Layout(tmp_path))
    kafka.dir.mkdir(parents=True)
    kafka.properties.write_text(server_properties(tmp_path / "data"))  # no keystore: PLAINTEXT only
    with pytest.raises(LocalStackError, match="restart it: threes local down --service kafka"):
        kafka.bootstrap()
