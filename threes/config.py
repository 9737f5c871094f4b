"""The pipeline document: Kafka, connections, sources, the stream job, sync services.

The whole connector config YAML a user writes, loaded in one place. The source and sink
entries are discriminated unions over the connector config models found in the registry
(:mod:`connectors.registry`), so a third-party connector gets the same validation, errors and
JSON Schema as a built-in one. Each part owns its own section's model: the stream job
(:mod:`stream_app.config`), the sync services (:mod:`sync_service.config`), the connectors
(:mod:`kernel.config.models` and each technology's ``config``).

Typical use::

    from threes.config import load_pipeline
    pipeline = load_pipeline("examples/pipeline.yaml")   # raises ConfigError
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from types import GenericAlias
from typing import Annotated, Any, Literal, Union

from pydantic import Field, create_model

from connectors import registry
from kernel.config.fields import Name, StrictModel
from kernel.config.loader import load_yaml_model, validate_data
from kernel.config.models import ConnectionConfig, ConnectorConfig, KafkaConfig, SourceConnectorConfig
from stream_app.config import StreamJobConfig
from sync_service.config import SyncServiceBase


def _union(models: list[type[ConnectorConfig]] | list[type[ConnectionConfig]]) -> Any:
    if not models:
        return Annotated[dict[str, Any], Field(max_length=0)]  # nothing registered: accept none
    if len(models) == 1:
        return models[0]
    return Annotated[Union[tuple(models)], Field(discriminator="type")]  # noqa: UP007


class PipelineBase(StrictModel):
    """A whole pipeline; the concrete model adds the registered source/sink unions."""

    version: Literal[1] = 1
    kafka: KafkaConfig
    connections: dict[Name, ConnectionConfig] = Field(default_factory=dict)
    stream: StreamJobConfig | None = None
    # narrowed by pipeline_model() to the registered connectors' discriminated unions
    sources: list[SourceConnectorConfig] = Field(default_factory=list)
    sync: list[SyncServiceBase] = Field(default_factory=list)

    def reference_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Check the references between entries (run by the loader after field validation).

        Returns:
            ``(key path, message)`` for every connector naming a missing connection
            or one of the wrong type, every duplicated name, and every ``confluent_avro``
            topic without ``kafka.schema_registry``.
        """
        problems: list[tuple[tuple[str | int, ...], str]] = []
        connectors: list[tuple[tuple[str | int, ...], ConnectorConfig]] = [
            (("sources", i), s) for i, s in enumerate(self.sources)
        ]
        for i, svc in enumerate(self.sync):
            connectors += [(("sync", i, "sinks", j), s) for j, s in enumerate(svc.sinks)]
        seen: dict[str, tuple[str | int, ...]] = {}
        for where, c in connectors:
            conn = self.connections.get(c.connection)
            if conn is None:
                problems.append(
                    ((*where, "connection"), f"no connection named {c.connection!r} (have: {sorted(self.connections)})")
                )
            elif conn.type != c.connection_type:
                problems.append(
                    (
                        (*where, "connection"),
                        f"{c.type} needs a connection of type {c.connection_type!r}, "
                        f"{c.connection!r} is {conn.type!r}",
                    )
                )
            if c.name in seen:
                problems.append(((*where, "name"), f"{c.name!r} is already the name of another connector"))
            seen[c.name] = where
        if self.kafka.schema_registry is None:
            for i, source in enumerate(self.sources):
                for field in ("key_format", "value_format"):
                    if getattr(source, field, "avro") == "confluent_avro":
                        problems.append((("sources", i, field),
                                         "confluent_avro needs kafka.schema_registry (the registry's url)"))
            if self.stream is not None:
                if self.stream.events.value_format == "confluent_avro":
                    problems.append((("stream", "events", "value_format"),
                                     "confluent_avro needs kafka.schema_registry (the registry's url)"))
                for i, snap in enumerate(self.stream.snapshots):
                    for field in snap.registry_formats:
                        problems.append((("stream", "snapshots", i, field),
                                         "confluent_avro needs kafka.schema_registry (the registry's url)"))
        names: set[str] = set()
        for i, svc in enumerate(self.sync):
            if svc.name in names:
                problems.append((("sync", i, "name"), f"sync service {svc.name!r} is declared twice"))
            names.add(svc.name)
        return problems

    def connection(self, name: str) -> Any:
        """Return the connection called ``name`` (a validated reference; its technology's model)."""
        return self.connections[name]


@functools.cache
def pipeline_model() -> type[PipelineBase]:
    """Build the pipeline model from the connectors in the registry.

    Returns:
        A pydantic model class with ``connections``, ``sources`` and ``sync[].sinks`` typed as
        discriminated unions (on ``type``) of the registered connection and connector config models.
    """
    connection = _union(list(registry.connection_models().values()))
    source = _union(registry.models_for("source"))
    sink = _union(registry.models_for("sink"))
    # GenericAlias(list, x) is list[x]: the item types are built at run time, which a type checker cannot read
    sync_fields: dict[str, Any] = {"sinks": (GenericAlias(list, sink), Field(min_length=1))}
    sync_model = create_model("SyncServiceConfig", __base__=SyncServiceBase, **sync_fields)
    fields: dict[str, Any] = {
        "connections": (GenericAlias(dict, (Name, connection)), Field(default_factory=dict)),
        "sources": (GenericAlias(list, source), Field(default_factory=list)),
        "sync": (GenericAlias(list, sync_model), Field(default_factory=list)),
    }
    return create_model("Pipeline", __base__=PipelineBase, **fields)


def load_pipeline(path: str | Path, *, environ: Mapping[str, str] | None = None) -> PipelineBase:
    """Load and validate a pipeline YAML file.

    Args:
        path: the connector config YAML.
        environ: variables for ``${env:NAME}``; ``os.environ`` when ``None``.

    Returns:
        The validated pipeline (an instance of :func:`pipeline_model`).

    Raises:
        ConfigError: every problem, each as ``file:line: key.path: message``.
    """
    return load_yaml_model(pipeline_model(), path, environ=environ)


def pipeline_from_dict(data: dict[str, Any], *, environ: Mapping[str, str] | None = None) -> PipelineBase:
    """Validate a pipeline given as a dict (tests, programmatic use).

    Raises:
        ConfigError: every problem, each with its key path.
    """
    return validate_data(pipeline_model(), data, environ=environ)


__all__ = ["PipelineBase", "load_pipeline", "pipeline_from_dict", "pipeline_model"]
