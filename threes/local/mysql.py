"""MariaDB 10.11 (Debian's ``mariadb-server``) on 127.0.0.1:13306 with a project-local data dir.

The MySQL dialect of the RDS connectors is tested against it. Everything lives
under ``.threes/mysql``: ``my.cnf`` (read with ``--defaults-file``, so no
system option file is), ``data/``, ``run/`` (socket and pid file) and
``init.sql``. The server log is ``.threes/logs/mysql.log``.

``mariadbd`` refuses to run as root unless told (``--user=root``); when we are
root it is started as Debian's unprivileged ``mysql`` user (through
``setpriv``, so the process never holds root), otherwise as ourselves.

The database ``threes`` and the user ``threes`` (password ``threes``, every
privilege, like PostgreSQL's bootstrap superuser) are created by the server
itself from ``init.sql`` (``--init-file``, idempotent statements run at each
start): no root login over the socket is ever needed.
``.threes/mysql/.initialized`` marks a completed ``mariadb-install-db``.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .common import HOST, LocalStackError, redact
from .process import run
from .service import Service
from .system import SYSTEM_BIN, apt_install, as_user, chown_tree, ensure_system_user, find_program, make_traversable

if TYPE_CHECKING:
    from .endpoints import Endpoints

logger = logging.getLogger(__name__)

MYSQL_PORT = 13306
MYSQL_USER = "threes"
MYSQL_PASSWORD = "threes"
MYSQL_DATABASE = "threes"
MYSQL_URL = f"mysql+pymysql://{MYSQL_USER}:{MYSQL_PASSWORD}@{HOST}:{MYSQL_PORT}/{MYSQL_DATABASE}?charset=utf8mb4"
"""SQLAlchemy URL of the local server (``THREES_MYSQL_URL`` overrides it)."""
OS_USER = "mysql"
APT_PACKAGE = "mariadb-server"

SETTINGS = {
    "port": str(MYSQL_PORT),
    "bind-address": HOST,
    "skip-name-resolve": "ON",
    # Sessions start in UTC, like the project's PostgreSQL (timezone = 'UTC').
    "default-time-zone": "+00:00",
    "character-set-server": "utf8mb4",
    "collation-server": "utf8mb4_unicode_ci",
    # Strict mode (MariaDB's default): a value the column cannot hold is an error, never truncated.
    "sql-mode": "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION",
    "max-connections": "200",
    # A small footprint for a test server (~100 MB resident).
    "innodb-buffer-pool-size": "64M",
    "performance-schema": "OFF",
    # Tests create and drop many tables; flushing the redo log once a second is durable enough here.
    "innodb-flush-log-at-trx-commit": "2",
    # The row-based binary log that binlog change data capture (mode: cdc on a mysql connection) reads:
    # full row images, GTIDs in every event group, a week of retention.
    "server-id": "1",
    "log-bin": "mariadb-bin",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    # column names, signedness and ENUM/SET labels in each row event's table map (mysql-replication maps by them)
    "binlog-row-metadata": "FULL",
    "binlog-expire-logs-seconds": "604800",
}


def _init_sql() -> str:
    """Idempotent statements the server runs at every start (``--init-file``), one per line."""
    statements = [f"CREATE DATABASE IF NOT EXISTS `{MYSQL_DATABASE}` CHARACTER SET utf8mb4"]
    for host in (HOST, "localhost"):
        account = f"'{MYSQL_USER}'@'{host}'"
        statements += [
            f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY '{MYSQL_PASSWORD}'",
            f"GRANT ALL PRIVILEGES ON *.* TO {account} WITH GRANT OPTION",
        ]
    return "".join(f"{s};\n" for s in statements)


class MySQL(Service):
    """A MariaDB server owned by the project (MySQL dialect)."""

    name = "mysql"
    title = "MariaDB"
    env_var = "THREES_MYSQL_URL"
    endpoint_vars: ClassVar[dict[str, str]] = {"mysql_url": "THREES_MYSQL_URL"}
    ports = (MYSQL_PORT,)
    health_timeout = 60.0
    stop_timeout = 60.0
    run_as = OS_USER

    @property
    def data(self) -> Path:
        """The server's data directory."""
        return self.dir / "data"

    @property
    def run_dir(self) -> Path:
        """Folder of the Unix-domain socket and the pid file (kept inside the project)."""
        return self.dir / "run"

    @property
    def conf(self) -> Path:
        """The option file given to every MariaDB program with ``--defaults-file``."""
        return self.dir / "my.cnf"

    @staticmethod
    def server_binary() -> Path | None:
        """``mariadbd`` (or ``mysqld``), None when not installed."""
        return find_program("mariadbd", "mysqld")

    @staticmethod
    def install_db_binary() -> Path | None:
        """``mariadb-install-db`` (or ``mysql_install_db``), None when not installed."""
        return find_program("mariadb-install-db", "mysql_install_db")

    def install(self) -> None:
        """Install Debian's ``mariadb-server`` when it is missing (root only; see :func:`.system.apt_install`).

        Raises:
            LocalStackError: If it is missing and we are not root, or apt fails.
                The Python driver (PyMySQL, the ``mysql`` extra) is not needed
                to run the server: the health check works without it.
        """
        if self.server_binary() is not None and self.install_db_binary() is not None:
            return
        apt_install(
            APT_PACKAGE,
            title=self.title,
            missing=f"no mariadbd in {', '.join(map(str, SYSTEM_BIN))}",
            env_var=self.env_var,
            log=self.layout.logs / "apt.log",
        )
        if self.server_binary() is None or self.install_db_binary() is None:
            raise LocalStackError(f"apt-get installed {APT_PACKAGE} but mariadbd or mariadb-install-db is missing")

    def prepare(self) -> None:
        """Write ``my.cnf`` and ``init.sql``; run ``mariadb-install-db`` once.

        Raises:
            LocalStackError: If MariaDB is not installed or ``mariadb-install-db`` fails.
        """
        for folder in (self.dir, self.run_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        init_file = self.dir / "init.sql"
        init_file.write_text(_init_sql())
        settings = {
            **SETTINGS,
            "datadir": str(self.data),
            "socket": str(self.run_dir / "mysqld.sock"),
            "pid-file": str(self.run_dir / "mysqld.pid"),
            "init-file": str(init_file),
            "tmpdir": str(self.run_dir),
        }
        self.conf.write_text(
            "# Written by threes.local.mysql on every start.\n[client-server]\n"
            f"port = {MYSQL_PORT}\nsocket = {settings['socket']}\n\n[mariadbd]\n"
            + "".join(f"{k} = {v}\n" for k, v in settings.items())
        )
        user = ensure_system_user(self.os_user) if self.os_user else None
        if user:
            make_traversable(self.dir)
            chown_tree(self.dir, user)
        marker = self.dir / ".initialized"
        if marker.exists() and (self.data / "mysql").is_dir():
            return
        install_db = self.install_db_binary()
        if install_db is None:
            raise LocalStackError(f"MariaDB is not installed (mariadb-install-db missing); set {self.env_var}")
        logger.info("mysql: mariadb-install-db in %s", self.data)
        marker.unlink(missing_ok=True)
        shutil.rmtree(self.data, ignore_errors=True)
        self.data.mkdir(mode=0o750)
        if user:
            os.chown(self.data, user.pw_uid, user.pw_gid)
        run(
            as_user(
                self.os_user,
                [
                    str(install_db),
                    f"--defaults-file={self.conf}",
                    "--skip-test-db",
                    "--auth-root-authentication-method=socket",
                ],
            ),
            what=f"initialise the MariaDB data dir (mariadb-install-db); see {self.log}",
            log=self.log,
            cwd=self.dir,
            timeout=180,
        )
        marker.touch()

    def command(self) -> tuple[list[str], dict[str, str], Path]:
        """Return ``mariadbd --defaults-file=.threes/mysql/my.cnf`` (as ``mysql`` when root)."""
        server = self.server_binary()
        if server is None:
            raise LocalStackError(f"MariaDB is not installed (mariadbd missing); set {self.env_var}")
        # --defaults-file must come first; errors go to stderr, i.e. to our log
        return as_user(self.os_user, [str(server), f"--defaults-file={self.conf}"]), {}, self.dir

    def probe(self, endpoints: Endpoints) -> None:
        """Log in as ``threes`` through PyMySQL and run ``SELECT 1``.

        Without PyMySQL (``pip install threes`` without the ``mysql`` extra) the
        server's protocol greeting is read instead: a MariaDB that accepts
        connections sends it first (MySQL client/server protocol, "Initial
        Handshake Packet", protocol version 10).

        Raises:
            OSError: the server does not answer or does not greet.
        """
        try:
            import pymysql  # noqa: F401 - only whether it is installed
        except ImportError:
            greet_probe(endpoints.mysql_url)
            return
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(endpoints.mysql_url, poolclass=NullPool, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1")).scalar_one()
        finally:
            engine.dispose()

    def address(self, endpoints: Endpoints) -> str:
        """The database URL without its password."""
        return redact(endpoints.mysql_url)


def greet_probe(url: str, timeout_s: float = 3.0) -> str:
    """Read a MySQL/MariaDB server's initial handshake packet, without a driver.

    Args:
        url: the server's SQLAlchemy URL (host and port are used).
        timeout_s: connect and read timeout, seconds.

    Returns:
        The server version the greeting names (``10.11.6-MariaDB-...``).

    Raises:
        OSError: no connection, no greeting, or a greeting of another protocol.
    """
    import socket

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    with socket.create_connection((parsed.host or HOST, parsed.port or 3306), timeout=timeout_s) as sock:
        header = sock.recv(4)
        if len(header) < 4:
            raise OSError("MySQL server closed the connection before its greeting")
        length = int.from_bytes(header[:3], "little")
        body = b""
        while len(body) < length:
            chunk = sock.recv(length - len(body))
            if not chunk:
                break
            body += chunk
    if not body or body[0] == 0xFF:  # an error packet: e.g. "Host is blocked", "too many connections"
        raise OSError(f"MySQL server refused the connection: {body[3:].decode(errors='replace')[:200]}")
    if body[0] != 10:
        raise OSError(f"not a MySQL protocol 10 greeting (first byte {body[0]})")
    return body[1:].split(b"\0", 1)[0].decode(errors="replace")
