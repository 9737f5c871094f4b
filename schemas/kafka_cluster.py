"""The Kafka cluster as a client sees it: metadata, a credentials check, and errors that say why a login failed.

librdkafka reports a refused login or an unverifiable broker certificate only through its error
callback; these helpers turn them into one-line :class:`~schemas.exceptions.SetupError` messages.
Topic administration builds on them (:mod:`schemas.kafka_admin`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from schemas.exceptions import SetupError

log = logging.getLogger(__name__)


def admin_client(kafka_config: Mapping[str, Any]) -> AdminClient:
    """An admin client of ``kafka_config`` (librdkafka properties); keep it referenced until its results."""
    return AdminClient(dict(kafka_config))


# librdkafka reports these through error_cb while list_topics only sees "transport failure":
# a wrong password or an untrusted certificate never heals by waiting.
_REFUSED = {"_AUTHENTICATION": "authentication", "SASL_AUTHENTICATION_FAILED": "authentication", "_SSL": "tls"}
_BROKER_PREFIX = re.compile(r"^\S+://\S+?/(?:bootstrap|\d+): ")
_STATE_SUFFIX = re.compile(r" \(after \d+ms in state \w+\)$")


def cluster_metadata(kafka_config: Mapping[str, Any], timeout_s: float = 10.0) -> Any:
    """Return the cluster's metadata; a refused login or TLS handshake fails at once, in one line.

    librdkafka retries a broker that refuses the credentials or presents a
    certificate it cannot verify (wrong CA, or issued for another host name)
    and ``list_topics`` reports only a timeout. Here the client's ``error_cb``
    is served between short metadata requests, so such a failure raises on
    its first occurrence instead of after ``timeout_s``.

    Args:
        kafka_config: librdkafka properties (secrets included; never logged).
        timeout_s: Seconds to wait for a broker that does not answer at all.

    Returns:
        ``confluent_kafka.admin.ClusterMetadata`` of every topic.

    Raises:
        SetupError: Authentication refused, TLS verification failed (both at
            once), or no answer within ``timeout_s`` seconds. The message is one
            line naming the bootstrap servers and, for a login, the user; it never
            holds the password.
    """
    refused: list[Any] = []

    def on_error(err: Any) -> None:
        if err.name() in _REFUSED:
            refused.append(err)

    # log_level 0: the failure is reported once, by us, not as librdkafka log lines on stderr
    conf: dict[str, Any] = {**kafka_config, "error_cb": on_error, "log_level": 0}
    admin = AdminClient(conf)
    bootstrap = kafka_config.get("bootstrap.servers")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.list_topics(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
        except KafkaException as exc:
            admin.poll(0)
            if refused:
                raise _refused_error(kafka_config, refused[0]) from exc
            if time.monotonic() >= deadline:
                raise SetupError(
                    f"Kafka at {bootstrap} did not answer within {timeout_s:g} s ({_short(exc.args[0].str())})",
                    "check kafka.bootstrap_servers, or start the local stack with `threes local up`",
                ) from exc


def check_credentials(kafka_config: Mapping[str, Any], timeout_s: float = 10.0) -> bool:
    """Fail at once when the brokers refuse our login or certificate; tolerate brokers that are down.

    For long-running processes at start-up (``source run``, ``sync run``): a wrong
    password or CA never heals, so it ends the process in one line before any
    producer or consumer logs its retries; a broker that does not answer yet may
    come back, and the runtime's retries and supervision handle that.

    Args:
        kafka_config: librdkafka properties.
        timeout_s: Seconds to wait for an answer.

    Returns:
        ``True`` when the brokers answered, ``False`` when none did within ``timeout_s``.

    Raises:
        SetupError: The login was refused or the broker's certificate failed verification.
    """
    try:
        cluster_metadata(kafka_config, timeout_s)
    except SetupError as exc:
        if not getattr(exc, "refused", False):
            log.warning("%s", exc)
            return False
        raise
    return True


def _short(text: str) -> str:
    return _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", " ".join(text.split())))


def _refused_error(kafka_config: Mapping[str, Any], err: Any) -> SetupError:
    bootstrap = kafka_config.get("bootstrap.servers")
    detail = _short(err.str())
    if _REFUSED[err.name()] == "authentication":
        user = kafka_config.get("sasl.username")
        mechanism = kafka_config.get("sasl.mechanism", "PLAIN")
        error = SetupError(
            f"Kafka at {bootstrap} refused the login of user {user!r} ({mechanism}): {detail}",
            "check kafka.sasl_username and kafka.sasl_password",
        )
    else:
        why = _tls_verify_message(str(bootstrap or ""), kafka_config.get("ssl.ca.location"))
        if why:  # librdkafka says only "certificate verify failed"; OpenSSL through Python says why
            detail = f"the broker's certificate was refused: {why}"
        error = SetupError(
            f"TLS with Kafka at {bootstrap} failed: {detail}",
            "check kafka.ssl_ca_location and that the broker's certificate names the host in kafka.bootstrap_servers",
        )
    error.refused = True  # read by check_credentials: waiting cannot help
    return error


def _tls_verify_message(bootstrap: str, ca_location: str | None, timeout_s: float = 3.0) -> str | None:
    """Return why the first bootstrap server's certificate fails verification (host name, issuer...), or None.

    One TLS handshake with the same trust (``ca_location``, else the system's CAs)
    and host name check as librdkafka; nothing is sent after the handshake.
    """
    import socket
    import ssl

    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if not host or not port.isdigit():
        return None
    host = host.strip("[]")
    try:
        context = ssl.create_default_context(cafile=ca_location or None)
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message or exc).rstrip(".")
    except (OSError, ValueError):
        return None
