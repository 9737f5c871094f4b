"""Helpers of the Iceberg sink tests: the connection to the stack, a fresh reader, a TCP proxy to cut the catalog."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from connectors.iceberg.connection import IcebergConnection, catalog_properties, load_catalog
from connectors.rds.connection import RdsConnection
from connectors.s3.connection import S3Connection

WAREHOUSE_BUCKET = "threes-iceberg-tests"


def iceberg_connection(pg: RdsConnection, s3_conn: S3Connection, uri: str | None = None) -> IcebergConnection:
    """The stack's SQL catalog (PostgreSQL) and S3 warehouse, the bucket created at start."""
    assert s3_conn.secret_access_key is not None and pg.password is not None
    return IcebergConnection(
        type="iceberg",
        catalog="sql",
        uri=uri or pg.url,
        password=pg.password,
        create_bucket=True,
        warehouse=f"s3://{WAREHOUSE_BUCKET}/warehouse",
        storage={
            "endpoint_url": s3_conn.endpoint_url,
            "region": s3_conn.region,
            "access_key_id": s3_conn.access_key_id,
            "secret_access_key": s3_conn.secret_access_key,
        },
    )


def as_yaml(conn: IcebergConnection) -> dict[str, Any]:
    """The connection as a YAML mapping (secrets revealed: test configs only)."""
    props = catalog_properties(conn)
    storage = conn.storage
    assert storage.secret_access_key is not None and conn.password is not None
    return {
        "type": "iceberg",
        "uri": conn.uri,
        "password": conn.password.get_secret_value(),
        "warehouse": conn.warehouse,
        "create_bucket": True,
        "storage": {
            "endpoint_url": storage.endpoint_url,
            "region": storage.region,
            "access_key_id": storage.access_key_id,
            "secret_access_key": props["s3.secret-access-key"],
        },
    }


def read_with_polars(conn: IcebergConnection, table: str) -> Any:
    """The table's current snapshot read by Polars (its own Parquet reader), planned by a fresh pyiceberg catalog.

    Returns:
        A ``polars.DataFrame``.
    """
    import polars as pl

    storage = conn.storage
    assert storage.secret_access_key is not None
    options = {
        "aws_endpoint_url": storage.endpoint_url or "",
        "aws_access_key_id": storage.access_key_id or "",
        "aws_secret_access_key": storage.secret_access_key.get_secret_value(),
        "aws_region": storage.region,
        "aws_allow_http": "true",
    }
    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    return pl.scan_iceberg(load_catalog(conn).load_table(table), storage_options=options).collect()


class TcpProxy:
    """A TCP forwarder to ``upstream`` on a fixed local port that can be cut (every connection closed) and restored."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Listen and forward."""
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        """Stop listening and close every forwarded connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
