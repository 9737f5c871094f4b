"""The status page: the status document as one HTML page that reloads itself (no JavaScript, no build step).

Every table and row carries ``id``/``data-*`` attributes (``#sources``,
``#snapshots``, ``#sync-services``, ``#sinks``, ``#partitions``; rows
``data-key``) so a headless browser test, or an operator's script, can find a
fact without parsing text. Values are HTML-escaped; the document holds no
secret (names, offsets, states and error texts, which the connectors mask).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em;vertical-align:top}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.state-running,.state-caught_up{color:#17692b;font-weight:600}
.state-restarting,.state-recovering,.state-starting,.state-unknown,.state-degraded{color:#9a6700;font-weight:600}
.state-failed,.state-unreachable{color:#b3261e;font-weight:600}
.paused{color:#9a6700}.err{color:#b3261e;max-width:40em;word-break:break-word}
.muted{color:#777}
"""


def _e(value: Any) -> str:
    if value is None:
        return '<span class="muted">-</span>'
    if isinstance(value, (dict, list)):
        value = json.dumps(value, default=str)
    return html.escape(str(value))


def _num(value: Any) -> str:
    if value is None:
        return '<td class="num"><span class="muted">-</span></td>'
    if isinstance(value, float):
        return f'<td class="num">{value:,.1f}</td>'
    return f'<td class="num">{_e(value)}</td>'


def _state(value: Any) -> str:
    s = str(value or "unknown")
    return f'<td class="state state-{html.escape(s)}" data-state="{html.escape(s)}">{html.escape(s)}</td>'


def _table(table_id: str, headers: Sequence[str], rows: Iterable[tuple[str, str]], empty: str) -> str:
    body = [f'<tr data-key="{html.escape(key)}">{cells}</tr>' for key, cells in rows]
    if not body:
        return f'<p id="{table_id}" class="muted">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def render_page(doc: dict[str, Any], *, title: str = "threes", refresh_s: int = 5) -> str:
    """Render a status document as an HTML page.

    Args:
        doc: the status document (:mod:`kernel.status.document`).
        title: the page title.
        refresh_s: seconds between automatic reloads (``<meta http-equiv="refresh">``).

    Returns:
        The page, UTF-8 text.
    """
    services = doc.get("sync", [])
    sources, snapshots = _sources_table(doc), _snapshots_table(doc)
    service_rows, sinks, partitions = _services_table(services), _sinks_table(services), _partitions_table(services)
    endpoints = _endpoints_table(doc)
    t = html.escape(title)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{t}</title>'
        f'<meta http-equiv="refresh" content="{int(refresh_s)}">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{_STYLE}</style></head>'
        f'<body><h1>{t}</h1><p id="generated" data-generated="{_e(doc.get("generated_at"))}">'
        f'generated {_e(doc.get("generated_at"))}, reloads every {int(refresh_s)} s</p>'
        f"<h2>Sources</h2>{sources}<h2>Stream job snapshots</h2>{snapshots}"
        f"<h2>Sync services</h2>{service_rows}<h2>Sinks</h2>{sinks}<h2>Partitions</h2>{partitions}"
        f"<h2>Process endpoints</h2>{endpoints}</body></html>"
    )


def _sources_table(doc: dict[str, Any]) -> str:
    """The source tasks: state, position, how far behind."""
    return _table(
        "sources",
        ["connector", "task", "state", "position", "position stored", "records behind", "restarts", "last error"],
        (
            (s.get("task") or s.get("connector", ""),
             f"<td>{_e(s.get('connector'))}</td><td>{_e(s.get('task'))}</td>{_state(s.get('state'))}"
             f"<td><code>{_e(s.get('position'))}</code></td><td>{_e(s.get('position_updated_at'))}</td>"
             f"{_num(s.get('records_behind'))}{_num(s.get('restarts'))}"
             f'<td class="err">{_e(s.get("last_error"))}</td>')
            for s in doc.get("sources", [])
        ),
        "no source in this view",
    )


def _snapshots_table(doc: dict[str, Any]) -> str:
    """The stream jobs' snapshots: keys, age, end offsets."""
    return _table(
        "snapshots",
        ["job", "snapshot", "keys", "age (s)", "offsets (topic[partition]: end)"],
        (
            (f"{s.get('job')}/{s.get('snapshot')}",
             f"<td>{_e(s.get('job'))}</td><td>{_e(s.get('snapshot'))}</td>{_num(s.get('keys'))}"
             f"{_num(s.get('age_s'))}<td><code>{_e(_offsets_text(s.get('offsets', [])))}</code></td>")
            for s in doc.get("snapshots", [])
        ),
        "no snapshot in this view",
    )


def _services_table(services: list[dict[str, Any]]) -> str:
    """The sync services: consumer group, lag, paused partitions."""
    return _table(
        "sync-services",
        ["service", "consumer group", "state", "lag (records)", "paused partitions", "dead letters", "restarts",
         "last error"],
        (
            (str(s.get("service")),
             f"<td>{_e(s.get('service'))}</td><td>{_e(s.get('group'))}</td>{_state(s.get('state'))}"
             f"{_num(s.get('lag'))}<td class=\"paused\">{_e(_tps_text(s.get('paused', [])) or None)}</td>"
             f"{_num(s.get('dead_letters'))}{_num(s.get('restarts'))}"
             f'<td class="err">{_e(s.get("last_error"))}</td>')
            for s in services
        ),
        "no sync service in this view",
    )


def _sinks_table(services: list[dict[str, Any]]) -> str:
    """The sync services' sinks."""
    return _table(
        "sinks",
        ["service", "sink", "state", "restarts", "dead letters", "oldest un-durable record (s)", "last error"],
        (
            (f"{s.get('service')}/{k.get('sink')}",
             f"<td>{_e(s.get('service'))}</td><td>{_e(k.get('sink'))}</td>{_state(k.get('state'))}"
             f"{_num(k.get('restarts'))}{_num(k.get('dead_letters'))}{_num(k.get('oldest_pending_age_s'))}"
             f'<td class="err">{_e(k.get("last_error"))}</td>')
            for s in services for k in s.get("sinks", [])
        ),
        "no sink in this view",
    )


def _partitions_table(services: list[dict[str, Any]]) -> str:
    """The sync services' partitions: committed and end offsets."""
    return _table(
        "partitions",
        ["service", "topic", "partition", "committed", "end offset", "lag", "paused"],
        (
            (f"{s.get('service')}/{p.get('topic')}[{p.get('partition')}]",
             f"<td>{_e(s.get('service'))}</td><td>{_e(p.get('topic'))}</td>{_num(p.get('partition'))}"
             f"{_num(p.get('committed'))}{_num(p.get('end_offset'))}{_num(p.get('lag'))}"
             f"<td class=\"{'paused' if p.get('paused') else 'muted'}\">{'paused' if p.get('paused') else 'no'}</td>")
            for s in services for p in s.get("partitions", [])
        ),
        "no partition in this view",
    )


def _endpoints_table(doc: dict[str, Any]) -> str:
    """The process endpoints asked, and whether they answered."""
    return _table(
        "endpoints",
        ["endpoint", "answered", "error"],
        (
            (str(p.get("url")),
             f"<td>{_e(p.get('url'))}</td>{_state('running' if p.get('ok') else 'unreachable')}"
             f'<td class="err">{_e(p.get("error"))}</td>')
            for p in doc.get("endpoints", [])
        ),
        "no process endpoint asked",
    )


def _offsets_text(offsets: Iterable[dict[str, Any]]) -> str:
    return ", ".join(f"{o.get('topic')}[{o.get('partition')}]: {o.get('end_offset')}" for o in offsets)


def _tps_text(tps: Iterable[Any]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in tps)
