"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``), no library.

Chromium reads commands on its fd 3 and writes answers and events on fd 4, each a JSON
message ended by a NUL byte. That is enough to load a page, click a button like a person
(``element.click()`` runs the browser's own form submission: its ``Origin`` header, its
redirect) and read the DOM after.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any


class Browser:
    """One headless Chromium with one page.

    Args:
        chromium: the browser's executable.
    """

    def __init__(self, chromium: str):
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()

        def pipes() -> None:  # the browser's fd 3 reads our commands, its fd 4 writes its answers
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.process = subprocess.Popen(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            preexec_fn=pipes,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._id = 0
        target = self.command("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def command(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        """Send one command and return its ``result`` (events in between are skipped)."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._next()
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def _next(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(line))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.command("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session)
        return result.get("result", {}).get("value")

    def open(self, url: str, timeout_s: float = 60.0) -> None:
        """Load ``url`` and wait until its document is complete."""
        self.command("Page.navigate", {"url": url}, self.session)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'", timeout_s)

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> None:
        """Wait until a JavaScript expression is true in the page."""
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true within {timeout_s:.0f} s: {expression}")
            time.sleep(0.2)

    def close(self) -> None:
        """End the browser."""
        try:
            self.command("Browser.close")
        except (RuntimeError, OSError):
            pass
        self.process.terminate()
        self.process.wait(30)
        os.close(self._write)
        os.close(self._read)
