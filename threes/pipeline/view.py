"""The live view of ``threes run`` (rich), and a plain progress line for logs and pipes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from threes.pipeline.supervisor import Supervisor

STYLES = {
    "waiting": "yellow",
    "starting": "cyan",
    "ready": "green",
    "restarting": "magenta",
    "stopping": "yellow",
    "stopped": "dim",
    "failed": "red",
}


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _age(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def live(sup: Supervisor) -> Panel:
    """The panel: each part's status, then what Kafka holds (records per topic, sync progress), then news."""
    now = time.monotonic()
    parts = Table("part", "status", "pid", "for", "restarts", "", box=None, padding=(0, 1))
    for state in sup.parts:
        pid = str(state.child.pid) if state.child is not None and state.status not in ("stopped",) else ""
        parts.add_row(
            Text(state.name, style="bold"),
            Text(state.status, style=STYLES.get(state.status, "")),
            pid,
            _age(now - state.since),
            str(state.restarts) if state.restarts else "",
            Text(state.detail, overflow="fold"),
        )
    body: list[Any] = [parts]
    flow = sup.flow
    if flow is not None:
        roles = topic_roles(sup.pipeline)
        topics = Table("topic", "records", "role", box=None, padding=(0, 1), title_justify="left")
        for topic, records in flow.topics.items():
            topics.add_row(topic, _n(records), roles.get(topic, ""))
        for name in flow.committed:
            topics.add_row(
                Text(f"sync {name}", style="bold"), _n(flow.committed[name]),
                f"committed to its targets; lag {_n(flow.lag.get(name))}",
            )
        body += [Text(""), topics]
    if sup.events:
        body.append(Text(""))
        for at, message in sup.events[-4:]:
            body.append(Text(f"{time.strftime('%H:%M:%S', time.localtime(at))}  {message}", style="dim"))
    title = f"threes run {sup.options.config} · {sup.phase} · {_age(now - sup.started_at)}"
    subtitle = "Ctrl-C stops (sync, stream, sources in that order); twice kills"
    return Panel(Group(*body), title=title, subtitle=subtitle, border_style="blue")


def topic_roles(pipeline: Any) -> dict[str, str]:
    """Topic -> what it is in the pipeline (``state of source x``, ``events``, ``updates``, ``dead letters``)."""
    roles: dict[str, str] = {}
    for source in pipeline.sources:
        roles.setdefault(source.topic, f"state, source {source.name}")
    stream = pipeline.stream
    if stream is not None:
        for snap in stream.snapshots:
            for topic in snap.topics:
                roles.setdefault(topic, f"state, snapshot {snap.name}")
        roles.setdefault(stream.events.topic, "events in")
        roles.setdefault(stream.enriched_topic, "enriched events out")
        for update in stream.updates:
            roles.setdefault(update.topic, f"updates ({update.kind})")
        roles.setdefault(stream.dead_letter_topic, "dead letters of the stream job")
    for svc in pipeline.sync:
        roles.setdefault(svc.dead_letter_topic, f"dead letters of sync {svc.name}")
    return roles


def line_printer(print_line: Callable[[str], None], every_s: float = 10.0) -> Callable[[Supervisor], None]:
    """An ``on_update`` for a log file or a pipe.

    Prints each news item of the supervisor (a part started, ready, restarted, stopped) as it comes, and a
    status line per change of any part's status, else every ``every_s`` seconds.
    """
    last: dict[str, Any] = {"at": 0.0, "key": None, "events": 0}

    def update(sup: Supervisor) -> None:
        fresh = sup.events_total - last["events"]
        for _at, message in sup.events[-fresh:] if fresh > 0 else []:
            print_line(f"[run] {message}")
        last["events"] = sup.events_total
        key = (sup.phase, tuple((p.status, p.restarts) for p in sup.parts))
        now = time.monotonic()
        if key == last["key"] and now - last["at"] < every_s:
            return
        last.update(at=now, key=key)
        text = f"[run] {sup.phase}: " + "; ".join(
            f"{p.name} {p.status}" + (f" ({p.detail})" if p.detail else "") for p in sup.parts
        )
        if sup.flow is not None:
            text += " | " + " ".join(f"{t}={_n(n)}" for t, n in sup.flow.topics.items())
            text += "".join(f" sync:{s}={_n(c)}/lag {_n(sup.flow.lag.get(s))}" for s, c in sup.flow.committed.items())
        print_line(text)

    return update
