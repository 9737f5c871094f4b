"""The pipeline's status document, gathered from Kafka and each process's endpoint (``threes status``).

Kafka holds what every part stores (committed offsets against high watermarks,
stored source positions, snapshot topics' end offsets); each running process
serves the part it knows live (``/status.json``, ``/metrics``). The shape is
:mod:`kernel.status.document`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kernel.status.document import fetch_json, fetch_text, iso_ms, now_iso

log = logging.getLogger(__name__)


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


def _merge_sources(stored: list[dict[str, Any]], live: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    by_task = {s["task"]: s for s in stored}
    for entry in live:
        base = by_task.get(entry["task"])
        if base is None:
            by_task[entry["task"]] = dict(entry)
            continue
        updated = base.get("position_updated_at")
        base.update({k: v for k, v in entry.items() if v is not None or k not in base})
        base["position_updated_at"] = updated
    return [by_task[k] for k in sorted(by_task)]


def _snapshot_metrics(text: str, job: str) -> dict[str, dict[str, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job") != job or "snapshot" not in sample.labels:
                continue
            if sample.name == "threes_stream_snapshot_keys":
                out.setdefault(sample.labels["snapshot"], {})["keys"] = sample.value
            elif sample.name == "threes_stream_snapshot_age_seconds":
                out.setdefault(sample.labels["snapshot"], {})["age_s"] = sample.value
    return out


class Gatherer:
    """Build the status document of a pipeline from Kafka and the processes' endpoints.

    Args:
        pipeline: the loaded pipeline (its sources, stream job, sync services).
        offsets_topic: the sources' offsets topic.
        host: where the processes whose ports the config names (``metrics_port``) run.
        endpoints: more process endpoints (base URLs, e.g. a source's ``--metrics-port``).
        timeout_s: per Kafka request and per HTTP request, seconds.
        token: bearer token sent to ``endpoints`` (the config's ports get their own ``metrics_token``).
    """

    def __init__(self, pipeline: Any, *, offsets_topic: str = "_threes_offsets", host: str = "127.0.0.1",
                 endpoints: Iterable[str] = (), timeout_s: float = 5.0, token: str | None = None):
        self.pipeline = pipeline
        self.token = token
        self.offsets_topic = offsets_topic
        self.host = host
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout_s = timeout_s

    # -- Kafka ------------------------------------------------------------------------------------

    def _consumer(self) -> Any:
        from kernel.kafka import clients

        return clients.kafka_consumer(self.pipeline.kafka, "threes-status", enable_auto_commit=False)

    def _stored_sources(self, consumer: Any) -> list[dict[str, Any]]:
        from connectors.runtime.offsets import OffsetStore
        from connectors.runtime.standalone import task_specs

        sources = list(getattr(self.pipeline, "sources", []))
        if not sources:
            return []
        stored: dict[str, Any] = {}
        # read-only: an offsets topic that does not exist yet means no position stored (it is not created here)
        if self.offsets_topic in consumer.list_topics(timeout=self.timeout_s).topics:
            store = OffsetStore(self.pipeline.kafka.librdkafka_config(), self.offsets_topic,
                                timeout_s=self.timeout_s)
            stored = store.load_all()
        out = []
        for spec in task_specs(sources):
            p = stored.get(spec.key)
            out.append({
                "connector": spec.config.name, "task": spec.key, "state": "unknown",
                "position": p.position if p else None, "position_updated_at": iso_ms(p.updated_ms) if p else None,
                "records_behind": None, "rows_read": None, "acked": None, "restarts": None, "last_error": None,
            })
        return out

    def _watermarks(self, consumer: Any, topics: Iterable[str]) -> dict[tuple[str, int], int]:
        from confluent_kafka import KafkaException, TopicPartition

        highs: dict[tuple[str, int], int] = {}
        for topic in sorted(set(topics)):
            try:
                meta = consumer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            except KafkaException as exc:
                log.warning("status: metadata of %s: %s", topic, exc)
                continue
            if meta is None or meta.error is not None:
                continue
            for p in sorted(meta.partitions):
                try:
                    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=self.timeout_s)
                except KafkaException as exc:
                    log.warning("status: end offset of %s[%d]: %s", topic, p, exc)
                    continue
                highs[(topic, p)] = int(high)
        return highs

    def _committed(self, group: str, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        from kernel.kafka import clients
        from kernel.kafka.topics import committed_offsets

        consumer = clients.kafka_consumer(self.pipeline.kafka, group)  # never subscribes: does not join
        try:
            return committed_offsets(consumer, tps, self.timeout_s)
        finally:
            consumer.close()

    # -- gather -----------------------------------------------------------------------------------

    def gather(self) -> dict[str, Any]:
        """The pipeline's status document (see the module docstring).

        Kafka must answer (offsets, watermarks); a process endpoint that does
        not answer is listed under ``endpoints`` with its error, and what only
        it knows is ``null``.

        Raises:
            kernel.exceptions.SetupError: Kafka did not answer.
        """
        from confluent_kafka import KafkaException

        from kernel.exceptions import SetupError
        from kernel.kafka.topics import cluster_metadata

        endpoints: list[dict[str, Any]] = []
        # Kafka answers, or the status is one clear line (no librdkafka log lines)
        cluster_metadata(self.pipeline.kafka.librdkafka_config(), self.timeout_s)
        consumer = self._consumer()
        try:
            sources = self._stored_sources(consumer)
            for url in self.endpoints:
                doc = self._ask(url + "/status.json", endpoints)
                if doc is not None:
                    sources = _merge_sources(sources, doc.get("sources", []))
            snapshots = self._snapshots(consumer, endpoints)
            sync = [self._service(consumer, svc, endpoints) for svc in getattr(self.pipeline, "sync", [])]
        except KafkaException as exc:
            raise SetupError(
                f"Kafka at {self.pipeline.kafka.bootstrap_servers} did not answer: {exc.args[0] if exc.args else exc}",
                "check kafka.bootstrap_servers or run `threes local up`",
            ) from exc
        finally:
            consumer.close()
        return {"generated_at": now_iso(), "sources": sources, "snapshots": snapshots, "sync": sync,
                "endpoints": endpoints}

    def _ask(self, url: str, endpoints: list[dict[str, Any]], token: str | None = None) -> dict[str, Any] | None:
        try:
            doc = fetch_json(url, self.timeout_s, token or self.token)
        except (OSError, ValueError) as exc:
            endpoints.append({"url": url, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            return None
        endpoints.append({"url": url, "ok": True, "error": None})
        return doc

    def _snapshots(self, consumer: Any, endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
        stream = getattr(self.pipeline, "stream", None)
        if stream is None or not stream.snapshots:
            return []
        measured: dict[str, dict[str, float]] = {}
        if stream.metrics_port:
            url = f"http://{self.host}:{stream.metrics_port}/metrics"
            try:
                measured = _snapshot_metrics(fetch_text(url, self.timeout_s, _secret(stream.metrics_token)),
                                             stream.name)
                endpoints.append({"url": url, "ok": True, "error": None})
            except OSError as exc:
                endpoints.append({"url": url, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        highs = self._watermarks(consumer, [t for s in stream.snapshots for t in s.topics])
        out = []
        for snap in stream.snapshots:
            m = measured.get(snap.name, {})
            out.append({
                "job": stream.name, "snapshot": snap.name,
                "keys": int(m["keys"]) if "keys" in m else None,
                "age_s": round(m["age_s"], 3) if "age_s" in m else None,
                "offsets": [{"topic": t, "partition": p, "end_offset": h}
                            for (t, p), h in sorted(highs.items()) if t in snap.topics],
            })
        return out

    def _service(self, consumer: Any, svc: Any, endpoints: list[dict[str, Any]]) -> dict[str, Any]:
        topics = sorted({t for sink in svc.sinks for t in sink.topics})
        highs = self._watermarks(consumer, topics)
        committed = self._committed(svc.consumer_group(), highs) if highs else {}
        live: dict[str, Any] | None = None
        if svc.metrics_port:
            doc = self._ask(f"http://{self.host}:{svc.metrics_port}/status.json", endpoints,
                            _secret(svc.metrics_token))
            if doc is not None:
                live = next((s for s in doc.get("sync", []) if s.get("service") == svc.name), None)
        paused = {tuple(tp) for tp in (live or {}).get("paused", [])}
        partitions = []
        for tp, high in sorted(highs.items()):
            c = committed.get(tp)
            partitions.append({"topic": tp[0], "partition": tp[1], "committed": c, "end_offset": high,
                               "lag": max(0, high - (c or 0)), "paused": tp in paused})
        sinks = [{"sink": s.name, "type": s.type, "state": "unknown", "restarts": None, "dead_letters": None,
                  "last_error": None, "oldest_pending_age_s": None} for s in svc.sinks]
        if live is not None:
            by_name = {k.get("sink"): k for k in live.get("sinks", [])}
            sinks = [{**s, **by_name.get(s["sink"], {})} for s in sinks]
        return {
            "service": svc.name, "group": svc.consumer_group(),
            "state": live.get("state", "unknown") if live else "unknown",
            "lag": sum(p["lag"] for p in partitions), "paused": [list(tp) for tp in sorted(paused)],
            "dead_letters": live.get("dead_letters") if live else None,
            "dead_letter_topic": svc.dead_letter_topic,
            "restarts": live.get("restarts") if live else None,
            "last_error": live.get("last_error") if live else None,
            "partitions": partitions, "sinks": sinks,
        }
