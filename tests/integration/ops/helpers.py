"""Helpers of the supervision and status tests: a PostgreSQL trigger that fails chosen keys, free ports."""

from __future__ import annotations

import json
import socket
import urllib.request
from typing import Any

from sqlalchemy import text


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # a loopback test URL
        return json.loads(resp.read())


def fail_key(engine: Any, table: str, key: int, sqlstate: str = "57P03") -> None:
    """Make every write of ``key`` to ``table`` fail with ``sqlstate`` (57P03 is transient for the RDS sink)."""
    with engine.begin() as conn:
        conn.execute(text(f"""
            CREATE OR REPLACE FUNCTION {table}_refuse() RETURNS trigger AS $$
            BEGIN
              IF NEW.id = {int(key)} THEN
                RAISE EXCEPTION 'key {int(key)} is refused by a test trigger' USING ERRCODE = '{sqlstate}';
              END IF;
              RETURN NEW;
            END $$ LANGUAGE plpgsql"""))
        conn.execute(text(f"CREATE TRIGGER {table}_refuse BEFORE INSERT OR UPDATE ON {table} "
                          f"FOR EACH ROW EXECUTE FUNCTION {table}_refuse()"))


def accept_all(engine: Any, table: str) -> None:
    """Drop the trigger of :func:`fail_key`."""
    with engine.begin() as conn:
        conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_refuse ON {table}"))


def rows(engine: Any, table: str) -> dict[int, int]:
    """``id -> _version`` of every row of ``table`` (empty when it does not exist yet)."""
    from sqlalchemy import inspect

    if not inspect(engine).has_table(table):
        return {}
    with engine.connect() as conn:
        return dict(conn.execute(text(f"SELECT id, _version FROM {table}")).all())


def send_stamped(producer: Any, key: int, version: int, source_ts_ms: int) -> None:
    """Send an update like ``UpdateProducer.send``, with a ``threes.source_ts`` header (the source commit time)."""
    from kernel.updates import encode_version, with_source_ts
    from threes.testing.sink import item

    headers = with_source_ts([("version", encode_version(version))], source_ts_ms)
    producer.producer.produce(producer.topic, key=producer.key_ser(key), value=producer.value_ser(item(key, version)),
                              headers=headers, on_delivery=producer._on_delivery)
    producer.producer.poll(0)


def metric(port: int, name: str) -> float | None:
    """The value of the first sample called ``name`` on ``http://127.0.0.1:port/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return None
