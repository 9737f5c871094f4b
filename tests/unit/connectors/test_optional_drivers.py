"""`pip install threes` without extras: the demo starts only what it uses; a missing driver is one clear line."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import pytest

from connectors.rds.connection import RdsConnection, sql_engine
from kernel.exceptions import SetupError
from threes.config import load_pipeline
from threes.local.mysql import MySQL, greet_probe
from threes.local.needs import services_for_pipeline

ROOT = Path(__file__).parents[3]


def test_the_demo_needs_neither_mariadb_nor_the_spark_cluster() -> None:
    pipeline = load_pipeline(ROOT / "examples" / "nycflights13" / "pipeline.yaml", environ={})
    assert services_for_pipeline(pipeline) == ["kafka", "postgres", "elasticsearch", "s3"]


def test_a_missing_mysql_driver_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymysql", None)  # import pymysql -> ImportError
    conn = RdsConnection(type="rds", url="mysql+pymysql://threes@127.0.0.1:13306/threes")
    with pytest.raises(SetupError) as info:
        sql_engine(conn)
    message = str(info.value)
    assert "\n" not in message and "pymysql" in message and "threes[mysql]" in message


def _serve_once(payload: bytes) -> tuple[int, threading.Thread]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.sendall(len(payload).to_bytes(3, "little") + b"\0" + payload)
        conn.close()
        server.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return server.getsockname()[1], thread


def test_mariadb_health_check_without_pymysql(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pymysql", None)
    port, thread = _serve_once(b"\x0a10.11.6-MariaDB\0" + b"\0" * 40)
    assert greet_probe(f"mysql+pymysql://u@127.0.0.1:{port}/db") == "10.11.6-MariaDB"
    thread.join(5)
    port, thread = _serve_once(b"\xff\x69\x04Host is blocked")
    with pytest.raises(OSError, match="Host is blocked"):
        greet_probe(f"mysql+pymysql://u@127.0.0.1:{port}/db")
    thread.join(5)

    class Endpoints:
        mysql_url = ""

    port, thread = _serve_once(b"\x0a10.11.6-MariaDB\0" + b"\0" * 40)
    Endpoints.mysql_url = f"mysql+pymysql://u:p@127.0.0.1:{port}/db"
    from threes.local.common import Layout

    MySQL(Layout(tmp_path)).probe(Endpoints())  # no PyMySQL: the greeting is enough
    thread.join(5)
