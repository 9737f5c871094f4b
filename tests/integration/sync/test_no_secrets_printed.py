"""A sync service whose config holds secrets (a URL's ``?password=``, an Elasticsearch host's userinfo, an S3
secret key): a grep of its logs at DEBUG and of its dead letter records finds none of them."""

from __future__ import annotations

import logging
from typing import Any

from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from kernel.redact import install_log_redaction
from sync_service.service import SyncService
from tests.integration.sync.helpers import (
    UpdateProducer,
    create_topic,
    group_lag,
    pipeline,
    read_topic,
    run_in_thread,
    wait_until,
)
from threes.testing.sink import item

ES_SECRET, S3_SECRET = "EsUserinfoSecret-4711", "S3SecretKey-4711"


def test_logs_and_dead_letters_hold_no_secret(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection,
                                              pg_engine: Any, es_conn: ElasticsearchConnection, es: Any, unique: str,
                                              caplog: Any) -> None:
    topic, dlq, table, index = f"updates.secret.{unique}", f"dlq.secret.{unique}", f"secret_{unique}", f"secret-{unique}"
    create_topic(kafka_conf, topic, 1)
    es.indices.create(index=index, mappings={"properties": {"qty": {"type": "short"}}})
    producer = UpdateProducer(kafka, topic)
    for key in range(50):
        value = {**item(key, 1), "qty": 100_000} if key == 7 else (
            {**item(key, 1), "name": "nul\x00inside"} if key == 9 else item(key, 1))
        producer.send(key, 1, value)
    producer.flush()
    es_host = es_conn.hosts[0].replace("://", f"://elastic:{ES_SECRET}@")
    pg_url = pg.url + ("&" if "?" in pg.url else "?") + f"password={pg.password.get_secret_value()}"
    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg_url},
                         "es": {"type": "elasticsearch", "hosts": [es_host]},
                         "s3": {"type": "s3", "endpoint_url": "http://127.0.0.1:1", "access_key_id": "k",
                                "secret_access_key": S3_SECRET}},
                 [{"name": f"secret-{unique}", "dead_letter_topic": dlq, "batch": {"max_age_ms": 200},
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"], "create_table": True},
                             {"name": "search", "type": "elasticsearch_sink", "connection": "es",
                              "topics": [topic], "index": index}]}])
    assert ES_SECRET not in repr(p) and S3_SECRET not in repr(p)
    caplog.set_level(logging.DEBUG)
    install_log_redaction()  # as the CLI does: pytest's capture handler hangs off the root logger
    logging.getLogger("threes.test").info("connecting to %s with %s", es_host, S3_SECRET)  # a careless line
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        group = p.sync[0].consumer_group()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 60, "lag back to 0")
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    letters = read_topic(kafka_conf, dlq, 2)
    assert len(letters) == 2
    dumped = "\n".join(
        f"{m.key()!r} {m.value()!r} " + " ".join(f"{k}={v!r}" for k, v in m.headers() or []) for m in letters
    )
    logs = caplog.text
    assert "connecting to" in logs and len(logs.splitlines()) > 10
    for secret in (ES_SECRET, S3_SECRET):
        assert secret not in logs, secret
        assert secret not in dumped, secret
    with pg_engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text(f'DROP TABLE IF EXISTS "{table}", "{table}__deleted"'))
    es.indices.delete(index=index)
