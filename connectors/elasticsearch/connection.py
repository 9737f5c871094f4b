"""The ``elasticsearch`` connection: a cluster (client major = server major, 9.x), its client and its check.

Registered in the ``threes.connections`` entry-point group as ``elasticsearch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, model_validator

from kernel.config.models import CheckResult, ConnectionConfig, ConnectorConfig


class ElasticsearchConnection(ConnectionConfig):
    """An Elasticsearch cluster (client major version = server major version, 9.x).

    Credentials written in a host (``https://user:PW@host:9200``) are moved to
    ``username``/``password`` at load time, so hosts can be printed safely.
    ``verify_certs: false`` is refused unless ``accept_unverified_certificates:
    true`` says the risk is accepted.
    """

    client_loggers: ClassVar[tuple[str, ...]] = ("elastic_transport", "elasticsearch", "urllib3")

    type: Literal["elasticsearch"]
    hosts: list[str] = Field(min_length=1, description="e.g. [http://127.0.0.1:9200]")
    username: str | None = None
    password: SecretStr | None = None
    api_key: SecretStr | None = None
    verify_certs: bool = True
    accept_unverified_certificates: bool = Field(
        False,
        description="needed with verify_certs: false, which lets anyone on the path read and change the traffic",
    )
    ca_certs: str | None = None
    request_timeout_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _credentials_out_of_hosts(self) -> ElasticsearchConnection:
        from urllib.parse import unquote, urlsplit, urlunsplit

        hosts = []
        for host in self.hosts:
            parts = urlsplit(host if "://" in host else f"http://{host}")
            if parts.username is not None or parts.password is not None:
                if parts.username and self.username is None:
                    self.username = unquote(parts.username)
                if parts.password is not None and self.password is None:
                    self.password = SecretStr(unquote(parts.password))
                netloc = parts.hostname or ""
                if ":" in netloc:
                    netloc = f"[{netloc}]"
                if parts.port is not None:
                    netloc += f":{parts.port}"
                host = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
            hosts.append(host)
        self.hosts = hosts
        if not self.verify_certs and not self.accept_unverified_certificates:
            raise ValueError(
                "verify_certs: false turns certificate verification off (anyone on the path can read and change "
                "the traffic): set accept_unverified_certificates: true to accept that, or give ca_certs"
            )
        return self

    def local_services(self) -> tuple[str, ...]:
        """The local stack's Elasticsearch."""
        return ("elasticsearch",)

    def check(self, name: str, users: Sequence[ConnectorConfig]) -> list[CheckResult]:
        """Cluster health, one attempt (``threes check``): green or yellow passes."""
        from elasticsearch import ApiError, TransportError

        es = elasticsearch_client(self)
        try:
            # one attempt: a check says what is wrong now, the sinks retry
            health = es.options(max_retries=0).cluster.health(timeout=f"{int(self.request_timeout_s)}s")
        except (ApiError, TransportError) as exc:
            return [CheckResult(
                "elasticsearch", name, False, f"cluster health failed: {type(exc).__name__}: {_reason(exc)}",
                f"check connections.{name}.hosts and credentials; is the cluster up?",
            )]
        finally:
            es.close()
        status = health["status"]
        ok = status in ("green", "yellow")
        return [CheckResult(
            "elasticsearch", name, ok, f"cluster {health['cluster_name']} is {status}",
            "" if ok else "the cluster is red: some primary shards are unassigned",
        )]


def _reason(exc: BaseException) -> str:
    """An Elasticsearch error's cause, without the client's wrapping (``ConnectionError(... caused by: ...)``)."""
    text = str(getattr(exc, "message", "") or exc)
    return text.split("caused by: ")[-1].rstrip(")") if "caused by: " in text else text


def elasticsearch_client(conn: ElasticsearchConnection) -> Any:
    """An Elasticsearch client (major version 9) serializing JSON with orjson.

    orjson writes ``NaN``/``Infinity`` as ``null`` where the standard library
    would write invalid JSON that Elasticsearch refuses.

    Returns:
        An :class:`elasticsearch.Elasticsearch`.
    """
    from elasticsearch import Elasticsearch, OrjsonSerializer

    options: dict[str, Any] = {
        "request_timeout": conn.request_timeout_s,
        "verify_certs": conn.verify_certs,
        # orjson (a dependency) instead of the standard library's json: the bulk helper
        # serializes every action and document with it (elasticsearch-py, "Serializers")
        "serializer": OrjsonSerializer(),
    }
    if conn.ca_certs:
        options["ca_certs"] = conn.ca_certs
    if conn.api_key is not None:
        options["api_key"] = conn.api_key.get_secret_value()
    elif conn.username is not None:
        password = conn.password.get_secret_value() if conn.password else ""
        options["basic_auth"] = (conn.username, password)
    return Elasticsearch(conn.hosts, **options)
