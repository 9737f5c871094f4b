"""The ``threes`` command line (typer + rich).

Commands of every part hang off one app: ``validate``, ``check``, ``schema``,
``local`` (the native local stack), ``dlq`` (dead letters); the sources, the stream job and the sync
service add their own groups. Errors of threes print as one red line that says
what is wrong and what to do, never a stack trace (``--debug`` shows one).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import TracebackType
from typing import Annotated

import typer

from kernel.exceptions import ConfigError, ThreesError
from threes.console import ConfigArg, console, fail, load, out

app = typer.Typer(
    name="threes",
    help="Source, Stream, Sink: connectors, a PySpark stream job and a sync service around Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,  # --debug tracebacks: locals would show secrets
)
SERVICES = frozenset({"source", "stream", "sync"})
"""Command groups of long-running parts: they log what they do at INFO by default (snapshot done, ready, ...)."""

OWN_LOGGERS = ("kernel", "connectors", "stream_app", "sync_service", "schemas", "threes")


@app.callback()
def main(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log at INFO")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="log at DEBUG and show tracebacks")] = False,
) -> None:
    """Set up logging for every command."""
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    from kernel.redact import install_log_redaction

    install_log_redaction()  # every line, ours and the libraries', with URL passwords and config secrets masked
    sys.excepthook = _redacted_traceback  # an unexpected error's traceback (--debug) masks them too
    if level == logging.WARNING and ctx.invoked_subcommand in SERVICES:
        # a service says what it did (as Kafka Connect does): threes' own lines at INFO, libraries' at WARNING
        for name in OWN_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
    if ctx.invoked_subcommand in SERVICES:
        from connectors.runtime.process import tune_gc

        try:
            tune_gc()  # a data-path process: collections rarer (connectors/runtime/process.py)
        except ValueError as exc:
            raise fail(ThreesError(str(exc))) from None
    if debug:
        app.pretty_exceptions_enable = True


def _redacted_traceback(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """Print a traceback as Python would, without locals, secrets masked (``kernel.redact``)."""
    import traceback

    from kernel.redact import redact

    sys.stderr.write(redact("".join(traceback.format_exception(kind, value, tb))))


@app.command()
def validate(config: ConfigArg) -> None:
    """Validate a config file and its schemas without connecting to anything (exit 1 on errors).

    What needs the schema topic or Spark is named, one line each (``note:``), not an error.
    """
    from threes.schemas_check import left_to_check, schema_problems

    pipeline = load(config)
    problems = schema_problems(pipeline, config)
    if problems:
        raise fail(ConfigError(problems))
    n_sinks = sum(len(s.sinks) for s in pipeline.sync)
    out.print(
        f"[green]ok[/green] {config}: {len(pipeline.sources)} source(s), "
        f"{'a' if pipeline.stream else 'no'} stream job, {len(pipeline.sync)} sync service(s) "
        f"with {n_sinks} sink(s)",
        highlight=False,
        soft_wrap=True,
    )
    for note in left_to_check(pipeline):
        out.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)


@app.command()
def check(config: ConfigArg) -> None:
    """Connect to every system the config names, read-only, and say what fails and what to do.

    Then check the stream job and the sinks against the writer schemas in the schema topic
    (what ``validate`` leaves to it), each problem as ``file:line: path: message``.
    """
    from threes.check import run_checks

    pipeline = load(config)

    def show(r) -> None:  # one line per system, as it is known
        from rich.markup import escape

        status = "[green]ok[/green]    " if r.ok else "[red]FAILED[/red]"
        hint = f" → {r.hint}" if not r.ok and r.hint else ""
        # details quote config paths and lists ([...]): printed as they are, not read as markup
        out.print(f"{status} {escape(f'{r.system} {r.target}: {r.detail}{hint}')}", highlight=False,
                  soft_wrap=True, markup=True)

    try:
        results = run_checks(pipeline, show, config)
    except ThreesError as exc:
        raise fail(exc) from None
    failed = [r for r in results if not r.ok]
    if failed:
        raise fail(ThreesError(f"{len(failed)} of {len(results)} check(s) failed"))


@app.command()
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write to this file")] = None,
) -> None:
    """Print the JSON Schema of connector config YAML (for editors: yaml-language-server)."""
    from threes.config import pipeline_model

    text = json.dumps(pipeline_model().model_json_schema(), indent=2)
    if output:
        output.write_text(text + "\n")
        console.print(f"wrote {output}")
    else:
        print(text)


@app.command()
def query(
    config: ConfigArg,
    snapshot: Annotated[str, typer.Argument(help="the snapshot's name (stream.snapshots[].name)")],
    key: Annotated[list[str], typer.Argument(help="the key: its value, or field=value per field of a composite key")],
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="the version valid at this time (ISO-8601 or epoch ms; needs "
                                                 "retention)")
    ] = None,
) -> None:
    """Print one key of a snapshot as JSON without a running job (newest checkpoint plus the topics' tail).

    Exit 0 found, 1 no such key, 2 a bad query (unknown snapshot, malformed key or time), 3 not queryable now.
    """
    from threes.stream import query_snapshot

    query_snapshot(config, snapshot, key, as_of)


def _mount_subcommands() -> None:
    # Each part owns its command group; the modules import their heavy
    # libraries (pyspark, clients) inside the commands, so `threes --help` stays fast.
    from threes import serve, status
    from threes.ctl import ctl_app
    from threes.demo import cli as demo
    from threes.dlq import dlq_app
    from threes.iceberg import iceberg_app
    from threes.local.cli import local_app
    from threes.pipeline import cli as pipeline
    from threes.source import offsets_app, source_app
    from threes.stream import stream_cli
    from threes.sync import sync_app

    app.add_typer(local_app, name="local", help="Install, start and stop the native local stack.")
    app.add_typer(source_app, name="source")
    app.add_typer(offsets_app, name="offsets")
    app.add_typer(stream_cli, name="stream")
    app.add_typer(sync_app, name="sync")
    app.add_typer(dlq_app, name="dlq")
    app.add_typer(iceberg_app, name="iceberg")
    app.add_typer(ctl_app, name="ctl")
    status.register(app)  # status
    serve.register(app)  # serve
    demo.register(app)  # replay, demo, docs
    pipeline.register(app)  # run


_mount_subcommands()


def run() -> None:
    """Console-script entry point: any error of threes ends as one clear red line, exit 1.

    Commands raise :class:`~kernel.exceptions.ThreesError` subclasses freely;
    this is the one place they become output (``--debug`` shows the traceback).
    A crash inside a native library (librdkafka, the JVM bridge) prints every thread's Python
    stack to stderr (a part's log under ``threes run``) before the process ends, not a bare
    exit code (:mod:`faulthandler`). ``SIGUSR1`` prints the same stacks and the process goes on
    (``kill -USR1 <pid>`` on a part that seems to hang says where each of its threads waits).
    """
    import faulthandler
    import signal

    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        app()
    except ThreesError as exc:
        if "--debug" in sys.argv:
            raise
        raise SystemExit(fail(exc).exit_code) from None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        raise SystemExit(130) from None


if __name__ == "__main__":  # pragma: no cover
    run()
