"""Config models of the RDS connectors (PostgreSQL, MySQL/MariaDB, SQLite via SQLAlchemy)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from connectors.config.models import SinkConnectorConfig, SourceConnectorConfig


class RdsSourceConfig(SourceConnectorConfig):
    """``rds_source``: a table (or query) into a compacted topic, keyed by primary key.

    Example::

        - name: airports
          type: rds_source
          connection: postgres
          topic: state.airports
          table: airports
          mode: timestamp
          timestamp_column: updated_at
    """

    implementation = "connectors.rds.source:RdsSource"
    connection_type = "rds"

    type: Literal["rds_source"]
    table: str | None = None
    schema_name: str | None = Field(None, description="database schema of the table")
    query: str | None = Field(None, description="custom SELECT, for mode: query")
    mode: Literal["bulk", "incrementing", "timestamp", "timestamp+incrementing", "query"] = "bulk"
    incrementing_column: str | None = None
    timestamp_column: str | None = None
    commit_delay_s: float = Field(
        5.0, ge=0, description="rows are read only once older than this; bounds late commits"
    )
    reconcile_interval_s: float = Field(
        300.0, gt=0, description="how often the key set is compared to emit tombstones for deletes"
    )

    @model_validator(mode="after")
    def _mode_needs(self) -> RdsSourceConfig:
        if self.mode == "query":
            if not self.query:
                raise ValueError("mode 'query' needs `query`")
        elif not self.table:
            raise ValueError(f"mode '{self.mode}' needs `table`")
        if "incrementing" in self.mode and not self.incrementing_column:
            raise ValueError(f"mode '{self.mode}' needs `incrementing_column`")
        if "timestamp" in self.mode and not self.timestamp_column:
            raise ValueError(f"mode '{self.mode}' needs `timestamp_column`")
        return self


class RdsSinkConfig(SinkConnectorConfig):
    """``rds_sink``: update topics into a table, conditional upsert by key and version."""

    implementation = "connectors.rds.sink:RdsSink"
    connection_type = "rds"

    type: Literal["rds_sink"]
    table: str
    schema_name: str | None = None
    key: list[str] = Field(min_length=1, description="primary key column(s)")
    version_column: str = Field("_version", description="column holding the applied version")
    create_table: bool = Field(False, description="create the table from the Avro schema if missing")
