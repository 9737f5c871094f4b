"""``threes run CONFIG``: sources, stream job and sync services of one YAML, supervised, with a live view."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kernel.exceptions import FatalError

if TYPE_CHECKING:
    from threes.config import PipelineBase
    from threes.pipeline.parts import RunOptions
    from threes.pipeline.supervisor import Supervisor

log = logging.getLogger(__name__)


OnlyOpt = Annotated[
    list[str] | None,
    typer.Option("--only", help="run only these parts: sources, stream, sync (repeatable or comma list); "
                                "each still waits in Kafka for what it needs"),
]
LogDirOpt = Annotated[
    Path | None,
    typer.Option("--log-dir", help="each part's log goes here as <part>.log "
                                   "(default .threes/run/<config name>-<time>)"),
]
OffsetsTopicOpt = Annotated[str, typer.Option("--offsets-topic", help="compacted topic of the sources' positions")]
StartTimeoutOpt = Annotated[
    float, typer.Option("--start-timeout", help="seconds a part may wait to start or to be ready (0: forever)")
]
NoRestartOpt = Annotated[
    bool, typer.Option("--no-restart", help="stop the run when a part exits, instead of restarting it")
]
TakeOverOpt = Annotated[
    bool, typer.Option("--force", help="take over from a `threes run` of the same CONFIG that still runs: "
                                       "SIGTERM to it (its parts stop cleanly), up to 60 s, then SIGKILL; "
                                       "then this run starts")
]
ApiHostOpt = Annotated[
    str, typer.Option("--api-host", envvar="THREES_API_HOST",
                      help="address of the status page and management API; any other than loopback needs "
                           "$THREES_API_TOKEN (0.0.0.0 in a container)")
]
ApiPortOpt = Annotated[
    int | None, typer.Option("--api-port", envvar="THREES_API_PORT",
                             help="port of the status page and management API (default 8083, or a free one "
                                  "when 8083 is taken)", show_default=False)
]


def run(
    config: Annotated[Path, typer.Argument(help="connector config YAML", show_default=False)],
    only: OnlyOpt = None,
    log_dir: LogDirOpt = None,
    offsets_topic: OffsetsTopicOpt = "_threes_offsets",
    start_timeout: StartTimeoutOpt = 600.0,
    no_restart: NoRestartOpt = False,
    take_over: TakeOverOpt = False,
    api_host: ApiHostOpt = "127.0.0.1",
    api_port: ApiPortOpt = None,
) -> None:
    """Run the whole pipeline of CONFIG: sources, then the stream job, then the sync services.

    Each part is a child process (`threes source run`, `threes stream run`, `threes sync run`) started once
    what it needs is there: the stream job once every source finished its first snapshot (and the events
    topic exists: created from stream.events.topic_spec when missing), the sync services once their topics
    exist. A part that exits is restarted with backoff. Ctrl-C or SIGTERM stops them in reverse order, each
    flushing and committing; a second Ctrl-C kills them. The parts die with this process, even when it is
    killed with SIGKILL (Linux: each gets SIGTERM from the kernel).

    One run per CONFIG: a second `threes run` of the same file (however it is named) refuses to start while
    the first holds its lock (CONFIG's folder/.threes/run/*.lock), naming the first's PID; --force stops the
    first and takes over.

    The status page, /status.json, /healthz, /readyz and the management API (GET /parts, POST
    /parts/NAME/pause|resume|restart, DELETE /parts/NAME/offsets, PUT /pipeline; `threes ctl`) answer on
    --api-host:--api-port; $THREES_API_TOKEN is the bearer token (required off loopback).
    """
    from kernel.exceptions import ThreesError
    from threes.console import fail, load
    from threes.pipeline.lock import RunLock
    from threes.pipeline.parts import RunOptions
    from threes.pipeline.plan import parse_only

    stop, force = _stop_on_signals()
    pipeline = load(config)
    lock = RunLock(config)
    try:
        lock.acquire(force=take_over)
    except ThreesError as exc:
        raise fail(exc) from None
    try:
        options = RunOptions(
            config=config,
            only=parse_only(only),
            offsets_topic=offsets_topic,
            log_dir=log_dir or Path(".threes") / "run" / f"{config.stem}-{time.strftime('%Y%m%d-%H%M%S')}",
            start_timeout_s=start_timeout,
            restart=not no_restart,
        )
        api = (api_host, api_port, os.environ.get("THREES_API_TOKEN") or None, lock.path)
        supervisor, code = _supervise(pipeline, options, stop, force, api)
    except ThreesError as exc:
        raise fail(exc) from None
    finally:
        lock.release()  # after the parts stopped: a --force waiting for it starts only then
    _print_stopped(supervisor, options)
    if code:
        raise typer.Exit(code)


def _print_stopped(supervisor: Supervisor, options: RunOptions) -> None:
    """The table of the parts as they stopped: status, restarts, log file."""
    from rich.table import Table

    from threes.console import out

    table = Table("part", "status", "restarts", "log", title="threes run: stopped")
    for state in supervisor.parts:
        table.add_row(state.name, state.detail or state.status, str(state.restarts),
                      str(options.log_dir / f"{state.name}.log"))
    out.print(table)


def _stop_on_signals() -> tuple[threading.Event, threading.Event]:
    """``(stop, force)``: the first SIGINT/SIGTERM sets ``stop`` (parts stop cleanly), a second ``force`` (killed)."""
    stop, force = threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if stop.is_set():
            force.set()
            return
        log.info("run: %s received, stopping the pipeline", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop, force


def _supervise(pipeline: PipelineBase, options: RunOptions, stop: threading.Event,
               force: threading.Event, api: tuple[str, int | None, str | None, Path]) -> tuple[Supervisor, int]:
    """Run the parts until ``stop``, showing their states: a live table on a terminal, else a line per change.

    Args:
        pipeline: the validated pipeline.
        options: how to run it.
        stop: set to stop the run.
        force: set to kill the parts at once while stopping.
        api: ``(host, port, token, lock file)`` of the run's endpoint (:class:`~threes.pipeline.endpoint.RunEndpoint`).

    Returns:
        ``(the supervisor, the run's exit code)``.
    """
    from rich.live import Live

    from threes.console import console
    from threes.pipeline.endpoint import RunEndpoint
    from threes.pipeline.supervisor import Supervisor
    from threes.pipeline.view import line_printer, live

    def supervise(supervisor: Supervisor) -> tuple[Supervisor, int]:
        endpoint = RunEndpoint(supervisor, *api)
        try:
            url = endpoint.start()
        except OSError as exc:
            raise FatalError(f"cannot serve the management API on {api[0]}:{api[1]}: {exc.strerror}; "
                             "pass another --api-port") from None
        supervisor._note(f"status page and management API on {url}/status")
        try:
            return supervisor, supervisor.run(stop, force)
        finally:
            endpoint.close()

    if console.is_terminal:
        with Live(console=console, refresh_per_second=2, transient=False) as view:
            return supervise(Supervisor(pipeline, options, on_update=lambda s: view.update(live(s))))
    # a log file or a pipe: a line per change instead of redrawing
    printer = line_printer(lambda text: console.print(text, highlight=False, soft_wrap=True, markup=False))
    return supervise(Supervisor(pipeline, options, on_update=printer))


def register(app: typer.Typer) -> None:
    """Mount ``threes run`` on the ``threes`` app."""
    app.command("run")(run)
