"""``threes run``'s status page in headless Chromium: its buttons pause and resume a part; a foreign page cannot.

A real ``threes run`` (a PostgreSQL source and sink, see
``tests/integration/pipeline/test_management_api.py``) serves its page on loopback. Chromium,
driven over the DevTools protocol, clicks *pause* on the sync part's row: the browser posts
the form (with the page's CSRF token, from the page's origin), follows the redirect to the
page, and the row shows ``paused``; *resume* brings it back. Then a page of another origin
(another port of 127.0.0.1, as any site the browser opens could be) posts the same form, even
with the right CSRF token: the server refuses it (403), and the part keeps running.
The screenshot is kept in ``.threes/artifacts/status-page-run.png``.
"""

from __future__ import annotations

import base64
import html
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from tests.integration.ops.cdp import Browser
from tests.integration.pipeline.test_management_api import Run
from tests.integration.pipeline.test_management_api import run as run

STATE = "document.querySelector('#parts tr[data-key=\"sync\"] td[data-state]').dataset.state"


@pytest.fixture
def browser(chromium: str) -> Iterator[Browser]:
    opened = Browser(chromium)
    try:
        yield opened
    finally:
        opened.close()


def _foreign_page(form: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A page of another origin (a free port of 127.0.0.1) whose form posts itself on load."""
    body = f'<!doctype html><html><body onload="document.forms[0].submit()">{form}</body></html>'.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def test_the_page_pauses_and_resumes_and_a_foreign_page_cannot(
    run: Run, browser: Browser, artifacts: Path, kafka: KafkaConfig, pg: RdsConnection
) -> None:
    api = run.api
    browser.open(f"{api.url}/status")
    assert browser.evaluate(STATE) == "ready"
    browser.evaluate("document.getElementById('pause-sync').click()")
    browser.wait_for(f"location.pathname === '/status' && {STATE} === 'paused'")
    assert api.part("sync")["state"] == "paused"
    shot = browser.command("Page.captureScreenshot", {"format": "png"}, browser.session)["data"]
    (artifacts / "status-page-run.png").write_bytes(base64.b64decode(shot))
    browser.evaluate("document.getElementById('resume-sync').click()")
    browser.wait_for(f"{STATE} === 'ready'")
    assert api.part("sync")["state"] == "ready"

    csrf = browser.evaluate("document.querySelector('#pause-sync').form.csrf.value")
    assert csrf  # the foreign page even knows the page's token: the origin check still refuses it
    form = (
        f'<form method="post" action="{api.url}/parts/sync/pause">'
        f'<input type="hidden" name="csrf" value="{html.escape(csrf)}"></form>'
    )
    server, url = _foreign_page(form)
    try:
        browser.open(url)
        browser.wait_for("document.body && document.body.innerText.includes('cross-origin request refused')")
    finally:
        server.shutdown()
    assert api.part("sync")["state"] == "ready"
