"""``threes run`` counts the sync part ready only once every service holds partitions (issue #40 item 7)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sync_service.metrics import SyncMetrics
from threes.pipeline import supervisor as supervisor_module
from threes.pipeline.parts import PartState
from threes.pipeline.plan import Part
from threes.pipeline.probes import sync_assigned
from threes.pipeline.supervisor import Supervisor


def exposition(service: str, assigned: int | None) -> str:
    """The metrics text of a sync service holding ``assigned`` partitions (``None``: not set yet)."""
    from prometheus_client import generate_latest

    metrics = SyncMetrics(service)
    if assigned is not None:
        metrics.assigned.labels(service).set(assigned)
    return generate_latest(metrics.registry).decode()


def test_sync_assigned_reads_the_gauge() -> None:
    assert sync_assigned(exposition("db", 3)) == {"db": 3}
    assert sync_assigned(exposition("db", 0)) == {"db": 0}
    assert sync_assigned(exposition("db", None)) == {}


def test_the_sync_part_is_ready_only_when_every_service_holds_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = {1: exposition("db", 0), 2: exposition("search", 2)}
    monkeypatch.setattr(supervisor_module, "scrape", lambda port, *a, **k: texts[port])
    sup = Supervisor.__new__(Supervisor)  # only what _check_ready reads: no processes, no Kafka
    sup.pipeline = SimpleNamespace(
        stream=None,
        sync=[SimpleNamespace(name=n, metrics_port=None, metrics_token=None) for n in ("db", "search")],
    )
    sup.events, sup.events_total = [], 0
    state = PartState(Part("sync", [], metrics_ports=[1, 2]), status="starting")
    sup._check_ready(state)
    assert state.status == "starting" and "waiting for partitions (db)" in state.detail
    texts[1] = exposition("db", 2)
    sup._check_ready(state)
    assert state.status == "ready" and state.detail == "consuming (db, search)"
