"""Config models of the Elasticsearch connectors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernel.config.fields import ConfigPath
from kernel.config.models import SinkConnectorConfig, SourceConnectorConfig


class ElasticsearchSourceConfig(SourceConnectorConfig):
    """``elasticsearch_source``: an index into a compacted topic, keyed by ``_id``.

    ``incremental`` reads the documents whose ``updated_field`` moved (a ``date``
    or numeric epoch-milliseconds field the writers set), ``snapshot`` re-reads
    the whole index every ``snapshot_interval_s``. Without ``value_schema`` the
    Avro schema is derived from the index mapping.

    Example::

        - name: planes
          type: elasticsearch_source
          connection: elasticsearch
          topic: state.planes
          index: planes
          mode: incremental
          updated_field: updated_at
    """

    implementation = "connectors.elasticsearch.source:ElasticsearchSource"
    connection_type = "elasticsearch"

    type: Literal["elasticsearch_source"]
    index: str
    mode: Literal["incremental", "snapshot"] = "snapshot"
    updated_field: str | None = Field(None, description="field for incremental reads")
    page_size: int = Field(1_000, ge=1, le=10_000)
    snapshot_interval_s: float = Field(300.0, gt=0)
    commit_delay_s: float = Field(
        5.0,
        ge=0,
        description="incremental: read documents only once updated_field is this old "
        "(covers refresh_interval and writers' clocks)",
    )
    reconcile_interval_s: float | None = Field(
        300.0, gt=0, description="incremental: how often the _id set is compared to emit tombstones; null: never"
    )

    @model_validator(mode="after")
    def _incremental_needs_field(self) -> ElasticsearchSourceConfig:
        if self.mode == "incremental" and not self.updated_field:
            raise ValueError("mode 'incremental' needs `updated_field`")
        return self

    @model_validator(mode="after")
    def _keyed_by_id(self) -> ElasticsearchSourceConfig:
        # The record key is the document _id: reconciliation compares _id sets, and
        # a field of _source is not unique in Elasticsearch. Refuse rather than ignore.
        if self.key is not None and self.key != ["_id"]:
            raise ValueError(
                f"`key` {self.key} is not supported: elasticsearch_source keys records by the document _id "
                "(index documents with the entity key as _id; a key schema may alias _id to another name)"
            )
        return self


class ElasticsearchSinkConfig(SinkConnectorConfig):
    """``elasticsearch_sink``: update topics into an index, ``_id`` = key, external versioning.

    Example::

        - name: flights-search
          type: elasticsearch_sink
          connection: elasticsearch
          topics: [updates.flights]
          index: flights
    """

    implementation = "connectors.elasticsearch.sink:ElasticsearchSink"
    connection_type = "elasticsearch"

    type: Literal["elasticsearch_sink"]
    index: str
    create_index: bool = Field(
        True,
        description="create a missing index before the first document, with mappings from the update's Avro value "
        "schema (connectors/elasticsearch/mapping.py); false: the cluster's dynamic mapping or an index template",
    )
    string_mapping: Literal["keyword", "text", "text_and_keyword"] = Field(
        "keyword", description="mapping of Avro strings in a created index (text_and_keyword: text + .keyword)"
    )
    decimal_mapping: Literal["scaled_float", "double", "keyword"] = Field(
        "scaled_float",
        description="mapping of Avro decimals in a created index (scaled_float: factor 10^scale). scaled_float "
        "needs the mapper-extras module: a cluster without it (the local stack's minimal Elasticsearch) gets "
        "double instead, with a warning; keyword keeps every digit",
    )
    mapping_file: ConfigPath | None = Field(
        None,
        description="JSON mappings (relative to the config file's folder) over the derived ones: its properties "
        "replace the derived field by field, its other keys (dynamic, _source...) are added",
    )
    max_concurrency: int = Field(4, ge=1, le=64, description="upper bound of parallel bulk requests")
    chunk_records: int = Field(500, ge=1, le=100_000, description="actions per bulk request")
    chunk_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="bytes per bulk request")
    item_retries: int = Field(5, ge=0, description="retries of items answered 429 within one bulk write")
