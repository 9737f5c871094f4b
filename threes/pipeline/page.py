"""The status page of ``threes run``: its parts, with pause, resume and restart buttons (HTML forms, no JavaScript).

Each button is a form that posts to the management API with the page's CSRF token
(:mod:`kernel.status.guard`); the server sends the browser back to ``/status`` (``303``).
The table is ``#parts``, a row's ``data-key`` is the part's name, its state cell carries
``data-state``, and each button has the id ``<action>-<part>``, for tests and scripts.
"""

from __future__ import annotations

import html
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}form{display:inline}.err{color:#b3261e;max-width:40em;word-break:break-word}
"""


def _e(value: Any) -> str:
    return '<span class="muted">-</span>' if value is None else html.escape(str(value))


def _buttons(name: str, csrf: str) -> str:
    token = html.escape(csrf)
    return "".join(
        f'<form method="post" action="/parts/{html.escape(name)}/{action}">'
        f'<input type="hidden" name="csrf" value="{token}">'
        f'<button type="submit" id="{action}-{html.escape(name)}">{action}</button></form> '
        for action in ("pause", "resume", "restart")
    )


def render_run_page(doc: dict[str, Any], csrf: str, refresh_s: int = 5) -> str:
    """The page of a run document (:func:`threes.pipeline.api.run_document`) with the CSRF token in its forms."""
    rows = "".join(
        f'<tr data-key="{_e(p["name"])}"><td>{_e(p["name"])}</td>'
        f'<td data-state="{_e(p["state"])}">{_e(p["state"])}</td><td>{_e(p["detail"])}</td>'
        f"<td>{_e(p['restarts'])}</td><td>{_e(p['lag'])}</td><td>{_e(p['config_revision'])}</td>"
        f'<td class="err">{_e(p["last_error"])}</td><td>{_buttons(p["name"], csrf)}</td></tr>'
        for p in doc.get("parts", [])
    )
    title = f"threes run {doc.get('config', '')}"
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{refresh_s}">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        f'<h1>{_e(title)}</h1><p id="phase">{_e(doc.get("phase"))} · config revision {_e(doc.get("revision"))}</p>'
        '<table id="parts"><thead><tr><th>part</th><th>state</th><th>detail</th><th>restarts</th><th>lag</th>'
        f"<th>config</th><th>last error</th><th>actions</th></tr></thead><tbody>{rows}</tbody></table>"
        "</body></html>"
    )
