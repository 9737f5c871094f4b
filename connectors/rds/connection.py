"""The ``rds`` connection: a relational database through SQLAlchemy, its engine factory and its check.

Registered in the ``threes.connections`` entry-point group as ``rds``. The URL's query options
are an allow-list per driver (:func:`connectors.rds.url_options.url_query_problems`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, ValidationInfo, model_validator

from kernel.config.models import CheckResult, ConnectionConfig, ConnectorConfig
from kernel.exceptions import SetupError


class RdsConnection(ConnectionConfig):
    """A relational database reached through SQLAlchemy (PostgreSQL, MySQL/MariaDB, SQLite).

    A password written inside ``url`` (``user:PW@host`` or ``?password=PW``) is
    moved to ``password`` at load time, so the URL can be printed safely. The
    URL's query options are an allow-list per driver
    (:func:`connectors.rds.url_options.url_query_problems`): ``passfile``,
    ``sslkey``, ``options``, MySQL's ``local_infile`` or ``read_default_file``
    and any unknown option are validation errors.
    """

    client_loggers: ClassVar[tuple[str, ...]] = ("sqlalchemy",)

    type: Literal["rds"]
    url: str = Field(description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host:5432/db")
    password: SecretStr | None = None
    pool_size: int = Field(5, ge=1, le=100)
    connect_timeout_s: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _split_password(self) -> RdsConnection:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            parsed = make_url(self.url)
        except ArgumentError as exc:
            raise ValueError("url is not a valid SQLAlchemy URL (dialect+driver://user@host:port/db)") from exc
        query = dict(parsed.query)
        in_query = query.pop("password", None)
        if in_query is not None:
            in_query = in_query[-1] if isinstance(in_query, tuple) else in_query
        secret = parsed.password if parsed.password is not None else in_query
        if secret is not None or in_query is not None:
            if self.password is None:
                self.password = SecretStr(str(secret))
            parsed = parsed._replace(password=None).set(query=query)
            self.url = parsed.render_as_string(hide_password=False)
        from connectors.rds.url_options import url_query_problems

        problems = url_query_problems(parsed.get_backend_name(), query)
        if problems:
            raise ValueError("; ".join(f"url option '{key}' refused: {why}" for key, why in problems))
        return self

    @model_validator(mode="after")
    def _confine_files(self, info: ValidationInfo) -> RdsConnection:
        """Files the URL names (CA, CRL, a SQLite database) only where ``${file:...}`` may read.

        Checked when the connection comes from a config file (named in the validation context);
        a connection built in code, or from a mapping (``pipeline_from_dict``), is the program's own.
        """
        context = info.context or {}
        if not context.get("config_file"):  # built in code or from a mapping: the program's own
            return self
        import os

        from sqlalchemy.engine import make_url

        from connectors.rds.url_options import url_file_options
        from kernel.config.references import FILE_REF_DIRS_VARIABLE, file_allowed

        parsed = make_url(self.url)
        environ = context.get("environ", os.environ)
        refused = [key for key, path in url_file_options(parsed.get_backend_name(), dict(parsed.query),
                                                         parsed.database)
                   if not file_allowed(path, Path(context["base_dir"]), environ)]
        if refused:
            raise ValueError(f"url {', '.join(refused)} names a file outside the config's folder and the allowed "
                             f"directories (/run/secrets, /var/run/secrets, {FILE_REF_DIRS_VARIABLE}): refused, as "
                             "${file:...} is")
        return self

    def sqlalchemy_url(self) -> Any:
        """Return the :class:`sqlalchemy.engine.URL` with the password set (pass only to SQLAlchemy)."""
        from sqlalchemy.engine import make_url

        url = make_url(self.url)
        if self.password is not None:
            url = url.set(password=self.password.get_secret_value())
        return url

    def local_services(self) -> tuple[str, ...]:
        """``postgres`` for a PostgreSQL URL, ``mysql`` for MySQL or MariaDB (the local stack's MariaDB), else none."""
        from sqlalchemy.engine import make_url

        backend = make_url(self.url).get_backend_name()
        name = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}.get(backend)
        return (name,) if name else ()

    def check(self, name: str, users: Sequence[ConnectorConfig]) -> list[CheckResult]:
        """``SELECT 1`` and the server version (``threes check``).

        For ``mode: cdc`` sources on MySQL/MariaDB also the binary log's settings and the replication
        privileges: one failed result per problem, each saying what to set.
        """
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        try:
            options = {} if self.url.startswith("sqlite") else {"pool_size": 1}
            engine = sql_engine(self, **options)
        except SetupError as exc:  # a driver that is not installed
            return [CheckResult("rds", name, False, str(exc), "install the driver, or use another URL")]
        cdc = [u.name for u in users if getattr(u, "mode", None) == "cdc"]
        problems: list[str] = []
        try:
            with engine.connect() as c:
                c.execute(text("SELECT 1")).scalar_one()
                version = engine.dialect.server_version_info
                if cdc and engine.dialect.name in ("mysql", "mariadb"):
                    problems = binlog_problems(c, cdc)
        except SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
            return [CheckResult(
                "rds", name, False, f"SELECT 1 failed: {reason}",
                f"check connections.{name}.url/password and that the database accepts connections",
            )]
        finally:
            engine.dispose()
        ver = ".".join(str(v) for v in version) if version else "?"
        if problems:
            return [
                CheckResult("rds", name, False, p, "set it on the server (or its RDS parameter group)")
                for p in problems
            ]
        what = "; binlog ready for mode cdc" if cdc and engine.dialect.name in ("mysql", "mariadb") else ""
        return [CheckResult("rds", name, True, f"{engine.dialect.name} {ver}{what}")]


def binlog_problems(conn: Any, sources: list[str]) -> list[str]:
    """What keeps a MySQL/MariaDB server from serving the binlog change capture of ``sources`` (one line each).

    Args:
        conn: a SQLAlchemy connection to the server.
        sources: the names of the connection's ``mode: cdc`` sources (the first names the problems).
    """
    from connectors.rds.binlog_setup import read_server, server_problems

    cur = conn.connection.driver_connection.cursor()
    try:
        variables, grants, user = read_server(cur)
    finally:
        cur.close()
    return server_problems(variables, grants, user=user, source=sources[0])


def sql_engine(conn: RdsConnection, **kwargs: Any) -> Any:
    """A SQLAlchemy engine with pre-ping and a connect timeout.

    Args:
        conn: the RDS connection config.
        **kwargs: passed to :func:`sqlalchemy.create_engine`.

    Returns:
        A :class:`sqlalchemy.engine.Engine`.

    Raises:
        SetupError: the URL's driver is not installed (one line: what to install).
    """
    from sqlalchemy import create_engine

    url = conn.sqlalchemy_url()
    connect_args: dict[str, Any] = {}
    if url.get_backend_name() in ("postgresql", "mysql", "mariadb"):
        connect_args["connect_timeout"] = int(max(1, conn.connect_timeout_s))
    options: dict[str, Any] = {"pool_pre_ping": True, "connect_args": connect_args}
    if url.get_backend_name() != "sqlite":
        options["pool_size"] = conn.pool_size
    options.update(kwargs)
    try:
        return create_engine(url, **options)
    except ImportError as exc:  # an optional driver: one line that says what to install
        raise SetupError(missing_driver_message(url.drivername, exc)) from exc


_DRIVER_EXTRAS = {"pymysql": "pip install 'threes[mysql]'", "mysqldb": "pip install mysqlclient",
                  "mariadbconnector": "pip install mariadb", "asyncmy": "pip install asyncmy"}


def missing_driver_message(drivername: str, exc: ImportError) -> str:
    """One line naming the missing database driver of ``drivername`` (``mysql+pymysql``) and how to get it."""
    module = getattr(exc, "name", None) or drivername.partition("+")[2] or drivername
    how = _DRIVER_EXTRAS.get(module.lower(), _DRIVER_EXTRAS.get(drivername.partition("+")[2], f"pip install {module}"))
    return f"the database driver {module!r} for {drivername} URLs is not installed: {how}"
