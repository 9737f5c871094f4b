"""The status pages in headless Chromium: a sync service's own ``/status`` and ``threes status --serve``.

A real sync service (RDS sink on PostgreSQL) writes 20 updates; Chromium
(Debian's package, ``--headless --dump-dom`` and ``--screenshot``) loads both
pages and the rendered DOM is checked: the sink's state, the partitions'
committed offsets equal to their end offsets, the endpoint answered, and the
page reloads itself. The screenshots are kept in ``.threes/artifacts/``
(``$THREES_ARTIFACTS``): ``status-page-service.png``, ``status-page-aggregated.png``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import yaml

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from sync_service.supervisor import ServiceSupervisor
from tests.conftest import ROOT
from tests.integration.ops.helpers import free_port, get_json
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, pipeline, wait_until


class Dom(HTMLParser):
    """The rendered DOM's facts: rows per table id (cells' text, ``data-state`` per cell) and meta tags."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, dict[str, list[str]]] = {}
        self.states: dict[str, dict[str, list[str]]] = {}
        self.meta: list[dict[str, str]] = []
        self._table: str | None = None
        self._row: str | None = None
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self._table = a.get("id")
            self.tables.setdefault(self._table or "", {})
            self.states.setdefault(self._table or "", {})
        elif tag == "tr" and self._table and "data-key" in a:
            self._row = a["data-key"]
            self.tables[self._table][self._row] = []
            self.states[self._table][self._row] = []
        elif tag == "td" and self._row is not None:
            self._cell = []
            if "data-state" in a:
                self.states[self._table][self._row].append(a["data-state"])  # type: ignore[index]
        elif tag == "meta":
            self.meta.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._row is not None and self._table:
            self.tables[self._table][self._row].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def render(chromium: str, url: str, screenshot: Path) -> Dom:
    """Load ``url`` in headless Chromium: the DOM after rendering, and a screenshot."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    subprocess.run([chromium, *flags, "--window-size=1280,1000", f"--screenshot={screenshot}", url],
                   capture_output=True, timeout=120, check=True)
    assert screenshot.stat().st_size > 10_000
    return Dom(dom)


def test_status_pages_render_the_facts_in_headless_chromium(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, unique: str, chromium: str,
    artifacts: Path, tmp_path: Path,
) -> None:
    topic, port, page_port = f"updates.page.{unique}", free_port(), free_port()
    doc = {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
        "sync": [{"name": f"page-{unique}", "dead_letter_topic": f"dlq.{unique}", "metrics_port": port,
                  "batch": {"max_records": 50, "max_age_ms": 100},
                  "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                             "table": f"page_{unique}", "key": ["id"], "create_table": True}]}],
    }
    p = pipeline(kafka, doc["connections"], doc["sync"])
    create_topic(kafka_conf, topic, 2)
    producer = UpdateProducer(kafka, topic)
    for key in range(20):
        producer.send(key, 1)
    producer.flush()
    sup = ServiceSupervisor(p.kafka, p.sync[0], dict(p.connections), serve_addr="127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    thread.start()
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(doc))
    aggregated = None
    try:
        group = p.sync[0].consumer_group()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 60, "the updates written and committed")
        def shown(part: dict[str, Any]) -> bool:  # committed and the end offset it caught up with (lag 0)
            return part["committed"] is not None and part["committed"] == part.get("end_offset")

        wait_until(lambda: (parts := get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0]["partitions"])
                   and sum(x["committed"] or 0 for x in parts) == 20 and all(shown(x) for x in parts),
                   30, "the service's status to show the commits and the end offsets")
        service = render(chromium, f"http://127.0.0.1:{port}/status", artifacts / "status-page-service.png")
        assert {"http-equiv": "refresh", "content": "5"} in service.meta  # the page reloads itself
        key = f"page-{unique}"
        assert service.states["sync-services"][key] == ["running"]
        assert service.states["sinks"][f"{key}/db"] == ["running"]
        parts = service.tables["partitions"]
        assert sorted(parts) == [f"{key}/{topic}[0]", f"{key}/{topic}[1]"]
        for cells in parts.values():  # service, topic, partition, committed, end offset, lag, paused
            assert cells[3] == cells[4] and cells[5] == "0" and cells[6] == "no"

        aggregated = subprocess.Popen(
            [sys.executable, "-m", "threes.cli", "status", str(config), "--serve", str(page_port)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        wait_until(lambda: _answers(f"http://127.0.0.1:{page_port}/status.json"), 60, "threes status --serve")
        page = render(chromium, f"http://127.0.0.1:{page_port}/status", artifacts / "status-page-aggregated.png")
        assert page.states["sync-services"][key] == ["running"]
        agg_parts = page.tables["partitions"]
        assert sum(int(c[3]) for c in agg_parts.values()) == 20 and all(c[5] == "0" for c in agg_parts.values())
        assert page.states["endpoints"][f"http://127.0.0.1:{port}/status.json"] == ["running"]
    finally:
        if aggregated is not None:
            aggregated.terminate()
            aggregated.wait(30)
        stop.set()
        thread.join(60)


def _answers(url: str) -> bool:
    try:
        get_json(url)
    except OSError:
        return False
    return True
