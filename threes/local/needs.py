"""Which local services a pipeline uses: ``threes demo`` starts only those.

Each connection declares the services it reaches
(:meth:`kernel.config.models.ConnectionConfig.local_services`), so a new technology
needs no change here.

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
        Service names of :data:`threes.local.registry.SERVICES`, Kafka always first.
    """
    needed = ["kafka"]
    for conn in getattr(pipeline, "connections", {}).values():
        for name in conn.local_services():
            if name not in needed:
                needed.append(name)
    stream = getattr(pipeline, "stream", None)
    master = getattr(getattr(stream, "spark", None), "master", "") or ""
    if master.startswith("spark://127.0.0.1:7077") or master.startswith("spark://localhost:7077"):
        needed.append("spark")
    return needed
