"""What every ``threes`` command shares: its two consoles, the config argument, errors for a person.

Kept apart from :mod:`threes.cli`, which assembles the app from the command modules: those
modules import these, and the app imports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kernel.exceptions import ConfigError

console = Console(stderr=True)
out = Console()

ConfigArg = Annotated[Path, typer.Argument(help="connector config YAML", show_default=False)]


def fail(exc: BaseException, code: int = 1) -> typer.Exit:
    """Print an error of threes for a person and return the ``Exit`` to raise."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            console.print(f"[red]error[/red] {problem}", highlight=False, soft_wrap=True)
        console.print(f"[red]{len(exc.problems)} problem(s)[/red]", highlight=False)
    else:
        console.print(f"[red]error[/red] {exc}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def load(config: Path):  # returns the dynamic pipeline model
    """Load a pipeline for a command, turning config errors into a clean exit."""
    from threes.config import load_pipeline

    try:
        return load_pipeline(config)
    except ConfigError as exc:
        raise fail(exc) from None
