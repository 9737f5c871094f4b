"""The ``iceberg`` connection: an Iceberg catalog (SQL or REST) and its S3 warehouse, through pyiceberg.

Registered in the ``threes.connections`` entry-point group as ``iceberg``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, model_validator

from kernel.config.fields import StrictModel
from kernel.config.models import CheckResult, ConnectionConfig, ConnectorConfig


class IcebergStorage(StrictModel):
    """The S3 (or S3-compatible: MinIO, s3proxy) storage of the warehouse, read and written by pyarrow."""

    endpoint_url: str | None = Field(None, description="None for AWS; http://host:port otherwise")
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    path_style: bool = Field(True, description="path-style addressing (MinIO, s3proxy); false: virtual hosts")


class IcebergConnection(ConnectionConfig):
    """An Iceberg catalog: pyiceberg's SQL catalog in a database, or a REST catalog, with an S3 warehouse.

    ``catalog: sql`` keeps the catalog's pointers in two tables (``iceberg_tables``,
    ``iceberg_namespace_properties``, created when missing) of the database at ``uri``
    (a SQLAlchemy URL); a password written in the URL is moved to ``password`` at load time.
    ``catalog: rest`` talks to an Iceberg REST catalog at ``uri`` (Polaris, Nessie, Gravitino,
    Lakekeeper...) with a bearer ``token`` or an OAuth2 ``credential`` (``client_id:secret``).

    Example::

        connections:
          lake:
            type: iceberg
            catalog: sql
            uri: postgresql+psycopg://threes@127.0.0.1:15432/threes
            password: threes
            warehouse: s3://lakehouse/warehouse
            storage: {endpoint_url: "http://127.0.0.1:18090", access_key_id: threes, secret_access_key: "..."}
    """

    client_loggers: ClassVar[tuple[str, ...]] = ("pyiceberg", "sqlalchemy", "urllib3", "botocore")

    type: Literal["iceberg"]
    catalog: Literal["sql", "rest"] = Field("sql", description="sql: pyiceberg's SQL catalog; rest: a REST catalog")
    catalog_name: str = Field("threes", min_length=1, description="the catalog's name (rows of the SQL catalog)")
    uri: str = Field(description="sql: SQLAlchemy URL of the catalog database; rest: http(s)://host:port[/path]")
    password: SecretStr | None = Field(None, description="sql: the database password (kept out of `uri`)")
    token: SecretStr | None = Field(None, description="rest: a bearer token")
    credential: SecretStr | None = Field(None, description="rest: OAuth2 client credentials client_id:secret")
    warehouse: str = Field(pattern=r"^s3a?://[^/]+(/.*)?$", description="s3://bucket[/prefix] of the tables' files")
    storage: IcebergStorage = Field(default_factory=IcebergStorage)
    create_bucket: bool = Field(False, description="create the warehouse bucket at start when it is missing")

    @model_validator(mode="after")
    def _split_password(self) -> IcebergConnection:
        if self.catalog != "sql":
            return self
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            parsed = make_url(self.uri)
        except ArgumentError as exc:
            raise ValueError("uri is not a valid SQLAlchemy URL (dialect+driver://user@host:port/db)") from exc
        if parsed.password is not None:
            if self.password is None:
                self.password = SecretStr(str(parsed.password))
            self.uri = parsed._replace(password=None).render_as_string(hide_password=False)
        return self

    @property
    def bucket(self) -> str:
        """The warehouse's bucket."""
        return self.warehouse.split("://", 1)[1].split("/", 1)[0]

    def local_services(self) -> tuple[str, ...]:
        """The local stack's PostgreSQL (the SQL catalog) and S3 server (the warehouse)."""
        return ("postgres", "s3") if self.catalog == "sql" else ("s3",)

    def check(self, name: str, users: Sequence[ConnectorConfig]) -> list[CheckResult]:
        """List the catalog's namespaces, and ``head_bucket`` the warehouse's bucket."""
        results = []
        try:
            namespaces = load_catalog(self).list_namespaces()
            results.append(CheckResult("iceberg", f"{name} catalog", True, f"{len(namespaces)} namespace(s)"))
        except Exception as exc:  # any failure is a result line
            from kernel.redact import redact

            results.append(
                CheckResult(
                    "iceberg",
                    f"{name} catalog",
                    False,
                    redact(f"{type(exc).__name__}: {exc}")[:300],
                    f"check connections.{name}.uri and its credentials",
                )
            )
        try:
            storage_client(self).head_bucket(Bucket=self.bucket)
            results.append(CheckResult("iceberg", f"{name}/{self.bucket}", True, "reachable"))
        except Exception as exc:  # a missing bucket passes when it is created at start
            created = self.create_bucket and "404" in str(exc)
            results.append(
                CheckResult(
                    "iceberg",
                    f"{name}/{self.bucket}",
                    created,
                    "missing; created at start (create_bucket: true)" if created else str(exc)[:300],
                    f"create bucket {self.bucket!r} or check connections.{name}.storage",
                )
            )
        return results


def catalog_properties(conn: IcebergConnection) -> dict[str, str]:
    """The pyiceberg catalog properties of ``conn``, secrets revealed (pass only to pyiceberg).

    Returns:
        ``uri``, ``warehouse``, the ``s3.*`` FileIO properties and the catalog's credentials.
    """
    props: dict[str, str] = {"warehouse": conn.warehouse, "s3.region": conn.storage.region}
    if conn.catalog == "sql":
        from sqlalchemy.engine import make_url

        url = make_url(conn.uri)
        if conn.password is not None:
            url = url.set(password=conn.password.get_secret_value())
        props["uri"] = url.render_as_string(hide_password=False)
        props["init_catalog_tables"] = "true"
    else:
        props["uri"] = conn.uri
        if conn.token is not None:
            props["token"] = conn.token.get_secret_value()
        if conn.credential is not None:
            props["credential"] = conn.credential.get_secret_value()
    storage = conn.storage
    if storage.endpoint_url:
        props["s3.endpoint"] = storage.endpoint_url
    if storage.access_key_id:
        props["s3.access-key-id"] = storage.access_key_id
    if storage.secret_access_key is not None:
        props["s3.secret-access-key"] = storage.secret_access_key.get_secret_value()
    if storage.session_token is not None:
        props["s3.session-token"] = storage.session_token.get_secret_value()
    props["s3.force-virtual-addressing"] = "false" if storage.path_style else "true"
    props["s3.connect-timeout"] = "10"
    props["s3.request-timeout"] = "60"
    return props


def load_catalog(conn: IcebergConnection) -> Any:
    """A new pyiceberg catalog of ``conn`` (``SqlCatalog`` or ``RestCatalog``).

    Raises:
        Exception: what pyiceberg raises when the catalog cannot be reached (SQL: SQLAlchemy's
            ``OperationalError``; REST: ``requests`` errors).
    """
    props = catalog_properties(conn)
    if conn.catalog == "sql":
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(conn.catalog_name, **props)
    from pyiceberg.catalog.rest import RestCatalog

    return RestCatalog(conn.catalog_name, **props)


def storage_client(conn: IcebergConnection) -> Any:
    """A boto3 S3 client of the warehouse's storage (bucket checks and creation)."""
    import boto3
    from botocore.config import Config

    s = conn.storage
    return boto3.client(
        "s3",
        endpoint_url=s.endpoint_url,
        aws_access_key_id=s.access_key_id,
        aws_secret_access_key=s.secret_access_key.get_secret_value() if s.secret_access_key else None,
        aws_session_token=s.session_token.get_secret_value() if s.session_token else None,
        config=Config(
            region_name=s.region,
            s3={"addressing_style": "path" if s.path_style else "auto"},
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=10,
            read_timeout=60,
        ),
    )
