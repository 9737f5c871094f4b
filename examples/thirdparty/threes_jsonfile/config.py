"""The config models of the jsonfile connectors (the ``threes.connectors`` entry points name them)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from kernel.config.models import SinkConnectorConfig, SourceConnectorConfig


class JsonfileSourceConfig(SourceConnectorConfig):
    """``jsonfile_source``: the entities of the ``*.jsonl`` files under ``<root>/<path>``."""

    implementation: ClassVar[str] = "threes_jsonfile.source:JsonfileSource"
    connection_type: ClassVar[str] = "jsonfile"

    type: Literal["jsonfile_source"]
    path: str = Field("", description="sub-folder of the connection's root holding the *.jsonl files")

    @model_validator(mode="after")
    def _key_and_schema(self) -> JsonfileSourceConfig:
        if not self.key:
            raise ValueError("key: name the entity key field(s); JSON Lines files have no key of their own")
        if not self.value_schema:
            raise ValueError("value_schema: give the entities' Avro schema (.avsc); JSON carries no types")
        return self


class JsonfileSinkConfig(SinkConnectorConfig):
    """``jsonfile_sink``: one JSON file per key under ``<root>/<path>``."""

    implementation: ClassVar[str] = "threes_jsonfile.sink:JsonfileSink"
    connection_type: ClassVar[str] = "jsonfile"

    type: Literal["jsonfile_sink"]
    path: str = Field("", description="sub-folder of the connection's root the files are written to")
