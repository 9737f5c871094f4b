"""The Flink SQL side of ``asof_vs_flink.py``: an event-time temporal join, run with PyFlink.

Runs in PyFlink's own virtualenv, never the project's (see ``asof_vs_flink.py`` for the set-up);
imports only PyFlink, confluent-kafka and the standard library. Usage::

    /work/venv-flink/bin/python benchmarks/flink_temporal_join.py --bootstrap 127.0.0.1:19092 \\
        --ref REF_TOPIC --events EVENTS_TOPIC --out OUT_TOPIC --expected N --jars A.jar,B.jar

The SQL is Flink's documented event-time temporal join (``FOR SYSTEM_TIME AS OF``): the
reference topic as an ``upsert-kafka`` versioned table (its row time ``updated_ms``, watermark
equal to it), the events as a ``kafka`` table with a watermark 1 s behind ``ts``, a ``LEFT JOIN``
on ``fk = k``, written to ``OUT_TOPIC`` in Flink's ``avro`` format. Both topics hold Avro
single-object encoding (``C3 01``, the 8-byte CRC-64-AVRO fingerprint, then the body) as threes
and the Kafka Streams reference write it. Flink's ``avro`` format reads a bare body, so each table
declares two leading columns that consume the 10-byte header with Avro's own encodings: ``hdr INT``
(``C3 01`` is one zig-zag varint) and ``fp DOUBLE`` (8 fixed bytes); every column is ``NOT NULL`` so
the schema Flink derives has no unions, i.e. it is the writer schema with the header in front.

The reference source never ends (a versioned table is live); Flink emits a temporal join's rows
once the watermarks of both sides pass, so ``table.exec.source.idle-timeout`` (5 s) lets the idle
reference source stop holding the watermark back, as in the anchor. The events source is bounded
(``scan.bounded.mode=latest-offset``). The driver polls the output's end offsets every second,
cancels the job once ``--expected`` rows are there (or ``--max-s`` passed) and prints one JSON line:
``t_submit`` (epoch s), ``t_done``, ``status``, ``rows``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def end_count(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (the sum of its partitions' high watermarks)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench_peers_flink_probe", "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts)
    finally:
        c.close()


def statements(a: argparse.Namespace) -> list[str]:
    """The DDL of the three tables and the ``INSERT`` of the join."""
    kafka = f"'properties.bootstrap.servers' = '{a.bootstrap}'"
    return [
        f"""CREATE TABLE ev (
  hdr INT NOT NULL, fp DOUBLE NOT NULL,
  eid BIGINT NOT NULL, fk STRING NOT NULL, amount DOUBLE NOT NULL, ts BIGINT NOT NULL,
  ts_time AS TO_TIMESTAMP_LTZ(ts, 3),
  WATERMARK FOR ts_time AS ts_time - INTERVAL '1' SECOND
) WITH (
  'connector' = 'kafka', 'topic' = '{a.events}', {kafka}, 'properties.group.id' = '{a.group}_ev',
  'scan.startup.mode' = 'earliest-offset', 'scan.bounded.mode' = 'latest-offset', 'format' = 'avro'
)""",
        f"""CREATE TABLE `ref` (
  k STRING NOT NULL,
  hdr INT NOT NULL, fp DOUBLE NOT NULL,
  name STRING NOT NULL, category STRING NOT NULL, score DOUBLE NOT NULL, updated_ms BIGINT NOT NULL,
  upd_time AS TO_TIMESTAMP_LTZ(updated_ms, 3),
  WATERMARK FOR upd_time AS upd_time,
  PRIMARY KEY (k) NOT ENFORCED
) WITH (
  'connector' = 'upsert-kafka', 'topic' = '{a.ref}', {kafka}, 'properties.group.id' = '{a.group}_ref',
  'key.format' = 'raw', 'value.format' = 'avro', 'value.fields-include' = 'EXCEPT_KEY'
)""",
        f"""CREATE TABLE out_t (
  eid BIGINT NOT NULL, fk STRING NOT NULL, amount DOUBLE NOT NULL, ts BIGINT NOT NULL,
  ref_name STRING, ref_category STRING, ref_score DOUBLE, ref_updated_ms BIGINT
) WITH ('connector' = 'kafka', 'topic' = '{a.out}', {kafka}, 'format' = 'avro')""",
        """INSERT INTO out_t
SELECT e.eid, e.fk, e.amount, e.ts, r.name, r.category, r.score, r.updated_ms
FROM ev AS e
LEFT JOIN `ref` FOR SYSTEM_TIME AS OF e.ts_time AS r
ON e.fk = r.k""",
    ]


def main() -> int:
    """Submit the join, wait for ``--expected`` output rows, cancel, print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--expected", type=int, required=True)
    p.add_argument("--jars", required=True, help="comma-separated: the Kafka SQL connector and flink-sql-avro")
    p.add_argument("--group", default="bench_peers_flink")
    p.add_argument("--parallelism", default="2")
    p.add_argument("--idle-timeout", default="5 s")
    p.add_argument("--max-s", type=float, default=540)
    a = p.parse_args()

    from pyflink.table import EnvironmentSettings, TableEnvironment

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    cfg = t_env.get_config()
    cfg.set("pipeline.jars", ";".join(f"file://{j}" for j in a.jars.split(",")))
    cfg.set("parallelism.default", a.parallelism)
    cfg.set("table.exec.source.idle-timeout", a.idle_timeout)
    cfg.set("pipeline.name", a.group)
    *ddl, insert = statements(a)
    for stmt in ddl:
        t_env.execute_sql(stmt)
    t_submit = time.time()
    job = t_env.execute_sql(insert).get_job_client()
    print(f"submitted {job.get_job_id()}", file=sys.stderr, flush=True)
    rows, status = 0, ""
    while time.time() - t_submit < a.max_s:
        time.sleep(1.0)
        rows = end_count(a.bootstrap, a.out)
        status = str(job.get_job_status().result())
        if rows >= a.expected or any(s in status for s in ("FINISHED", "FAILED", "CANCELED")):
            break
    t_done = time.time()
    if "RUNNING" in str(job.get_job_status().result()):
        job.cancel().result()
    print(json.dumps({"t_submit": t_submit, "t_done": t_done, "status": status, "rows": rows}), flush=True)
    return 0 if rows >= a.expected else 1


if __name__ == "__main__":
    sys.exit(main())
