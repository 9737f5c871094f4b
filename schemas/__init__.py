"""Avro schemas (``.avsc``) and the one serde every part of threes uses.

* :mod:`schemas.serde` - single-object encoding with fastavro.
* :mod:`schemas.store` - writer schemas in a compacted topic, keyed by fingerprint.
* :func:`load_schema` - an ``.avsc`` by path or by the name of one shipped here
  (``nycflights13/airports``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.exceptions import SchemaNotFoundError

SHIPPED = Path(__file__).parent


def load_schema(ref: str, base_dir: Path | None = None) -> dict[str, Any]:
    """Load an Avro schema by file path or shipped name.

    Args:
        ref: a path to an ``.avsc`` file (relative to ``base_dir``, else the
            current directory), or the name of a schema shipped in this package
            without the suffix, e.g. ``"nycflights13/airports"``.
        base_dir: where relative paths start (the config file's folder).

    Returns:
        The schema as parsed JSON (a dict for records).

    Raises:
        SchemaNotFoundError: neither a readable file nor a shipped schema, or not JSON.
    """
    candidates = [Path(ref)] if Path(ref).is_absolute() else [(base_dir or Path.cwd()) / ref]
    if not Path(ref).is_absolute():  # a shipped name is relative; an absolute path is only itself
        candidates.append(SHIPPED / (ref if ref.endswith(".avsc") else f"{ref}.avsc"))
    for path in dict.fromkeys(candidates):
        if path.is_file():
            try:
                schema: dict[str, Any] = json.loads(path.read_text())
                return schema
            except json.JSONDecodeError as exc:
                raise SchemaNotFoundError(f"{path} is not valid JSON: {exc}") from exc
    raise SchemaNotFoundError(
        f"Avro schema {ref!r} not found (looked at {', '.join(str(c) for c in dict.fromkeys(candidates))})"
    )
