"""A dedicated three-broker Kafka cluster for the leader failover drills, and how to fail its leaders.

The cluster is the one ``threes local up --brokers 3`` starts (:class:`threes.local.LocalStack`),
in its own folder and on its own ports, so the shared stack's single broker is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from kernel.config.models import KafkaConfig
from threes.local import LocalStack
from threes.local.kafka import Kafka
from threes.local.kafka_cluster import KafkaCluster

BROKERS = 3
PORT = int(os.environ.get("THREES_FAILOVER_KAFKA_PORT", "29092"))
DOWN_S = float(os.environ.get("THREES_FAILOVER_DOWN_S", "5"))
"""How long the killed leader stays down before it is restarted, seconds."""

_WATERMARK_READER = """
import json, os, sys
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
conf, topic, partition = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
tp = TopicPartition(topic, partition)
admin = AdminClient(conf)  # referenced until the answer is in: a dropped client never answers
try:
    offset = admin.list_offsets({tp: OffsetSpec.latest()}, request_timeout=2)[tp].result(timeout=5).offset
except Exception:
    offset = -1
print(offset, flush=True)
os._exit(0)  # no client teardown: its crash would only hide the answer
"""
"""Prints the high watermark of ``topic`` ``partition`` (-1 when it cannot be read); run by :meth:`high_watermark`."""

_STACK_UP = """
import logging, sys
from pathlib import Path
from threes.local import LocalStack
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
LocalStack(Path(sys.argv[1])).up(["kafka"], brokers=int(sys.argv[2]), kafka_port=int(sys.argv[3]))
"""
"""Starts the missing brokers of the cluster in ``argv[1]`` (``threes local up --brokers N``); run by :meth:`up`."""

_OWN_KAFKA_VARS = ("THREES_KAFKA_BOOTSTRAP", "THREES_KAFKA_SASL_BOOTSTRAP", "THREES_TLS_CA")  # its own CA too


@contextlib.contextmanager
def own_kafka() -> Iterator[None]:
    """Hide the shared stack's Kafka and CA variables, so :class:`LocalStack` runs (and probes) its own brokers."""
    saved = {var: os.environ.pop(var) for var in _OWN_KAFKA_VARS if var in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def link_jars(home: Path) -> None:
    """Let the cluster in ``home`` use the jars (and Maven repository) of the shared stack, when it has them."""
    shared = LocalStack().home
    for name in ("m2", "kafka/lib"):
        source, target = shared / name, home / name
        if source.exists() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source, target_is_directory=True)


@dataclass
class Failover:
    """One kill -9 of a partition leader: which, when, and what the clients saw afterwards.

    Attributes:
        topic: The topic whose busiest partition's leader was killed.
        partition: That partition.
        node: The killed broker's node id.
        killed_at: ``time.monotonic()`` of the SIGKILL.
        probes: What is watched -> a reading of it for the partition (an offset; -1 when unreadable).
        baselines: What is watched -> its reading just before the kill.
        stalls: What resumed -> seconds from the kill until it did.
        restart_s: Seconds the restarted broker took to rejoin (every broker registered).
    """

    topic: str
    partition: int
    node: int
    killed_at: float
    probes: dict[str, Callable[[int], int]] = field(default_factory=dict)
    baselines: dict[str, int] = field(default_factory=dict)
    stalls: dict[str, float] = field(default_factory=dict)
    restart_s: float = 0.0

    def report(self, scenario: str) -> str:
        """One line for the test's output (``-s`` or the captured stdout of a failure)."""
        stalls = ", ".join(f"{what} {seconds:.2f} s" for what, seconds in self.stalls.items())
        return (
            f"[failover] {scenario}: killed broker {self.node} (leader of {self.topic}[{self.partition}]); "
            f"stall: {stalls}; broker back after {self.restart_s:.1f} s"
        )


class BrokerCluster:
    """The dedicated cluster: its Kafka config, its partition leaders, kill -9 and restart of a broker.

    Args:
        home: The cluster's folder (a tmp dir).
    """

    def __init__(self, home: Path) -> None:
        self._consumers: dict[str, Any] = {}
        self.home = home
        self.stack = LocalStack(home)
        self.shape = KafkaCluster(BROKERS, PORT)
        self.kafka = KafkaConfig(bootstrap_servers=self.shape.bootstrap())
        self.conf: dict[str, Any] = self.kafka.librdkafka_config()

    def up(self) -> None:
        """Start (or restart the missing) brokers; return once all of them are registered.

        In a child process (:data:`_STACK_UP`), started again if it dies: its readiness probe asks the
        rejoining brokers for a group coordinator, and a request in flight while a killed broker leaves
        and rejoins the cluster can abort its process (librdkafka 2.16, see :meth:`high_watermark`).
        """
        for _attempt in range(3):
            with own_kafka():
                done = subprocess.run([sys.executable, "-c", _STACK_UP, str(self.home), str(BROKERS), str(PORT)])
            if done.returncode == 0:
                return
        raise AssertionError(f"the three brokers did not come up (last exit code {done.returncode})")

    def down(self) -> None:
        """Stop every broker."""
        self.close()
        with own_kafka():
            self.stack.down(["kafka"])

    def node(self, node: int) -> Kafka:
        """The service of broker ``node``."""
        return Kafka(self.stack.layout, node, self.shape)

    def busiest_partition(self, topic: str) -> tuple[int, int]:
        """``(partition, leader node)`` of the partition of ``topic`` with the most records."""
        meta = AdminClient(self.conf).list_topics(topic, timeout=10).topics[topic]
        ends = {p: self.high_watermark(topic, p) for p in meta.partitions}
        busiest = max(ends, key=lambda p: ends[p])
        return busiest, meta.partitions[busiest].leader

    def kill_leader(self, topic: str, probes: dict[str, Callable[[int], int]]) -> Failover:
        """SIGKILL the leader of the busiest partition of ``topic``, reading each probe just before.

        Args:
            topic: The topic.
            probes: What to watch -> its reading for a partition (an offset that grows with progress).
        """
        partition, node = self.busiest_partition(topic)
        record = self.node(node).running()
        assert record is not None, f"broker {node} leads {topic}[{partition}] but does not run"
        baselines = {what: probe(partition) for what, probe in probes.items()}
        killed_at = time.monotonic()
        os.kill(record.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(record.pid, 0)
        return Failover(topic, partition, node, killed_at, probes, baselines)

    def restart(self, failover: Failover) -> None:
        """Start the killed broker again (after :data:`DOWN_S` from the kill) and wait until it rejoined."""
        time.sleep(max(0.0, failover.killed_at + DOWN_S - time.monotonic()))
        began = time.monotonic()
        self.up()
        failover.restart_s = time.monotonic() - began

    def _consumer(self, group: str) -> Any:
        """A consumer of ``group`` kept open for readings (a new one per reading would add its bootstrap)."""
        if group not in self._consumers:
            self._consumers[group] = Consumer({**self.conf, "group.id": group, "enable.auto.commit": False})
        return self._consumers[group]

    def high_watermark(self, topic: str, partition: int) -> int:
        """The partition's high watermark; -1 while it cannot be read (no leader yet).

        Read in a child process (:data:`_WATERMARK_READER`: a new admin client, ListOffsets, which looks
        the leader up anew). In this process, a client with a request waiting on the killed broker while
        it left the cluster and rejoined aborted the whole test run in librdkafka 2.16
        (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0' failed``, with consumers'
        ``get_watermark_offsets`` and admin clients alike; see confluentinc/librdkafka#5160), and one
        client kept open went on failing after the kill. A reader that crashes or times out reads -1.
        """
        try:
            done = subprocess.run(
                [sys.executable, "-c", _WATERMARK_READER, json.dumps(self.conf), topic, str(partition)],
                capture_output=True,
                text=True,
                timeout=15,
            )
            return int(done.stdout.split()[0])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            return -1

    def committed(self, group: str, topic: str, partition: int) -> int:
        """The group's committed offset of the partition; -1 while it cannot be read."""
        try:
            return int(self._consumer(group).committed([TopicPartition(topic, partition)], timeout=1)[0].offset)
        except Exception:
            return -1

    def close(self) -> None:
        """Close the reading consumers."""
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()


def measure_stalls(failover: Failover, timeout_s: float = 180.0, ended: Callable[[], bool] | None = None) -> None:
    """Wait until every probe reads more than just before the kill; record the seconds from the kill to each.

    Args:
        failover: The kill to measure.
        timeout_s: How long to wait for progress, from the kill.
        ended: True once the load has ended (its process exited): a probe that shows no progress
            after that never will, and the wait stops there.

    Raises:
        AssertionError: A probe shows no progress within ``timeout_s`` of the kill (or before the load ended).
    """

    def watch(what: str, probe: Callable[[int], int]) -> None:  # one thread each: a slow reading delays no other
        while time.monotonic() - failover.killed_at < timeout_s:
            over = ended is not None and ended()  # read before the probe: progress made before the end counts
            try:
                reading = probe(failover.partition)
            except Exception:
                reading = -1
            if reading > failover.baselines[what]:
                failover.stalls[what] = time.monotonic() - failover.killed_at
                return
            if over:
                return
            time.sleep(0.05)

    watchers = [threading.Thread(target=watch, args=item, daemon=True) for item in failover.probes.items()]
    for watcher in watchers:
        watcher.start()
    for watcher in watchers:
        watcher.join(timeout_s + 5)
    waiting = sorted(set(failover.probes) - set(failover.stalls))
    waited = time.monotonic() - failover.killed_at
    gone = ": the load had ended (it wrote nothing after the kill)" if ended is not None and ended() else ""
    assert not waiting, f"no progress of {waiting} {waited:.0f} s after the kill of broker {failover.node}{gone}"
