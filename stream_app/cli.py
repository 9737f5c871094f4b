"""``threes stream ...``: run the PySpark stream job."""

from __future__ import annotations

import typer

stream_app = typer.Typer(help="Run the PySpark stream job (enrich events against snapshots).", no_args_is_help=True)
