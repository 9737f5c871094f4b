"""``threes status CONFIG``: the pipeline's runtime view, as tables, JSON, or a page served over HTTP."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

if TYPE_CHECKING:
    from threes.status_gather import Gatherer

log = logging.getLogger(__name__)

ConfigArg = Annotated[Path, typer.Argument(help="connector config YAML", show_default=False)]


def register(app: typer.Typer) -> None:
    """Add ``status`` to the ``threes`` app."""
    app.command("status")(status)


def status(
    config: ConfigArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the status document as JSON (for scripts)")] = False,
    endpoint: Annotated[
        list[str] | None,
        typer.Option("--endpoint", "-e", help="base URL of another process's status endpoint, e.g. a source run "
                                              "with --metrics-port: http://127.0.0.1:9300 (repeatable)"),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="host of the ports the config names (metrics_port)")] = (
        "127.0.0.1"
    ),
    offsets_topic: Annotated[str, typer.Option("--offsets-topic", help="the sources' offsets topic")] = (
        "_threes_offsets"
    ),
    serve: Annotated[
        int | None,
        typer.Option("--serve", help="serve the page on this port (/status, /status.json), gathered per request"),
    ] = None,
    serve_addr: Annotated[
        str, typer.Option("--serve-addr", help="address --serve binds; any other than loopback needs a bearer "
                                               "token in the variable --token-env names")
    ] = "127.0.0.1",
    token_env: Annotated[
        str, typer.Option("--token-env", help="environment variable holding the bearer token of --serve, also "
                                              "sent to every --endpoint")
    ] = "THREES_METRICS_TOKEN",
) -> None:
    """Show every source task, stream job snapshot, sync service, sink and partition of CONFIG.

    Read from Kafka (stored source positions, committed offsets against end
    offsets) and from each long-running process's ``/status.json`` (states,
    restarts, paused partitions, dead letters, last errors): ``metrics_port``
    of the sync services and the stream job, and ``--endpoint`` for others.
    """
    from kernel.exceptions import ThreesError
    from kernel.redact import redact_document, register_secret
    from threes.console import fail, load, out
    from threes.status_gather import Gatherer

    pipeline = load(config)
    token = os.environ.get(token_env) or None
    register_secret(token)
    gatherer = Gatherer(pipeline, offsets_topic=offsets_topic, host=host, endpoints=endpoint or (), token=token)
    if serve is not None:
        _serve(gatherer, f"threes status {config.name}", serve, serve_addr, token)
        return
    try:
        doc = redact_document(gatherer.gather())  # error texts of drivers can echo a URL: masked as in the logs
    except ThreesError as exc:
        raise fail(exc) from None
    if as_json:
        print(json.dumps(doc, indent=1, default=str))
        return
    for table in tables(doc):
        out.print(table)


def _serve(gatherer: Gatherer, title: str, port: int, addr: str, token: str | None) -> None:
    """Serve the status page, gathered per request, until Ctrl-C."""
    from kernel.exceptions import ThreesError
    from kernel.status.http import StatusServer
    from threes.console import fail, out

    server = StatusServer(gatherer.gather, title=title)
    try:
        bound = server.serve(port, addr, token)
    except ThreesError as exc:
        raise fail(exc) from None
    out.print(f"serving http://{addr}:{bound}/status (Ctrl-C stops)", highlight=False)
    stop = threading.Event()
    try:
        stop.wait()
    except KeyboardInterrupt:
        server.close()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def _state(value: Any) -> str:
    s = str(value or "unknown")
    color = {"running": "green", "caught_up": "green", "failed": "red", "unreachable": "red"}.get(s, "yellow")
    return f"[{color}]{s}[/{color}]"


def tables(doc: dict[str, Any]) -> list[Table]:
    """The status document as rich tables (sources, snapshots, services, sinks, partitions, endpoints)."""
    out: list[Table] = []
    t = Table("connector", "task", "state", "position", "stored", "behind", "restarts", "last error",
              title="sources")
    for s in doc.get("sources", []):
        t.add_row(s.get("connector"), s.get("task"), _state(s.get("state")), _cell(s.get("position")),
                  _cell(s.get("position_updated_at")), _cell(s.get("records_behind")), _cell(s.get("restarts")),
                  _cell(s.get("last_error")))
    out.append(t)
    if doc.get("snapshots"):
        t = Table("job", "snapshot", "keys", "age s", "end offsets", title="stream job snapshots")
        for s in doc["snapshots"]:
            offsets = ", ".join(f"{o['topic']}[{o['partition']}]={o['end_offset']}" for o in s.get("offsets", []))
            t.add_row(s.get("job"), s.get("snapshot"), _cell(s.get("keys")), _cell(s.get("age_s")), offsets)
        out.append(t)
    t = Table("service", "group", "state", "lag", "paused", "dead letters", "restarts", "last error",
              title="sync services")
    for s in doc.get("sync", []):
        paused = ", ".join(f"{tp[0]}[{tp[1]}]" for tp in s.get("paused", [])) or "-"
        t.add_row(s.get("service"), s.get("group"), _state(s.get("state")), _cell(s.get("lag")), paused,
                  _cell(s.get("dead_letters")), _cell(s.get("restarts")), _cell(s.get("last_error")))
    out.append(t)
    t = Table("service", "sink", "state", "restarts", "dead letters", "oldest pending s", "last error", title="sinks")
    for s in doc.get("sync", []):
        for k in s.get("sinks", []):
            t.add_row(s.get("service"), k.get("sink"), _state(k.get("state")), _cell(k.get("restarts")),
                      _cell(k.get("dead_letters")), _cell(k.get("oldest_pending_age_s")), _cell(k.get("last_error")))
    out.append(t)
    t = Table("service", "topic", "partition", "committed", "end offset", "lag", "paused", title="partitions")
    for s in doc.get("sync", []):
        for p in s.get("partitions", []):
            t.add_row(s.get("service"), p.get("topic"), _cell(p.get("partition")), _cell(p.get("committed")),
                      _cell(p.get("end_offset")), _cell(p.get("lag")), "paused" if p.get("paused") else "no")
    out.append(t)
    if doc.get("endpoints"):
        t = Table("endpoint", "answered", "error", title="process endpoints")
        for e in doc["endpoints"]:
            t.add_row(e.get("url"), _state("running" if e.get("ok") else "unreachable"), _cell(e.get("error")))
        out.append(t)
    return out
