"""What the side-by-side peer benchmarks share: topics, the append-time rate, the machine's load.

``asof_vs_flink.py`` (Flink SQL's event-time temporal join, issue #39) and
``realtime_vs_kstreams.py`` (Kafka Streams' GlobalKTable join, issue #42) run a peer and the
threes job one after the other on the same topics of the local stack's broker and measure both
the same way, from outside: the output topics are created with
``message.timestamp.type=LogAppendTime``, so every output record carries the broker's clock, and
a side's sustained rate is ``(count - 1) / (last - first append time)`` (as the Kafka Streams
reference's ``Measure.java`` and ``stream_join.py`` part 6 measure it).

Topics are named ``bench_peers_<what>_<run id>`` and deleted when the run ends
(``THREES_BENCH_KEEP_TOPICS=1`` keeps them), with the consumer groups the peers left.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
PREFIX = "bench_peers_"
ROOT = Path(__file__).resolve().parents[1]


def size_label(keys: int) -> str:
    """``10k``, ``1m``...: the key count as the issues' JSON keys name it."""
    return f"{keys // 1_000_000}m" if keys >= 1_000_000 and keys % 1_000_000 == 0 else f"{keys // 1000}k"


def load_note() -> str:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``), for a record's note."""
    try:
        return "load " + "/".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load unknown"


def run_bench(bench_class: Callable[[], Any]) -> None:
    """A benchmark's ``__main__``: logging to stderr (``THREES_BENCH_LOG``), then ``bench_class()``, its
    ``main()`` and its ``close()`` whatever happened (its topics deleted, its Spark session stopped)."""
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    bench = bench_class()
    try:
        bench.main()
    finally:
        bench.close()


@dataclass
class PeerTopics:
    """Creates the run's ``bench_peers_`` topics and deletes them (and the peers' consumer groups) at the end.

    Args:
        conf: librdkafka settings of the broker.
        run_id: a short id that makes this run's names unique.
    """

    conf: dict[str, Any]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    created: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from confluent_kafka.admin import AdminClient

        # held for the run: a collected AdminClient fails its pending futures
        self.admin = AdminClient(self.conf)

    def name(self, what: str) -> str:
        """``bench_peers_<what>_<run id>`` (not created)."""
        return f"{PREFIX}{what}_{self.run_id}"

    def create(self, what: str, partitions: int = 2, config: dict[str, str] | None = None) -> str:
        """Create topic ``name(what)``; returns its name.

        Raises:
            KafkaException: the broker refused it.
        """
        from confluent_kafka.admin import NewTopic

        topic = self.name(what)
        new = NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})
        for fut in self.admin.create_topics([new]).values():
            fut.result(30)
        self.created.append(topic)
        return topic

    def output(self, what: str) -> str:
        """An output topic stamped by the broker (``LogAppendTime``), 2 partitions, as the peers' own."""
        return self.create(what, config={"message.timestamp.type": "LogAppendTime"})

    def adopt(self, *topics: str) -> None:
        """Delete these topics too at the end (created by a peer's own loader)."""
        self.created.extend(t for t in topics if t not in self.created)

    def drop(self) -> list[str]:
        """Delete the run's topics and recorded consumer groups, unless ``THREES_BENCH_KEEP_TOPICS=1``.

        Returns:
            The topics deleted. Failures are logged, never raised: the figures are already printed.
        """
        if os.environ.get("THREES_BENCH_KEEP_TOPICS") == "1":
            log.info("kept %d topics (THREES_BENCH_KEEP_TOPICS=1): %s", len(self.created), self.created)
            return []
        existing = set(self.admin.list_topics(timeout=30).topics)
        topics = [t for t in self.created if t in existing]
        if topics:
            for topic, fut in self.admin.delete_topics(topics, operation_timeout=60).items():
                try:
                    fut.result()
                except Exception as exc:  # reported, the run's figures stand
                    log.warning("topic %s not deleted: %s", topic, exc)
        if self.groups:
            try:
                for group, fut in self.admin.delete_consumer_groups(self.groups, request_timeout=30).items():
                    try:
                        fut.result()
                    except Exception as exc:  # e.g. a group that committed nothing
                        log.debug("consumer group %s not deleted: %s", group, exc)
            except Exception as exc:
                log.warning("consumer groups %s not deleted: %s", self.groups, exc)
        log.info("deleted %d topics and %d consumer groups", len(topics), len(self.groups))
        return topics


def end_offsets(conf: dict[str, Any], topic: str) -> dict[int, int]:
    """The high watermark of each partition of ``topic``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": f"{PREFIX}probe", "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
    finally:
        consumer.close()


def wait_for_count(
    conf: dict[str, Any], topic: str, expected: int, timeout_s: float, alive: Callable[[], bool] = lambda: True
) -> int:
    """Poll ``topic``'s end offsets every second until they add up to ``expected`` records.

    Args:
        conf: librdkafka settings.
        topic: the output topic.
        expected: records to wait for.
        timeout_s: give up after this many seconds.
        alive: called every poll; waiting stops when it returns False (the writer died).

    Returns:
        The records in the topic when the wait ended (``>= expected`` unless it timed out or the
        writer stopped).
    """
    deadline = time.monotonic() + timeout_s
    count = 0
    while time.monotonic() < deadline:
        count = sum(end_offsets(conf, topic).values())
        if count >= expected or not alive():
            break
        time.sleep(1.0)
    return count


RowCheck = Callable[[list[bytes]], Iterable[tuple[Any, bool, bool]]]
"""Decodes a chunk of output values; yields ``(event id, missed, correct)`` per record."""


def measure_output(conf: dict[str, Any], topic: str, check: RowCheck, timeout_s: float = 600) -> dict[str, Any]:
    """Read a whole output topic: the rate by broker append time, and the correctness counts.

    ``rate_eps`` = (count - 1) / (last - first append time); ``p10_p90_rate_eps`` = records between the
    10th and 90th percentile of append time / that span (as the Kafka Streams reference's
    ``Measure.java``). ``check`` says per record whether the join missed and whether it was right.

    Args:
        conf: librdkafka settings.
        topic: a topic created with ``message.timestamp.type=LogAppendTime``.
        check: decodes a chunk of values (see :data:`RowCheck`).
        timeout_s: read for at most this long, seconds.

    Returns:
        ``count``, ``distinct``, ``dups``, ``misses``, ``wrong``, ``log_append_time`` (every record
        stamped by the broker), ``span_s``, ``rate_eps``, ``p10_p90_rate_eps``, ``first_ms``, ``last_ms``.
    """
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

    ends = end_offsets(conf, topic)
    consumer = Consumer({**conf, "group.id": f"{PREFIX}measure", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    positions = dict.fromkeys(ends, 0)
    stamps: list[int] = []
    ts_types: set[int] = set()
    seen: set[Any] = set()
    dups = misses = wrong = 0
    deadline = time.monotonic() + timeout_s
    while any(positions[p] < ends[p] for p in ends) and time.monotonic() < deadline:
        values: list[bytes] = []
        for msg in consumer.consume(10000, 1.0):
            if msg.error():
                continue
            positions[msg.partition()] = msg.offset() + 1
            ts_type, ts = msg.timestamp()
            ts_types.add(ts_type)
            stamps.append(ts)
            values.append(msg.value())
        for eid, missed, ok in check(values):
            dups += eid in seen
            seen.add(eid)
            misses += missed
            wrong += not ok
    consumer.close()
    from stream_join import append_rates  # here: the modules that only need size_label do not load stream_join

    rates = append_rates(stamps)  # sorts stamps
    return {
        "count": len(stamps),
        "distinct": len(seen),
        "dups": dups,
        "misses": misses,
        "wrong": wrong,
        "log_append_time": ts_types == {TIMESTAMP_LOG_APPEND_TIME},
        **rates,
        "first_ms": stamps[0] if stamps else None,
        "last_ms": stamps[-1] if stamps else None,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank below (as ``Latency.java``)."""
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def open_loop_queries(
    port: int, paths: list[str], rate: int, out: Any, field: str | None = None, expected: list[str] | None = None
) -> None:
    """GET ``paths`` at ``rate``/s on up to 64 keep-alive connections; ``(latencies_ms, errors, slow)`` to ``out``.

    An open-loop load generator (wrk2's model): query ``i`` is due at ``start + i / rate`` whatever the
    answers before it, and its latency counts from then (no coordinated omission). Connections are kept
    open and reused, as every HTTP client library pools them; one asyncio loop, meant to run in a
    process of its own so that the generator's cost per query is not what is measured. A query is an
    error unless it answers 200 (and, with ``field``, its JSON's ``value[field]`` equals ``expected[i]``);
    ``slow`` lists when (s into the run) the queries that took over 100 ms were due.
    """
    import asyncio
    import json

    async def run() -> tuple[list[float], int, list[float]]:
        idle: list[Any] = []
        latencies: list[float] = []
        slow: list[float] = []
        errors = 0

        async def one(due: float, i: int) -> None:
            nonlocal errors
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
            ok = False
            try:
                reader, writer = conn
                writer.write(f"GET {paths[i]} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                length = int(
                    next(
                        ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")
                    )
                )
                body = await reader.readexactly(length)
                ok = head.startswith(b"HTTP/1.1 200")
                if ok and field is not None and expected is not None:
                    ok = json.loads(body)["value"][field] == expected[i]
                idle.append(conn)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, StopIteration, KeyError, ValueError):
                conn[1].close()
            latencies.append((time.monotonic() - due) * 1000)
            if latencies[-1] > 100:  # when the slow ones were due: stalls, not a slow path
                slow.append(round(due - start, 2))
            errors += not ok

        start = time.monotonic() + 0.5
        limit = asyncio.Semaphore(64)

        async def bounded(i: int) -> None:
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic() - 0.001))
            async with limit:
                await one(start + i / rate, i)

        await asyncio.gather(*(bounded(i) for i in range(len(paths))))
        for _reader, writer in idle:
            writer.close()
        return latencies, errors, slow

    out.put(asyncio.run(run()))
