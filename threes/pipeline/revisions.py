"""The config revision of each part of a run: which parts a new YAML revision changes.

A part's revision is a digest of the config sections its process reads: ``kafka``,
``connections`` and ``schemas``-level settings every part shares, plus ``sources`` for
the sources, ``stream`` (and the sources, whose topics it joins) for the stream job,
``sync`` for the sync services. ``PUT /pipeline`` restarts only the parts whose revision
changed. The digest covers secret values (a rotated password is a change) but shows
only 12 hex digits of SHA-256: nothing of a secret can be read from it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretBytes, SecretStr

PART_SECTIONS: dict[str, tuple[str, ...]] = {
    "sources": ("sources",),
    "stream": ("stream", "sources"),
    "sync": ("sync",),
}
"""The sections each part reads besides those every part reads (every other top-level key)."""


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data, secrets unwrapped (only ever hashed)."""
    if isinstance(value, BaseModel):
        return {k: _plain(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, (SecretStr, SecretBytes)):
        return str(value.get_secret_value())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def part_revisions(pipeline: Any) -> dict[str, str]:
    """Part name -> the revision of its config (12 hex digits).

    Args:
        pipeline: a validated pipeline model.

    Returns:
        ``{"sources": ..., "stream": ..., "sync": ...}``.
    """
    data = _plain(pipeline)
    own = {name for sections in PART_SECTIONS.values() for name in sections}
    shared = {k: v for k, v in data.items() if k not in own}
    out: dict[str, str] = {}
    for part, sections in PART_SECTIONS.items():
        doc = {"shared": shared, **{name: data.get(name) for name in sections}}
        text = json.dumps(doc, sort_keys=True, default=str)
        out[part] = hashlib.sha256(text.encode()).hexdigest()[:12]
    return out


def changed_parts(old: Any, new: Any) -> list[str]:
    """The parts whose config differs between two revisions of a pipeline, in start order."""
    before, after = part_revisions(old), part_revisions(new)
    return [part for part in PART_SECTIONS if before[part] != after[part]]
