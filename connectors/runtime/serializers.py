"""A source task's serializers: schema evolution checked, key and value serializers, the columnar encoder."""

from __future__ import annotations

import logging

from connectors.api.source import SourceSchemas
from connectors.runtime.columnar import ColumnarEncoder, ColumnarUnsupported
from connectors.runtime.runner_state import RunnerState
from kernel.kafka.topics import recent_keys
from schemas.evolution import TopicSchemaPlan, plan_topic_schemas
from schemas.serde import AvroSerializer

# the runner's log lines keep the logger name they always had
log = logging.getLogger("connectors.runtime.worker")


class TopicSerializers(RunnerState):
    """The topic's schema plan and serializers (a mixin of ``TaskRunner``)."""

    def _plan_schemas(self, schemas: SourceSchemas) -> TopicSchemaPlan:
        """Schema evolution, checked before anything is produced (:func:`schemas.evolution.plan_topic_schemas`)."""
        cfg = self.config
        kconf = self.kafka.librdkafka_config()
        return plan_topic_schemas(
            self.schema_store,
            topic=cfg.topic,
            connector=cfg.name,
            key_schema=schemas.key,
            value_schema=schemas.value,
            compatibility=cfg.topic_spec.compatibility,
            rekey=cfg.rekey,
            tasks=self.task_count,
            topic_keys=lambda: recent_keys(kconf, cfg.topic, timeout_s=self.kafka.request_timeout_s),
        )

    def _serializers(self, schemas: SourceSchemas, plan: TopicSchemaPlan) -> None:
        """The key and value serializers of the topic's schemas, and the columnar encoder when it can write them."""
        self._value_schema = schemas.value
        self._key_names = [f["name"] for f in schemas.key.get("fields", [])]
        self.key_ser = AvroSerializer(schemas.key, self.schema_store, fp=plan.key_fingerprint)
        self.value_ser = AvroSerializer(schemas.value, self.schema_store)
        try:
            self._columnar = ColumnarEncoder(
                schemas.value, self.value_ser.header, schemas.key, self.key_ser.header
            )
        except ColumnarUnsupported as exc:
            self._columnar = None
            log.debug("source=%s batches are encoded record by record: %s", self.config.name, exc)

