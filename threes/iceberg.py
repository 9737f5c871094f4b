"""``threes iceberg expire|compact CONFIG``: maintenance of the tables of the config's iceberg sinks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kernel.exceptions import ThreesError
from kernel.redact import redact
from threes.console import ConfigArg, fail, load, out

iceberg_app = typer.Typer(
    help="Maintain the Iceberg tables of the config's iceberg_sinks (snapshots, small files).", no_args_is_help=True
)

SinkOpt = Annotated[
    list[str] | None,
    typer.Option("--sink", "-s", help="only this sink's table (repeatable); default: every iceberg_sink"),
]


def _tables(config: Path, sinks: list[str] | None) -> list[tuple[str, Any]]:
    """``(sink name, pyiceberg Table)`` of each chosen ``iceberg_sink`` of the config."""
    from connectors.iceberg.config import IcebergSinkConfig
    from connectors.iceberg.connection import load_catalog

    pipeline = load(config)
    chosen = [
        s
        for svc in pipeline.sync
        for s in svc.sinks
        if isinstance(s, IcebergSinkConfig) and (not sinks or s.name in sinks)
    ]
    if not chosen:
        raise fail(ThreesError(f"{config} has no iceberg_sink{' named ' + ', '.join(sinks) if sinks else ''}"))
    out_tables = []
    for sink in chosen:
        try:
            catalog = load_catalog(pipeline.connections[sink.connection])
            out_tables.append((sink.name, catalog.load_table(sink.table)))
        except Exception as exc:  # unreachable catalog, missing table: one line each
            raise fail(
                ThreesError(
                    redact(
                        f"sink {sink.name!r}: cannot load table {sink.table}: {type(exc).__name__}: {exc}"
                    ).splitlines()[0]
                )
            ) from None
    return out_tables


@iceberg_app.command("expire")
def expire_cmd(
    config: ConfigArg,
    sink: SinkOpt = None,
    older_than_h: Annotated[
        float, typer.Option("--older-than-h", help="expire snapshots older than this, hours")
    ] = 24.0,
    retain_last: Annotated[int, typer.Option("--retain-last", help="always keep this many newest snapshots")] = 10,
) -> None:
    """Expire old snapshots (metadata; data files left for an orphan-file clean-up), keeping the sinks' offsets."""
    from connectors.iceberg.maintenance import expire

    for name, table in _tables(config, sink):
        try:
            result = expire(table, older_than_h * 3600.0, retain_last)
        except Exception as exc:
            raise fail(ThreesError(redact(f"sink {name!r}: expire failed: {type(exc).__name__}: {exc}"))) from None
        out.print(f"{name} {result.table}: {result.detail} ({result.before} -> {result.after})", highlight=False)


@iceberg_app.command("compact")
def compact_cmd(
    config: ConfigArg,
    sink: SinkOpt = None,
    min_files: Annotated[
        int, typer.Option("--min-files", help="compact only tables with at least this many data files")
    ] = 2,
) -> None:
    """Rewrite each table's small data files into big ones (whole table in memory; Spark for big tables)."""
    from connectors.iceberg.maintenance import compact

    for name, table in _tables(config, sink):
        try:
            result = compact(table, min_files=min_files)
        except Exception as exc:
            raise fail(ThreesError(redact(f"sink {name!r}: compact failed: {type(exc).__name__}: {exc}"))) from None
        out.print(f"{name} {result.table}: {result.detail}", highlight=False)
