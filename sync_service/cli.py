"""``threes sync ...``: run the sync service."""

from __future__ import annotations

import typer

sync_app = typer.Typer(help="Run the sync service (update topics to RDS, Elasticsearch, S3).", no_args_is_help=True)
