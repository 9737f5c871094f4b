"""PostgreSQL 15 (Debian's packages) on 127.0.0.1:15432 with a project-local data dir.

``initdb`` + ``pg_ctl`` run as the ``postgres`` OS user when we are root (the
server refuses to run as root). The bootstrap superuser is ``threes``
(password ``threes``); the database ``threes`` is created on first start.
``.threes/postgres/.initialized`` marks a completed ``initdb``.

TLS is on (``ssl = on``) with the stack's server certificate for 127.0.0.1 /
localhost (:mod:`.tls`), copied to ``.threes/postgres/tls`` for the server's
user; clients connect with ``sslmode=verify-full sslrootcert=.threes/tls/ca.pem``
(plain connections stay allowed: ``pg_hba`` is ``host``, not ``hostssl``).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .common import HOST, LocalStackError, now, redact, wait_until
from .process import PidRecord, owns, run, terminate
from .service import Service
from .system import apt_install, chown_tree, ensure_system_user, find_program, make_traversable
from .tls import ensure_certificates

if TYPE_CHECKING:
    import pwd

    from .endpoints import Endpoints

logger = logging.getLogger(__name__)

PG_PORT = 15432
PG_USER = "threes"
PG_PASSWORD = "threes"
PG_DATABASE = "threes"
PG_ROOT = Path("/usr/lib/postgresql")
PG_PREFERRED = "15"
OS_USER = "postgres"
APT_PACKAGE = "postgresql"

SETTINGS = {
    "port": str(PG_PORT),
    "listen_addresses": f"'{HOST}'",
    "max_connections": "100",
    "shared_buffers": "'128MB'",
    # Logical decoding for change data capture (rds_source mode: cdc, pgoutput): one replication
    # slot and one WAL sender per cdc source, so 10 of each leave room for several plus pg_basebackup.
    "wal_level": "'logical'",
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    "log_timezone": "'UTC'",
    "timezone": "'UTC'",
}


def to_conninfo(url: str) -> str:
    """Turn a SQLAlchemy URL (``postgresql+psycopg://...``) into a libpq URI for psycopg."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    return f"{scheme.split('+', 1)[0]}://{rest}"


class Postgres(Service):
    """A PostgreSQL cluster owned by the project."""

    name = "postgres"
    title = "PostgreSQL"
    env_var = "THREES_POSTGRES_URL"
    endpoint_vars: ClassVar[dict[str, str]] = {"postgres_url": "THREES_POSTGRES_URL"}
    ports = (PG_PORT,)
    health_timeout = 60.0
    stop_timeout = 60.0
    run_as = OS_USER

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        """Folder of the Unix-domain socket (kept inside the project)."""
        return self.dir / "run"

    @staticmethod
    def bin_dir() -> Path | None:
        """Return Debian's PostgreSQL ``bin`` folder: 15 if present, else the newest."""
        newest_first = sorted(
            (p for p in PG_ROOT.glob("*/bin") if p.parent.name.isdigit()), key=lambda p: -int(p.parent.name)
        )
        pg_ctl = find_program("pg_ctl", folders=[PG_ROOT / PG_PREFERRED / "bin", *newest_first])
        return pg_ctl.parent if pg_ctl else None

    def _bin(self, tool: str) -> str:
        bin_dir = self.bin_dir()
        if bin_dir is None:
            raise LocalStackError(f"PostgreSQL is not installed ({PG_ROOT}/*/bin missing)")
        return str(bin_dir / tool)

    def _as_user(self, cmd: list[str]) -> list[str]:
        user = self.os_user
        return ["runuser", "-u", user, "--", *cmd] if user else cmd

    def install(self) -> None:
        """Install Debian's PostgreSQL when it is missing (root only; see :func:`.system.apt_install`).

        Raises:
            LocalStackError: If it is missing and we are not root, or apt fails.
        """
        if self.bin_dir() is not None:
            return
        apt_install(
            APT_PACKAGE,
            title=self.title,
            missing=f"no pg_ctl in {PG_ROOT}/*/bin",
            env_var=self.env_var,
            log=self.layout.logs / "apt.log",
        )
        if self.bin_dir() is None:
            raise LocalStackError(f"apt-get installed {APT_PACKAGE} but {PG_ROOT}/*/bin/pg_ctl is missing")

    def prepare(self) -> None:
        """Run ``initdb`` once and (re)write the project's settings.

        Raises:
            LocalStackError: If ``initdb`` fails.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        self.log.touch()
        user = ensure_system_user(self.os_user) if self.os_user else None
        if user:
            make_traversable(self.dir)
            make_traversable(self.layout.logs)
            chown_tree(self.dir, user)
            os.chown(self.log, user.pw_uid, user.pw_gid)
        marker = self.dir / ".initialized"
        if not (marker.exists() and (self.data / "PG_VERSION").exists()):
            self._initdb(marker, user)
        settings = {**SETTINGS, "unix_socket_directories": f"'{self.socket_dir}'", **self._tls_settings(user)}
        conf_file = self.data / "threes.conf"
        conf_file.write_text(
            "# Written by threes.local.postgres on every start.\n"
            + "".join(f"{k} = {v}\n" for k, v in settings.items())
        )
        if user:
            os.chown(conf_file, user.pw_uid, user.pw_gid)

    def _initdb(self, marker: Path, user: pwd.struct_passwd | None) -> None:
        """Create the data folder with ``initdb`` (the password from a file removed after), then ``marker``.

        Raises:
            LocalStackError: If ``initdb`` fails.
        """
        logger.info("postgres: initdb in %s", self.data)
        marker.unlink(missing_ok=True)
        shutil.rmtree(self.data, ignore_errors=True)
        self.data.mkdir(mode=0o700)
        pwfile = self.dir / ".pwfile"
        pwfile.write_text(PG_PASSWORD + "\n")
        if user:
            os.chown(self.data, user.pw_uid, user.pw_gid)
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        try:
            run(
                self._as_user(
                    [
                        self._bin("initdb"),
                        "-D",
                        str(self.data),
                        "-U",
                        PG_USER,
                        f"--pwfile={pwfile}",
                        "--auth-local=trust",
                        "--auth-host=scram-sha-256",
                        "-E",
                        "UTF8",
                        "--locale=C.UTF-8",
                    ]
                ),
                what="initialise the PostgreSQL data dir (initdb)",
                log=self.log,
                cwd=self.dir,
                timeout=180,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# Added by threes.local.postgres\ninclude 'threes.conf'\n")
        marker.touch()

    def _tls_settings(self, user: object | None) -> dict[str, str]:
        """Copy the stack's server certificate and key where the server's user owns them; return the settings.

        PostgreSQL refuses a key file readable by others or not owned by its user.
        """
        certs = ensure_certificates(self.layout)
        folder = self.dir / "tls"
        folder.mkdir(exist_ok=True)
        cert, key = folder / "server.crt", folder / "server.key"
        cert.write_bytes(certs.cert.read_bytes())
        key.touch(mode=0o600)
        key.chmod(0o600)
        key.write_bytes(certs.key.read_bytes())
        if user is not None:
            chown_tree(folder, user)  # type: ignore[arg-type]
        return {
            "ssl": "on",
            "ssl_cert_file": f"'{cert}'",
            "ssl_key_file": f"'{key}'",
            "ssl_min_protocol_version": "'TLSv1.2'",
        }

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running(self) -> PidRecord | None:
        """Return the record of our live postmaster (adopting one without a record)."""
        record = super().running()
        if record is not None:
            return record
        pid = self._postmaster_pid()
        if pid is not None and owns(pid, str(self.data)):
            record = PidRecord(pid, now(), str(self.data))
            record.save(self.pid_file)
            return record
        return None

    def start(self) -> PidRecord:
        """Start the server with ``pg_ctl start -w`` and record the postmaster's PID.

        Raises:
            LocalStackError: If the port is taken or the server does not start.
        """
        self.check_ports()
        run(
            self._as_user([self._bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"]),
            what=f"start PostgreSQL; see {self.log}",
            log=self.log,
            cwd=self.dir,
            timeout=90,
        )
        pid = self._postmaster_pid()
        if pid is None:
            raise LocalStackError(f"PostgreSQL started but wrote no postmaster.pid; see {self.log}")
        record = PidRecord(pid, now(), str(self.data))
        record.save(self.pid_file)
        logger.info("%s: started (pid %d); log: %s", self.name, pid, self.log)
        return record

    def bootstrap(self) -> None:
        """Create the ``threes`` database when missing.

        Raises:
            LocalStackError: If the server does not accept connections.
        """
        import psycopg

        admin = f"host={HOST} port={PG_PORT} user={PG_USER} password={PG_PASSWORD} dbname=postgres connect_timeout=3"

        def create() -> None:
            with psycopg.connect(admin, autocommit=True) as conn:
                found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)).fetchone()
                if not found:
                    logger.info("postgres: creating database %s", PG_DATABASE)
                    conn.execute(f'CREATE DATABASE "{PG_DATABASE}" OWNER "{PG_USER}"')

        wait_until(create, timeout=self.health_timeout, what=self.title, log=self.log)

    def stop(self) -> bool:
        """Stop the server with ``pg_ctl stop -m fast`` (falls back to signals)."""
        record = self.running()
        if record is None:
            return False
        logger.info("%s: stopping pid %d", self.name, record.pid)
        try:
            run(
                self._as_user(
                    [
                        self._bin("pg_ctl"),
                        "-D",
                        str(self.data),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        str(int(self.stop_timeout)),
                        "stop",
                    ]
                ),
                what="stop PostgreSQL",
                log=self.log,
                timeout=self.stop_timeout + 30,
            )
        except LocalStackError as exc:
            logger.warning("postgres: %s; signalling pid %d", exc, record.pid)
            terminate(record.pid, record.marker, 10)
        self.pid_file.unlink(missing_ok=True)
        return True

    def probe(self, endpoints: Endpoints) -> None:
        """Run ``SELECT 1`` through psycopg."""
        import psycopg

        with psycopg.connect(to_conninfo(endpoints.postgres_url), connect_timeout=3) as conn:
            conn.execute("SELECT 1").fetchone()

    def address(self, endpoints: Endpoints) -> str:
        """The database URL without its password."""
        return redact(endpoints.postgres_url)
