"""Secrets masked wherever text is printed: URLs, key=value pairs, registered config secrets, logs, dead letters."""

from __future__ import annotations

import logging

from kernel.dlq import DeadLetter
from kernel.redact import MASK, RedactingFilter, mask_url, redact
from threes.config import pipeline_from_dict


def test_urls_keep_their_shape_and_lose_their_secrets() -> None:
    assert mask_url("postgresql+psycopg://threes:hunter22@h:5432/db?sslmode=require&password=abc") == (
        f"postgresql+psycopg://threes:{MASK}@h:5432/db?sslmode=require&password={MASK}"
    )
    assert mask_url("http://elastic:p%40ss@127.0.0.1:9200/_bulk") == f"http://elastic:{MASK}@127.0.0.1:9200/_bulk"
    assert redact('{"api_key": "zzz", "name": "x"}') == f'{{"api_key": "{MASK}", "name": "x"}}'
    assert redact("sink=db topic=t partition=0 records=10 elapsed_s=0.1") == (
        "sink=db topic=t partition=0 records=10 elapsed_s=0.1"
    )


def test_config_secrets_are_masked_in_any_text_once_loaded() -> None:
    pipeline_from_dict({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                  "sasl_username": "u", "sasl_password": "KafkaSecret-1234"},
        "connections": {"s3": {"type": "s3", "access_key_id": "k", "secret_access_key": "S3Secret-98765"}},
    })
    assert redact("login failed with KafkaSecret-1234 and S3Secret-98765") == f"login failed with {MASK} and {MASK}"


def test_log_records_and_tracebacks_are_masked() -> None:
    record = logging.LogRecord("urllib3", logging.DEBUG, __file__, 1, "GET %s", ("http://u:LogSecret77@h/",), None)
    try:
        raise RuntimeError("cannot reach http://u:TraceSecret77@h/")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    text = logging.Formatter().format(record)
    assert "LogSecret77" not in text and "TraceSecret77" not in text and MASK in text


def test_dead_letter_messages_are_masked() -> None:
    letter = DeadLetter("t", 0, 1, "write", "OperationalError", "refused by postgresql://u:DlqSecret77@h/db", "svc/db")
    headers = dict(letter.headers())
    assert b"DlqSecret77" not in headers["dlq.error.message"]
    assert DeadLetter.from_headers(letter.headers()).message == f"refused by postgresql://u:{MASK}@h/db"


def test_unexpected_tracebacks_are_masked(capsys) -> None:
    from threes.cli import _redacted_traceback

    try:
        raise ValueError("boom at postgresql://u:TbSecret77@h/db")
    except ValueError as exc:
        _redacted_traceback(type(exc), exc, exc.__traceback__)
    err = capsys.readouterr().err
    assert "Traceback" in err and "TbSecret77" not in err and MASK in err
