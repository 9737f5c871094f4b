"""What ``threes run`` reads from a child's local metrics endpoint to know when a part is ready.

A scrape of ``http://127.0.0.1:<port>/metrics`` (cheap, read about once a second by the
supervisor) and the readings taken from its Prometheus text: completed polling cycles of
the sources, partitions assigned to the sync services. What is read from Kafka is in
:mod:`threes.pipeline.kafka_probe`; the live view's readings in :mod:`threes.pipeline.flow_reader`.
"""

from __future__ import annotations

import urllib.request

CYCLES_METRIC = "threes_source_cycle_seconds"
"""The source runtime's histogram of completed polling cycles, labelled by connector."""


def scrape(port: int, timeout_s: float = 2.0, token: str | None = None) -> str | None:
    """The text of ``http://127.0.0.1:<port>/metrics``; ``None`` when it does not answer.

    Args:
        port: the child's metrics port.
        timeout_s: seconds.
        token: the endpoint's bearer token (``metrics_token``), if it has one.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # loopback
            return resp.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def source_cycles(metrics_text: str) -> dict[str, int]:
    """Completed polling cycles per source connector, from a Prometheus text exposition.

    Args:
        metrics_text: the body of a ``threes source run`` metrics endpoint.

    Returns:
        Connector name -> cycles completed (every task of it together); a connector
        that has completed none is absent.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != CYCLES_METRIC:
            continue
        for sample in family.samples:
            if sample.name == f"{CYCLES_METRIC}_count" and sample.value > 0:
                out[sample.labels.get("connector", "")] = int(sample.value)
    return out


def sync_assigned(metrics_text: str) -> dict[str, int]:
    """Partitions assigned per sync service, from a ``threes sync run`` metrics endpoint.

    Args:
        metrics_text: a Prometheus text exposition.

    Returns:
        Service name -> partitions its consumer holds (``threes_sync_assigned_partitions``);
        a service is ready only above 0.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "threes_sync_assigned_partitions":
            for sample in family.samples:
                out[sample.labels.get("service", "")] = int(sample.value)
    return out


def sources_ready(cycles: dict[str, int], tasks: dict[str, int]) -> tuple[list[str], list[str]]:
    """Which source connectors finished their first cycle (the initial snapshot, read until caught up).

    Args:
        cycles: connector -> cycles completed (:func:`source_cycles`).
        tasks: connector -> its number of tasks; a connector is ready once it completed
            at least that many cycles (one per task for a connector that does not split).

    Returns:
        ``(ready, waiting)`` connector names, each sorted.
    """
    ready = sorted(n for n, count in tasks.items() if cycles.get(n, 0) >= max(1, count))
    return ready, sorted(set(tasks) - set(ready))
