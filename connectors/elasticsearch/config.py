"""Config models of the Elasticsearch connectors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from connectors.config.models import SinkConnectorConfig, SourceConnectorConfig


class ElasticsearchSourceConfig(SourceConnectorConfig):
    """``elasticsearch_source``: an index into a compacted topic, keyed by ``_id``.

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
    reconcile_interval_s: float = Field(300.0, gt=0)


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
    max_concurrency: int = Field(4, ge=1, le=64, description="upper bound of parallel bulk requests")
    chunk_records: int = Field(500, ge=1, le=100_000, description="actions per bulk request")
    chunk_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="bytes per bulk request")
    item_retries: int = Field(5, ge=0, description="retries of items answered 429 within one bulk write")
