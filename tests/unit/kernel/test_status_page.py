"""The status page and tables render the status document (escaped, with the attributes tests and scripts use)."""

from __future__ import annotations

from rich.console import Console

from kernel.status.page import render_page
from threes.status import tables

DOC = {
    "generated_at": "2026-11-23T21:00:00Z",
    "sources": [{"connector": "pg", "task": "pg#0", "state": "restarting", "position": {"after": [5]},
                 "records_behind": 12, "restarts": 2, "last_error": "connection refused <script>"}],
    "snapshots": [{"job": "stream", "snapshot": "airports", "keys": 1458, "age_s": 0.5,
                   "offsets": [{"topic": "state.airports", "partition": 0, "end_offset": 1458}]}],
    "sync": [{"service": "search", "group": "threes-sync-search", "state": "degraded", "lag": 7,
              "paused": [["updates.flights", 1]], "dead_letters": 3, "restarts": 0, "last_error": None,
              "partitions": [{"topic": "updates.flights", "partition": 1, "committed": 10, "end_offset": 17,
                              "lag": 7, "paused": True}],
              "sinks": [{"sink": "es", "state": "restarting", "restarts": 4, "dead_letters": 3,
                         "last_error": "503", "oldest_pending_age_s": 42.0}]}],
    "endpoints": [{"url": "http://127.0.0.1:9411/status.json", "ok": False, "error": "refused"}],
}


def test_the_page_reloads_itself_and_marks_every_fact() -> None:
    html = render_page(DOC, title="t", refresh_s=7)
    assert '<meta http-equiv="refresh" content="7">' in html
    assert '<tr data-key="pg#0">' in html and 'data-state="restarting"' in html
    assert '<tr data-key="search/es">' in html and '<tr data-key="search/updates.flights[1]">' in html
    assert "connection refused &lt;script&gt;" in html and "<script>" not in html
    assert 'id="snapshots"' in html and "state.airports[0]: 1458" in html
    assert 'data-state="unreachable"' in html


def test_an_empty_document_says_so() -> None:
    html = render_page({"generated_at": "x"})
    assert "no source in this view" in html and "no sync service in this view" in html


def test_the_tables_show_the_same_facts() -> None:
    console = Console(width=250, record=True)
    for t in tables(DOC):
        console.print(t)
    text = console.export_text()
    for fact in ("pg#0", "restarting", "airports", "1458", "threes-sync-search", "updates.flights[1]", "42.0",
                 "refused"):
        assert fact in text
