"""``threes local``: start, stop and inspect the project-local services."""

from __future__ import annotations

import logging
import shlex
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from .common import LocalStackError
from .stack import SERVICES, LocalStack

local_app = typer.Typer(
    help="Run Kafka, PostgreSQL, Elasticsearch, S3 and MariaDB locally (no Docker), "
    "with everything under ./.threes (or $THREES_HOME).",
    no_args_is_help=True,
)

_console = Console()
_errors = Console(stderr=True)


def _setup_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        handler = RichHandler(console=_errors, show_path=False, show_time=True)
        logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler])
    logging.getLogger("threes.local").setLevel(logging.INFO)
    for noisy in ("elastic_transport", "botocore", "urllib3", "boto3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(exc: LocalStackError) -> typer.Exit:
    """Print ``exc`` as one line (``--debug``: its traceback first); called inside its ``except``."""
    if "--debug" in sys.argv:
        from kernel.redact import redact

        sys.stderr.write(redact(traceback.format_exc()))  # as threes.cli's hook: secrets masked
    _errors.print(f"[red]error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


ServiceOption = Annotated[
    list[str] | None,
    typer.Option("--service", "-s", help=f"Only these services ({', '.join(SERVICES)})."),
]
"""``--service``/``-s``, repeatable: the services a command acts on (all when absent)."""


@local_app.command()
def up(
    service: ServiceOption = None,
    brokers: Annotated[
        int | None,
        typer.Option(
            "--brokers",
            min=1,
            max=9,
            help="Kafka brokers, each also a KRaft controller (default: as recorded, 1 on a new stack); "
            "a new number formats new Kafka storage and needs Kafka down.",
        ),
    ] = None,
    kafka_port: Annotated[
        int | None,
        typer.Option(
            "--kafka-port",
            help="PLAINTEXT port of the first broker; broker n uses port + 10*(n-1) .. +2 (default 19092).",
        ),
    ] = None,
) -> None:
    """Install what is missing, start what is down and wait until healthy."""
    _setup_logging()
    stack = LocalStack()
    try:
        stack.up(service or None, brokers=brokers, kafka_port=kafka_port)
    except LocalStackError as exc:
        raise _fail(exc) from None
    _print_status(stack)


@local_app.command()
def down(
    service: ServiceOption = None,
) -> None:
    """Stop the services this project started."""
    _setup_logging()
    try:
        LocalStack().down(service or None)
    except LocalStackError as exc:
        raise _fail(exc) from None


@local_app.command()
def status() -> None:
    """Show each service: running, address, pid, since and log."""
    try:
        _print_status(LocalStack())
    except LocalStackError as exc:
        raise _fail(exc) from None


@local_app.command()
def env() -> None:
    """Print export THREES_...=... lines for the endpoints (use with eval).

    A stack started from another folder is found by its ports; without its CA file (not
    known here) the SASL_SSL lines are left out and a note on stderr says so.
    """
    try:
        endpoints = LocalStack().endpoints()
    except LocalStackError as exc:
        raise _fail(exc) from None
    values = endpoints.as_env()
    if not endpoints.tls_ca_location:
        for var in ("THREES_KAFKA_SASL_BOOTSTRAP", "THREES_KAFKA_SASL_USERNAME", "THREES_KAFKA_SASL_PASSWORD"):
            values.pop(var, None)
        _errors.print(
            "note: Kafka runs from another folder whose CA file is not known here: set THREES_TLS_CA to its "
            ".threes/tls/ca.pem for the SASL_SSL listener (THREES_KAFKA_SASL_*)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for var, value in values.items():
        typer.echo(f"export {var}={shlex.quote(value)}")


def _print_status(stack: LocalStack) -> None:
    table = Table(title=f"local stack ({stack.home})")
    for column in ("service", "running", "address", "pid", "since", "log"):
        table.add_column(column, overflow="fold", no_wrap=column in ("service", "pid", "since"))
    problems = []
    for st in stack.status():
        running = "[green]yes[/green]" if st.running else "[red]no[/red]"
        if st.external:
            running += " (external)"
        elif st.elsewhere:
            running += f" (started in {st.started_in})" if st.started_in else " (started elsewhere)"
        elif st.problem:
            running = "[red]port held[/red]"
            problems.append(f"{st.name}: {st.problem}")
        since = st.since.astimezone().strftime("%Y-%m-%d %H:%M:%S") if st.since else "-"
        table.add_row(
            st.name,
            running,
            st.address,
            str(st.pid or "-"),
            since,
            _short_path(st.log_path) if st.log_path else "-",
        )
    _console.print(table)
    for line in problems:
        _errors.print(f"[red]error:[/red] {escape(line)}", markup=True, highlight=False, soft_wrap=True)


def _short_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    local_app()
