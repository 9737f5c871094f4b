"""``threes source ...`` and ``threes offsets ...``: run sources, inspect and reset their positions."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

if TYPE_CHECKING:
    from connectors.runtime.standalone import SourceWorker, TaskSpec

source_app = typer.Typer(help="Run source connectors into compacted topics.", no_args_is_help=True)
offsets_app = typer.Typer(help="Show and reset source positions (the offsets topic).", no_args_is_help=True)

log = logging.getLogger(__name__)

ConfigArg = Annotated[Path, typer.Argument(help="connector config YAML", show_default=False)]
ConnectorOpt = Annotated[
    list[str] | None, typer.Option("--connector", "-c", help="only this source (repeatable); default: every source")
]
OffsetsTopicOpt = Annotated[str, typer.Option("--offsets-topic", help="compacted topic holding source positions")]


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, _frame: Any) -> None:
        log.warning("received %s: flushing and storing positions", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@source_app.command("run")
def run(
    config: ConfigArg,
    connector: ConnectorOpt = None,
    once: Annotated[bool, typer.Option("--once", help="stop after catching up (backfills); shows progress")] = False,
    group: Annotated[
        str | None,
        typer.Option("--group", help="share the tasks with every worker started with the same group (Kafka "
                                     "consumer group protocol); default: run every task here"),
    ] = None,
    offsets_topic: OffsetsTopicOpt = "_threes_offsets",
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="serve Prometheus /metrics and the /status page")
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", envvar="THREES_METRICS_HOST",
                          help="address --metrics-port binds; any other than loopback needs a bearer token in the "
                               "variable --metrics-token-env names")
    ] = "127.0.0.1",
    metrics_token_env: Annotated[
        str, typer.Option("--metrics-token-env", help="environment variable holding the bearer token of "
                                                      "--metrics-port (clients send 'Authorization: Bearer <token>')")
    ] = "THREES_METRICS_TOKEN",
) -> None:
    """Run every source of CONFIG (or those named) until SIGTERM/SIGINT, which flush and store positions."""
    from connectors.runtime.standalone import SourceWorker, select_sources, task_specs
    from kernel.exceptions import ThreesError
    from threes.console import fail, load, out

    pipeline = load(config)
    try:
        from kernel.kafka.topics import check_credentials

        # a refused login or broker certificate ends here, in one line (a broker that is down is retried)
        check_credentials(pipeline.kafka.librdkafka_config(), pipeline.kafka.request_timeout_s)
    except ThreesError as exc:
        raise fail(exc) from None
    stop = threading.Event()
    _stop_on_signals(stop)
    try:
        specs = task_specs(select_sources(pipeline, connector))
        if not specs:
            raise ThreesError(f"{config} declares no source to run")
        worker = SourceWorker(pipeline, offsets_topic=offsets_topic)
        if metrics_port:
            _serve_status(worker, f"threes source {config.name}", metrics_port, metrics_host, metrics_token_env)
        _run_tasks(worker, specs, group, once, stop)
    except ThreesError as exc:
        raise fail(exc) from None
    failed = {k: s for k, s in worker.stats().items() if s.state == "failed"}
    for key, s in sorted(worker.stats().items()):
        status = "[red]failed[/red]" if s.state == "failed" else f"[green]{s.state}[/green]"
        out.print(f"{key}: {status} rows_read={s.rows_read} acked={s.acked} tombstones={s.tombstones}"
                  + (f"\n  {s.error}" if s.error else ""), highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


def _serve_status(worker: SourceWorker, title: str, port: int, host: str, token_env: str) -> None:
    """``/metrics`` next to ``/status`` and ``/status.json`` (the source tasks' states, positions, restarts)."""
    from connectors.runtime.status import source_document
    from kernel.redact import register_secret
    from kernel.status.http import StatusServer, require_token_off_loopback

    token = os.environ.get(token_env) or None
    register_secret(token)
    require_token_off_loopback(host, token, f"${token_env}")
    StatusServer(lambda: source_document(worker), title=title).serve(port, host, token)


def _run_tasks(worker: SourceWorker, specs: list[TaskSpec], group: str | None, once: bool,
               stop: threading.Event) -> None:
    """Run the tasks here (until caught up with ``once``), or share them with the workers of ``group``; until stop.

    Raises:
        ThreesError: ``once`` with ``group``.
    """
    from kernel.exceptions import ThreesError

    if group:
        if once:
            raise ThreesError("--once and --group do not mix: a backfill runs in one process")
        from connectors.runtime.distributed import DistributedWorker

        DistributedWorker(worker, specs, group).run(stop)
        return
    for spec in specs:
        worker.start(spec, once=once)
    if once:
        _progress(worker, stop)
    else:
        _log_progress(worker, stop)
    worker.wait(stop)


def _progress(worker: Any, stop: threading.Event) -> None:
    """A rich progress display per task: rows read, records acknowledged, rate."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from threes.console import console

    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TextColumn("read {task.fields[read]:>10,}"),
        TextColumn("acked {task.fields[acked]:>10,}"),
        TextColumn("{task.fields[rate]:>9,.0f} rows/s"),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bars = {key: progress.add_task(key, total=None, read=0, acked=0, rate=0.0, state="starting")
                for key in worker.runners}
        while not stop.is_set():
            alive = worker.running()
            for key, s in worker.stats().items():
                elapsed = max(1e-6, time.monotonic() - s.started)
                progress.update(bars[key], read=s.rows_read, acked=s.acked, rate=s.acked / elapsed, state=s.state)
            if not alive:
                break
            stop.wait(0.5)


def _log_progress(worker: Any, stop: threading.Event, every_s: float = 30.0) -> None:
    """One summary line per task every ``every_s`` seconds while running."""
    while worker.running() and not stop.wait(every_s):
        for key, s in worker.stats().items():
            log.info("source=%s state=%s rows_read=%d acked=%d tombstones=%d", key, s.state, s.rows_read, s.acked,
                     s.tombstones)


def _offset_rows(pipeline: Any, connector: list[str] | None, offsets_topic: str) -> tuple[Any, list[Any], list[str]]:
    from connectors.runtime.offsets import OffsetStore
    from connectors.runtime.standalone import select_sources
    from kernel.kafka.topics import internal_topic_options

    sources = select_sources(pipeline, connector)
    names = {s.name for s in sources}
    store = OffsetStore(pipeline.kafka.librdkafka_config(), offsets_topic, **internal_topic_options(pipeline.kafka))
    stored = [p for p in store.load_all().values() if p.connector in names]
    return store, sorted(stored, key=lambda p: p.key), sorted(names)


@offsets_app.command("list")
def list_offsets(config: ConfigArg, connector: ConnectorOpt = None, offsets_topic: OffsetsTopicOpt = "_threes_offsets",
                 as_json: Annotated[bool, typer.Option("--json", help="print JSON lines")] = False) -> None:
    """Show the stored position of every source of CONFIG (or of those named)."""
    from kernel.exceptions import ThreesError
    from threes.console import fail, load, out

    pipeline = load(config)
    try:
        _store, stored, names = _offset_rows(pipeline, connector, offsets_topic)
    except ThreesError as exc:
        raise fail(exc) from None
    if as_json:
        for p in stored:
            print(json.dumps({"key": p.key, "connector": p.connector, "task": p.task, "topic": p.topic,
                              "position": p.position, "updated_ms": p.updated_ms}))
        return
    table = Table("connector", "task", "topic", "position", "updated (UTC)")
    for p in stored:
        when = dt.datetime.fromtimestamp(p.updated_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(p.connector, str(p.task), p.topic or "", json.dumps(p.position), when)
    for name in sorted(set(names) - {p.connector for p in stored}):
        table.add_row(name, "-", "", "none: next run starts with a snapshot", "")
    out.print(table)


@offsets_app.command("reset")
def reset_offsets(
    config: ConfigArg,
    connector: ConnectorOpt = None,
    offsets_topic: OffsetsTopicOpt = "_threes_offsets",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
) -> None:
    """Forget stored positions: the next run of those sources re-snapshots. The sources must not run.

    While a `threes run` of CONFIG runs (it holds CONFIG's lock), the reset goes through its management API
    (DELETE /parts/sources/offsets), which refuses it unless its sources are paused (`threes ctl pause
    sources`): a running task's next position write would undo the reset. Otherwise this command holds the
    lock while it resets, so no `threes run` of CONFIG starts meanwhile.
    """
    from kernel.exceptions import FatalError, ThreesError
    from threes.console import fail, load, out
    from threes.pipeline.lock import RunLock

    pipeline = load(config)
    lock = RunLock(config)
    try:
        lock.acquire()
    except OSError:  # a read-only folder: no `threes run` can hold a lock there either
        pass
    except FatalError:
        try:
            keys = _reset_through_run(lock, connector, yes)
        except ThreesError as exc:
            raise fail(exc) from None
        out.print(f"[green]reset[/green] {', '.join(keys) or 'nothing stored'} through the running `threes run`: "
                  "its sources snapshot again when resumed", highlight=False)
        return
    try:
        keys = _reset_here(pipeline, connector, offsets_topic, yes)
    except ThreesError as exc:
        raise fail(exc) from None
    finally:
        lock.release()
    if keys:
        out.print(f"[green]reset[/green] {', '.join(keys)}: the next run re-snapshots", highlight=False)


def _reset_here(pipeline: Any, connector: list[str] | None, offsets_topic: str, yes: bool) -> list[str]:
    """Reset the stored positions with no run of the config (the caller holds its lock)."""
    from kernel.kafka import clients
    from threes.console import out

    store, stored, _names = _offset_rows(pipeline, connector, offsets_topic)
    if not stored:
        out.print("no stored position to reset")
        return []
    keys = [p.key for p in stored]
    if not yes and not typer.confirm(f"reset {len(keys)} position(s): {', '.join(keys)}?"):
        raise typer.Exit(1)
    store.reset(keys, clients.kafka_producer(pipeline.kafka))
    return keys


def _reset_through_run(lock: Any, connector: list[str] | None, yes: bool) -> list[str]:
    """Reset through the management API of the `threes run` holding ``lock`` (409 unless its sources are paused).

    Raises:
        ThreesError: its API is not found, refuses (the sources run), or ``connector`` narrows the reset.
    """
    from kernel.exceptions import ThreesError
    from threes.ctl import call
    from threes.pipeline.endpoint import read_discovery

    found = read_discovery(lock.path)
    pid = lock.holder()
    if found is None:
        raise ThreesError(f"a `threes run` of {lock.config} runs (pid {pid}) and its API is not found: stop it first")
    if connector:
        raise ThreesError(f"a `threes run` of {lock.config} runs (pid {pid}): its API resets every source's "
                          "position; pause its sources and reset without --connector, or stop the run first")
    if not yes and not typer.confirm(f"reset every source position of the `threes run` of {lock.config}?"):
        raise typer.Exit(1)
    doc = call("DELETE", f"{found['url']}/parts/sources/offsets", found.get("token"))
    return list(doc.get("reset", []))
