"""The field types and base model of every config model: names, topic names, paths, schema references.

A relative path in a config starts at the config file's folder (:func:`resolve_config_path`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=200)]
TopicName = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+$", max_length=249)]


def resolve_config_path(ref: str, info: ValidationInfo) -> str:
    """One rule for relative paths in a config: they start at the config file's folder.

    The loader passes the folder as validation context (``base_dir``); a relative
    path becomes absolute there, so sources, the stream job, sync services and
    ``threes validate`` read the same file whatever the working directory. A
    name of a schema shipped with threes (``nycflights13/airport``) stays a name
    when the config's folder has no such file.

    Args:
        ref: the value as written.
        info: pydantic's validation info (``context["base_dir"]`` when loaded from a file).

    Returns:
        An absolute path, or ``ref`` unchanged (absolute already, a shipped name,
        or validated without a config file).
    """
    base = (info.context or {}).get("base_dir") if info.context is not None else None
    path = Path(ref).expanduser()
    if base is None or path.is_absolute():
        return str(path) if path.is_absolute() else ref
    local = Path(base) / path
    if not local.exists():
        from schemas import SHIPPED

        if (SHIPPED / (ref if ref.endswith(".avsc") else f"{ref}.avsc")).is_file():
            return ref
    return str(local.resolve())


SchemaRef = Annotated[str, AfterValidator(resolve_config_path)]
"""An Avro schema: a ``.avsc`` path (relative to the config file's folder) or the name of a shipped schema."""
ConfigPath = Annotated[str, AfterValidator(resolve_config_path)]
"""A file path in a config, relative to the config file's folder."""


class StrictModel(BaseModel):
    """Base of every config model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


WireFormat = Literal["avro", "confluent_avro"]
"""How a topic's keys or values are framed: ``avro`` is threes' own Avro single-object encoding (writer
schemas in ``kafka.schema_topic``); ``confluent_avro`` is Confluent's wire format (magic byte, 4-byte schema
id) with writer schemas in ``kafka.schema_registry``."""

