"""The allow-lists of a database URL's query options (libpq, PyMySQL, SQLite), checked before any connection.

A URL's query string reaches the driver, whose options can read files (password,
service and key files), run SQL on every connection, let the server read client
files or turn TLS and certificate verification off. Each backend's options are
therefore an allow-list, as ``kafka.client_config`` is (:mod:`kernel.config.safety`):
refused options say why, unknown ones are "not on the allow-list".

Sources: libpq "Connection Strings" (34.1.2) and "SSL Support" (34.19); PyMySQL
``connect()`` arguments; SQLite URI parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# -- database URL query options -------------------------------------------------------------------

_PG_ALLOWED = frozenset({
    "sslmode", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "ssl_min_protocol_version",
    "ssl_max_protocol_version", "sslnegotiation", "sslcompression", "gssencmode", "krbsrvname", "channel_binding",
    "requirepeer", "application_name", "fallback_application_name", "target_session_attrs", "load_balance_hosts",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
    "client_encoding",
})
# sslmode values that let the connection run without a verified server certificate, like MySQL's
# ssl_disabled and ssl_verify_cert=false (libpq "SSL Support", table 34.1 "SSL Mode Descriptions")
_PG_SSLMODE_REFUSED = {
    "disable": "turns TLS off",
    "allow": "falls back to a connection without TLS (tried first without it)",
    "prefer": "falls back to a connection without TLS when the server (or a man in the middle) offers none",
    "require": "encrypts but skips server certificate verification (anyone on the path can pose as the server)",
}
_PG_REFUSED = {
    "passfile": "reads a password file",
    "sslkey": "reads a private key file (client certificates are not supported through the URL)",
    "sslcert": "reads a certificate file (client certificates are not supported through the URL)",
    "sslpassword": "is a secret in plain text",
    "sslcertmode": "client certificates are not supported through the URL",
    "options": "sets server parameters for the session (-c ...), e.g. its search_path or checks",
    "service": "reads connection settings from a service file",
    "servicefile": "reads connection settings from a file",
    "host": "overrides the URL's host",
    "hostaddr": "overrides the URL's host",
    "port": "overrides the URL's port",
    "dbname": "overrides the URL's database",
    "user": "overrides the URL's user",
    "connect_timeout": "overrides the typed setting connect_timeout_s",
}
_MYSQL_ALLOWED = frozenset({
    "charset", "collation", "read_timeout", "write_timeout", "ssl_ca", "ssl_verify_cert", "ssl_verify_identity",
    "binary_prefix", "program_name", "ssl_check_hostname",
})
_MYSQL_REFUSED = {
    "local_infile": "lets the server read any file of the client (LOAD DATA LOCAL INFILE)",
    "read_default_file": "reads connection settings from a file",
    "read_default_group": "reads connection settings from an option file",
    "init_command": "runs SQL on every connection",
    "client_flag": "sets protocol flags (it can enable LOCAL INFILE)",
    "unix_socket": "overrides the URL's host",
    "ssl_key": "reads a private key file (client certificates are not supported through the URL)",
    "ssl_cert": "reads a certificate file (client certificates are not supported through the URL)",
    "ssl_disabled": "turns TLS off",
    "auth_plugin_map": "loads authentication plugins (code)",
    "server_public_key": "replaces the server's key (man in the middle)",
    "autocommit": "the sink's transactions need autocommit off",
    "connect_timeout": "overrides the typed setting connect_timeout_s",
    "defer_connect": "decided by the connection pool",
}
_SQLITE_ALLOWED = frozenset({"timeout", "check_same_thread", "uri", "mode", "cache", "immutable", "nolock"})


def url_query_problems(backend: str, query: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Check a database URL's query options against its driver's allow-list.

    Args:
        backend: SQLAlchemy backend name (``postgresql``, ``mysql``, ``mariadb``, ``sqlite``).
        query: the URL's query options (values unused except for a few checks).

    Returns:
        ``[(option, why it is refused)]``.
    """
    problems = []
    for key, value in query.items():
        values = value if isinstance(value, (tuple, list)) else (value,)
        if backend == "postgresql":
            if key in _PG_REFUSED:
                problems.append((key, _PG_REFUSED[key]))
            elif key not in _PG_ALLOWED:
                problems.append((key, "not on the allow-list of known-safe PostgreSQL (libpq) options"))
            elif key == "sslmode":
                for v in values:
                    why = _PG_SSLMODE_REFUSED.get(str(v).strip().lower())
                    if why:
                        problems.append((key, f"{v} {why}; use sslmode=verify-full (or verify-ca) with "
                                              "sslrootcert=<CA file>; there is no opt-in, as for MySQL's "
                                              "ssl_disabled"))
        elif backend in ("mysql", "mariadb"):
            if key in _MYSQL_REFUSED:
                problems.append((key, _MYSQL_REFUSED[key]))
            elif key not in _MYSQL_ALLOWED:
                problems.append((key, "not on the allow-list of known-safe MySQL options"))
            elif key == "ssl_verify_cert" and any(str(v).lower() in ("false", "0", "no") for v in values):
                problems.append((key, "turns server certificate verification off"))
        elif backend == "sqlite":
            if key not in _SQLITE_ALLOWED:
                problems.append((key, "not on the allow-list of known-safe SQLite options"))
        else:
            problems.append((key, f"no query options are allowed for {backend!r} URLs"))
    return problems


def url_file_options(backend: str, query: Mapping[str, Any], database: str | None) -> list[tuple[str, str]]:
    """The files a database URL makes the driver read: CA and CRL files, a SQLite database.

    A config may name files only where ``${file:...}`` may read (:func:`kernel.config.references.file_allowed`):
    the caller confines each path returned here.

    Args:
        backend: SQLAlchemy backend name.
        query: the URL's query options.
        database: the URL's database (a SQLite file's path).

    Returns:
        ``[(option, path)]``; ``database`` names a SQLite file. libpq's ``sslrootcert=system`` (the
        system's CA store) and SQLite's in-memory databases name no file.
    """
    out: list[tuple[str, str]] = []
    options = {"postgresql": ("sslrootcert", "sslcrl", "sslcrldir"), "mysql": ("ssl_ca",),
               "mariadb": ("ssl_ca",)}.get(backend, ())
    for key in options:
        value = query.get(key)
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if v is not None and str(v).strip() and not (key == "sslrootcert" and str(v).strip() == "system"):
                out.append((key, str(v)))
    if backend == "sqlite" and database and database != ":memory:":
        path = database.removeprefix("file:").split("?", 1)[0]
        if path and path != ":memory:" and "mode=memory" not in database:
            out.append(("database", path))
    return out
