"""The status document: what ``threes status``, ``/status`` and ``/status.json`` show.

Shape (JSON; offsets are Kafka offsets, ages seconds, times ISO 8601 UTC)::

    {"generated_at": "2026-11-23T21:00:00Z",
     "sources":   [{"connector", "task", "state", "position", "position_updated_at", "records_behind",
                    "rows_read", "acked", "restarts", "last_error"}],
     "snapshots": [{"job", "snapshot", "keys", "age_s", "offsets": [{"topic", "partition", "end_offset"}]}],
     "sync":      [{"service", "group", "state", "lag", "paused": [[topic, partition]], "dead_letters",
                    "restarts", "last_error",
                    "partitions": [{"topic", "partition", "committed", "end_offset", "lag", "paused"}],
                    "sinks": [{"sink", "type", "state", "restarts", "dead_letters", "last_error",
                               "oldest_pending_age_s"}]}],
     "endpoints": [{"url", "ok", "error"}]}

``state`` of a source task: ``starting``, ``running``, ``caught_up``,
``restarting``, ``failed``, ``stopped``, or ``unknown`` (no process endpoint
answered: only what Kafka stores is known). A sync service is ``starting``,
``waiting_for_partitions`` (subscribed, but the consumer group has not assigned
it a partition yet: not ready, e.g. while a restarted member waits out its old
session), ``running``, ``degraded`` (a sink restarting), ``restarting``,
``stopped`` or ``unknown``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)


def now_iso() -> str:
    """The current UTC time, ISO 8601 with a ``Z``, second precision."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso_ms(ms: int | None) -> str | None:
    if not ms:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_BEHIND_TTL_S = 10.0
_behind_cache: dict[int, tuple[float, int | None]] = {}


def records_behind(task: Any) -> int | None:
    """``task.records_behind()`` (rows the system holds past the task's read position), asked at most every 10 s."""
    ask = getattr(task, "records_behind", None)
    if ask is None:
        return None
    now = time.monotonic()
    cached = _behind_cache.get(id(task))
    if cached is not None and now - cached[0] < _BEHIND_TTL_S:
        return cached[1]
    try:
        value = ask()
    except Exception as exc:  # noqa: BLE001 - a status read never fails
        log.debug("records behind unknown: %s", exc)
        value = None
    _behind_cache[id(task)] = (now, value)
    return value


def source_entries(worker: Any) -> list[dict[str, Any]]:
    """The source tasks of a live :class:`~connectors.runtime.standalone.SourceWorker`, for its ``/status``.

    ``records_behind`` is what the system holds past the task's read position
    (rows after the cursor of an RDS source; ``null`` where a connector cannot
    tell cheaply); ``in_flight`` the records produced and not yet acknowledged
    by the broker (what a crash now would read again).
    """
    restarts = worker.restarts()
    out = []
    for key, s in sorted(worker.stats().items()):
        runner = worker.runners.get(key)
        out.append({
            "connector": key.split("#", 1)[0], "task": key, "state": s.state, "position": s.position,
            "position_updated_at": None,
            "records_behind": records_behind(getattr(runner, "task", None)) if s.state != "failed" else None,
            "in_flight": max(0, s.produced - s.acked), "rows_read": s.rows_read,
            "acked": s.acked, "restarts": restarts.get(key, 0), "last_error": s.error,
        })
    return out


def source_document(worker: Any) -> dict[str, Any]:
    """The status document of a source process (its ``/status.json``)."""
    return {"generated_at": now_iso(), "sources": source_entries(worker), "snapshots": [], "sync": [],
            "endpoints": []}


def _request(url: str, token: str | None) -> urllib.request.Request:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return urllib.request.Request(url, headers=headers)  # noqa: S310 - operator-given http URL


def fetch_json(url: str, timeout_s: float = 3.0, token: str | None = None) -> dict[str, Any]:
    """GET a JSON document (with ``Authorization: Bearer <token>`` when a token is given).

    Raises:
        OSError: the endpoint did not answer (``urllib.error.URLError`` is one; a 401 is an ``HTTPError``).
        ValueError: the answer is not JSON.
    """
    with urllib.request.urlopen(_request(url, token), timeout=timeout_s) as resp:  # noqa: S310
        return json.loads(resp.read())


def fetch_text(url: str, timeout_s: float = 3.0, token: str | None = None) -> str:
    """GET a text document (Prometheus exposition format), with a bearer token when given.

    Raises:
        OSError: the endpoint did not answer.
    """
    with urllib.request.urlopen(_request(url, token), timeout=timeout_s) as resp:  # noqa: S310
        return resp.read().decode()


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
        from connectors import clients

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
                "position": p.position if p else None, "position_updated_at": _iso_ms(p.updated_ms) if p else None,
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
        from connectors import clients
        from connectors.topics import committed_offsets

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
            connectors.exceptions.SetupError: Kafka did not answer.
        """
        from confluent_kafka import KafkaException

        from connectors.exceptions import SetupError
        from connectors.topics import cluster_metadata

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
