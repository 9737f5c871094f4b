"""``threes source ...`` and ``threes offsets ...``: run sources, inspect and reset their positions."""

from __future__ import annotations

import typer

source_app = typer.Typer(help="Run source connectors into compacted topics.", no_args_is_help=True)
offsets_app = typer.Typer(help="Show and reset source positions (the offsets topic).", no_args_is_help=True)
