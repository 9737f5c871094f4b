"""Which local services a pipeline uses: ``threes demo`` starts only those.

A pipeline that names no MySQL connection does not need MariaDB (an optional
system package and driver); one whose stream job runs ``local[*]`` does not need
the Spark cluster.
"""

from __future__ import annotations

from typing import Any


def services_for_pipeline(pipeline: Any) -> list[str]:
    """The local stack's services a validated pipeline connects to.

    Args:
        pipeline: a validated pipeline model (``connections``, optional ``stream``).

    Returns:
        Service names of :data:`threes.local.stack.SERVICES`, Kafka always first.
    """
    from sqlalchemy.engine import make_url

    from connectors.elasticsearch.connection import ElasticsearchConnection
    from connectors.rds.connection import RdsConnection
    from connectors.s3.connection import S3Connection

    needed = ["kafka"]
    for conn in getattr(pipeline, "connections", {}).values():
        if isinstance(conn, RdsConnection):
            backend = make_url(conn.url).get_backend_name()
            name = {"postgresql": "postgres", "mysql": "mysql", "mariadb": "mysql"}.get(backend)
        elif isinstance(conn, ElasticsearchConnection):
            name = "elasticsearch"
        elif isinstance(conn, S3Connection):
            name = "s3"
        else:
            name = None
        if name and name not in needed:
            needed.append(name)
    stream = getattr(pipeline, "stream", None)
    master = getattr(getattr(stream, "spark", None), "master", "") or ""
    if master.startswith("spark://127.0.0.1:7077") or master.startswith("spark://localhost:7077"):
        needed.append("spark")
    return needed
