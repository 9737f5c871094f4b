"""What ``threes run`` reads to know when a part may start and how the pipeline is doing.

Everything here is read-only and cheap (Kafka metadata, watermarks and committed
offsets; a scrape of a child's local metrics endpoint), read about once a second
by the supervisor. Nothing asks a sink's system: the view shows what Kafka knows
(records per topic, what each sync service committed), which means the same for
every kind of sink.
"""

from __future__ import annotations

import logging
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kernel.exceptions import SetupError
from kernel.kafka import clients

log = logging.getLogger(__name__)

CYCLES_METRIC = "threes_source_cycle_seconds"
"""The source runtime's histogram of completed polling cycles, labelled by connector."""


class KafkaOutage(SetupError):
    """Kafka stopped answering after it had answered in this run (a broker restart, a network cut).

    The supervisor waits for it (up to its start timeout) instead of stopping the pipeline; a
    Kafka that never answered is a :class:`SetupError` at once (a wrong address, refused login).
    """


def scrape(port: int, timeout_s: float = 2.0, token: str | None = None) -> str | None:
    """The text of ``http://127.0.0.1:<port>/metrics``; ``None`` when it does not answer.

    Args:
        port: the child's metrics port.
        timeout_s: seconds.
        token: the endpoint's bearer token (``metrics_token``), if it has one.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - loopback
            return resp.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def source_cycles(metrics_text: str) -> dict[str, int]:
    """Completed polling cycles per source connector, from a Prometheus text exposition.

    Args:
        metrics_text: the body of a ``threes source run`` metrics endpoint.

    Returns:
        Connector name -> cycles completed (every task of it together); a connector
        that has completed none is absent.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != CYCLES_METRIC:
            continue
        for sample in family.samples:
            if sample.name == f"{CYCLES_METRIC}_count" and sample.value > 0:
                out[sample.labels.get("connector", "")] = int(sample.value)
    return out


def sync_assigned(metrics_text: str) -> dict[str, int]:
    """Partitions assigned per sync service, from a ``threes sync run`` metrics endpoint.

    Args:
        metrics_text: a Prometheus text exposition.

    Returns:
        Service name -> partitions its consumer holds (``threes_sync_assigned_partitions``);
        a service is ready only above 0.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "threes_sync_assigned_partitions":
            for sample in family.samples:
                out[sample.labels.get("service", "")] = int(sample.value)
    return out


def sources_ready(cycles: dict[str, int], tasks: dict[str, int]) -> tuple[list[str], list[str]]:
    """Which source connectors finished their first cycle (the initial snapshot, read until caught up).

    Args:
        cycles: connector -> cycles completed (:func:`source_cycles`).
        tasks: connector -> its number of tasks; a connector is ready once it completed
            at least that many cycles (one per task for a connector that does not split).

    Returns:
        ``(ready, waiting)`` connector names, each sorted.
    """
    ready = sorted(n for n, count in tasks.items() if cycles.get(n, 0) >= max(1, count))
    return ready, sorted(set(tasks) - set(ready))


@dataclass
class Flow:
    """One reading of the pipeline from Kafka.

    Attributes:
        at: ``time.time()`` of the reading.
        topics: topic -> records in it (sum over partitions of high minus low watermark; ``None``: missing).
        committed: sync service -> records its consumer group committed on its topics.
        lag: sync service -> records of its topics not yet committed.
    """

    at: float
    topics: dict[str, int | None] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FlowPlan:
    """What a flow reading reads: plain names only, so it crosses to a reading child process.

    Attributes:
        topics: the pipeline's topics in flow order (:func:`pipeline_topics`).
        groups: ``(sync service, its consumer group, its topics sorted)`` per sync service.
    """

    topics: tuple[str, ...]
    groups: tuple[tuple[str, str, tuple[str, ...]], ...]

    @classmethod
    def of(cls, pipeline: Any) -> FlowPlan:
        """The plan of a pipeline config."""
        groups = tuple(
            (svc.name, svc.consumer_group(), tuple(sorted({t for s in svc.sinks for t in s.topics})))
            for svc in pipeline.sync
        )
        return cls(tuple(pipeline_topics(pipeline)), groups)


RENEW_AFTER_S = 5.0
"""Seconds of failing watermark reads after which :class:`KafkaProbe` renews its consumer."""


class KafkaProbe:
    """Reads topics, stored positions and consumer groups (clients kept open between readings).

    Args:
        kafka: the pipeline's ``KafkaConfig``.
        offsets_topic: where the sources keep their positions.
    """

    def __init__(self, kafka: Any, offsets_topic: str = "_threes_offsets"):
        from kernel.kafka.topics import GroupOffsets

        self.kafka = kafka
        self.offsets_topic = offsets_topic
        self._consumer = clients.kafka_consumer(kafka, f"threes-run-probe-{uuid.uuid4().hex[:8]}")
        self._suspect_since: float | None = None  # when a watermark read failed, until one succeeds
        self._renewed_at = time.monotonic()
        self._admin = clients.kafka_admin(kafka)
        self._groups = GroupOffsets(kafka)
        self._topics: tuple[float, dict[str, Any]] | None = None
        self.answered = False
        """Whether Kafka answered a metadata request of this probe once (later failures are outages)."""

    def topics(self, max_age_s: float = 1.0) -> dict[str, Any]:
        """Topic name -> metadata of every topic, listed at most ``max_age_s`` ago.

        Raises:
            SetupError: Kafka did not answer.
        """
        from kernel.kafka.topics import cluster_metadata

        now = time.monotonic()
        if self._topics is None or now - self._topics[0] >= max_age_s:
            try:
                meta = cluster_metadata(self.kafka.librdkafka_config(), self.kafka.request_timeout_s)
            except SetupError as exc:
                if self.answered:  # it answered earlier in this run: an outage, not a wrong address
                    raise KafkaOutage(str(exc)) from exc
                raise
            self.answered = True
            self._topics = (now, {t: m for t, m in meta.topics.items() if m.error is None and m.partitions})
        return self._topics[1]

    def missing(self, topics: Iterable[str]) -> list[str]:
        """Those of ``topics`` that do not exist (yet)."""
        present = self.topics()
        return [t for t in topics if t not in present]

    def stored_positions(self) -> set[str]:
        """Connectors with a position stored in the offsets topic (they have written to their topic)."""
        from connectors.runtime.offsets import OffsetStore

        if self.offsets_topic not in self.topics(max_age_s=0):
            return set()
        store = OffsetStore(self.kafka.librdkafka_config(), self.offsets_topic, self.kafka.request_timeout_s)
        return {p.connector for p in store.load_all().values()}

    def ensure_topic(self, topic: str, spec: Any) -> bool:
        """Create ``topic`` (``cleanup.policy=delete``) from a ``TopicSpec`` when it is missing.

        Returns:
            ``True`` when it was created here, ``False`` when it existed.

        Raises:
            SetupError: Kafka refused the creation.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        from kernel.exceptions import SetupError

        if topic in self.topics(max_age_s=0):
            return False
        new = NewTopic(topic, num_partitions=spec.partitions, replication_factor=spec.replication_factor,
                       config=dict(spec.configs))
        try:
            self._admin.create_topics([new], request_timeout=self.kafka.request_timeout_s)[topic].result(
                self.kafka.request_timeout_s
            )
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
                return False
            raise SetupError(f"cannot create the events topic {topic!r}: {exc}",
                             "create it yourself, or fix stream.events.topic_spec") from exc
        self._topics = None
        log.info("created events topic=%s partitions=%d replication_factor=%d", topic, spec.partitions,
                 spec.replication_factor)
        return True

    def watermarks(
        self, topic: str, partition: int, seen: dict[tuple[str, int], tuple[int, int] | None] | None = None
    ) -> tuple[int, int] | None:
        """``(low, high)`` of one partition; ``None`` when they cannot be read right now.

        A broker answers ``NOT_LEADER_FOR_PARTITION`` for a while after a topic is created or a
        leader moves: one unknown reading, never an error that stops the supervisor. ``seen``
        (one reading's answers so far) is asked first and filled, so a reading asks Kafka once
        per partition.
        """
        from confluent_kafka import KafkaException, TopicPartition

        if seen is not None and (topic, partition) in seen:
            return seen[(topic, partition)]
        if self._suspect_since is not None and time.monotonic() - self._renewed_at >= RENEW_AFTER_S:
            self._renew_consumer()
        try:
            marks = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
        except KafkaException as exc:
            log.info("run: watermarks of %s[%d] not readable yet: %s", topic, partition, exc)
            marks = None
            if self._suspect_since is None:
                self._suspect_since = time.monotonic()
        else:
            self._suspect_since = None
        if seen is not None:
            seen[(topic, partition)] = marks
        return marks

    def _renew_consumer(self) -> None:
        """Replace the watermark consumer (its reads have failed for ``RENEW_AFTER_S``).

        A consumer that is not assigned the partitions it asks about keeps its own view of the
        cluster; after a broker restart one was seen answering "unknown partition" for good
        while a new client read the same partition at once.
        """
        old = self._consumer
        self._consumer = clients.kafka_consumer(self.kafka, f"threes-run-probe-{uuid.uuid4().hex[:8]}")
        self._renewed_at = time.monotonic()
        log.info("run: watermark reads failing since %.0f s ago; the probe's consumer was renewed",
                 self._renewed_at - (self._suspect_since or self._renewed_at))
        old.close()

    def records(
        self, topic: str, seen: dict[tuple[str, int], tuple[int, int] | None] | None = None
    ) -> int | None:
        """Records in ``topic`` (high minus low watermark over its partitions).

        Returns ``None`` when the topic is missing or a partition's watermarks cannot be read right
        now (:meth:`watermarks`; ``seen`` as there).
        """
        meta = self.topics().get(topic)
        if meta is None:
            return None
        total = 0
        for p in meta.partitions:
            marks = self.watermarks(topic, p, seen)
            if marks is None:
                return None
            total += max(0, marks[1] - marks[0])
        return total

    def group_progress(
        self, group: str, topics: Iterable[str], seen: dict[tuple[str, int], tuple[int, int] | None] | None = None
    ) -> tuple[int, int]:
        """``(committed, lag)`` of a consumer group over ``topics``, in records.

        A partition whose watermarks cannot be read right now is left out of this reading
        (:meth:`watermarks`; ``seen`` as there).
        """
        partitions = {t: meta.partitions for t in topics if (meta := self.topics().get(t)) is not None}
        try:
            done = self._groups.read(group, [(t, p) for t, ps in partitions.items() for p in ps], 5)
        except SetupError as exc:
            log.info("run: committed offsets of %s not readable now: %s", group, exc)
            done = {}
        committed = lag = 0
        for topic, parts in partitions.items():
            for p in parts:
                marks = self.watermarks(topic, p, seen)
                if marks is None:
                    continue
                low, high = marks
                at = done.get((topic, p), low)
                committed += max(0, at - low)
                lag += max(0, high - max(at, low))
        return committed, lag

    def flow(self, pipeline: Any) -> Flow:
        """One reading of every topic of the pipeline and every sync service's progress.

        Args:
            pipeline: the pipeline, or its :class:`FlowPlan`.
        """
        plan = pipeline if isinstance(pipeline, FlowPlan) else FlowPlan.of(pipeline)
        reading = Flow(at=time.time())
        seen: dict[tuple[str, int], tuple[int, int] | None] = {}  # the sync services' topics were read above
        for topic in plan.topics:
            reading.topics[topic] = self.records(topic, seen)
        for name, group, topics in plan.groups:
            reading.committed[name], reading.lag[name] = self.group_progress(group, list(topics), seen)
        return reading

    def close(self) -> None:
        """Close the clients."""
        self._consumer.close()
        self._groups.close()


class FlowReader:
    """Takes :meth:`KafkaProbe.flow` readings every ``every_s``, away from the supervision loop.

    Supervision never waits on Kafka for the live view: while the broker is away one reading can
    take the clients' timeouts (seconds per partition, minutes for a large pipeline), and a tick
    that waited for it would notice neither an exited part nor Ctrl-C meanwhile.

    **Isolated** (``isolated=True``, what ``threes run`` uses): the readings are taken in a child
    process of their own (``multiprocessing``'s *spawn*: a fresh interpreter, its own Kafka
    clients) and sent back over a pipe. A native crash in a Kafka client (librdkafka has aborted
    on an assertion while a broker went away mid-request: ``docs/operations.md``) then ends that
    child, never the supervisor: a new child starts after a backoff (1 s, doubling up to
    ``max_backoff_s``; back to 1 s once a child lived a minute), and the view shows the last
    reading meanwhile. The child gets the pipeline's :class:`FlowPlan` and ``make_probe``, which
    must be picklable (a ``functools.partial`` of :class:`KafkaProbe` and a ``KafkaConfig``).
    Not isolated: the readings run in a thread of this process (tests with in-process fakes).

    Either way the reader owns its probe (its own clients) and closes it when it ends.

    Args:
        pipeline: the pipeline whose flow is read.
        make_probe: builds the probe (a :class:`KafkaProbe`), called where the readings run.
        every_s: seconds between the end of one reading and the start of the next.
        isolated: read in a child process (see above).
        max_backoff_s: longest wait before a new child, seconds.
    """

    def __init__(
        self,
        pipeline: Any,
        make_probe: Callable[[], Any],
        every_s: float,
        isolated: bool = False,
        max_backoff_s: float = 30.0,
    ):
        import threading

        self.plan = FlowPlan.of(pipeline)
        """What each reading reads (crosses to the reading child)."""
        self.make_probe = make_probe
        self.every_s = every_s
        self.isolated = isolated
        self.max_backoff_s = max_backoff_s
        self.latest: Flow | None = None
        """The newest reading (``None`` before the first one answered)."""
        self.pid: int | None = None
        """The current reading child's process id (isolated; ``None`` between children)."""
        self.restarts = 0
        """Children that ended without being asked to (isolated)."""
        self._stop = threading.Event()
        target = self._run_isolated if isolated else self._run
        self._thread = threading.Thread(target=target, name="threes-run-flow", daemon=True)

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def _run(self) -> None:
        take_readings(self.plan, self.make_probe, self.every_s, self._receive, self._stop.wait)

    def _receive(self, message: Flow | str) -> None:
        """A reading, or why none was taken (the view waits; the parts run on)."""
        if isinstance(message, Flow):
            self.latest = message
        else:
            log.warning("run: cannot read the pipeline's topics: %s", message)

    def _run_isolated(self) -> None:
        """Keep a reading child running and take its readings (in this object's thread)."""
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of this process's clients
        backoff = 1.0
        while not self._stop.is_set():
            ours, theirs = ctx.Pipe(duplex=True)
            child = ctx.Process(
                target=read_flow_forever,
                args=(theirs, self.plan, self.make_probe, self.every_s),
                name="threes-run-flow",
                daemon=True,  # never outlives this process
            )
            started = time.monotonic()
            try:
                child.start()
            except Exception as exc:  # noqa: BLE001 - no reader now; the parts run on, a new one is tried
                log.warning("run: cannot start the flow reader: %s", exc)
                ours.close()
                theirs.close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            theirs.close()
            self.pid = child.pid
            try:
                while not self._stop.is_set():
                    if ours.poll(0.5):
                        self._receive(ours.recv())
                    elif not child.is_alive():
                        break
            except (EOFError, OSError):  # the child ended mid-message
                pass
            stopping = self._stop.is_set()
            if stopping:
                try:
                    ours.send(None)  # stop after the reading in flight
                except OSError:
                    pass
            child.join(2.0)
            if child.is_alive():  # held in a client call: it holds nothing worth waiting for
                child.kill()
                child.join(2.0)
            ours.close()
            self.pid = None
            if stopping:
                return
            code = child.exitcode
            self.restarts += 1
            if time.monotonic() - started >= 60:
                backoff = 1.0
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            log.warning("run: the flow reader (pid %s) ended with %s; a new one starts in %.0f s", child.pid, how,
                        backoff)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop reading and wait up to ``timeout_s``.

        A reading in flight finishes first (isolated: the child gets 2 s, then SIGKILL); the
        thread is a daemon, so one stuck in a client call never holds the process.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


def read_flow_forever(conn: Any, plan: FlowPlan, make_probe: Callable[[], Any], every_s: float) -> None:
    """The reading child of an isolated :class:`FlowReader`: one reading per ``every_s`` into ``conn``.

    Sends a :class:`Flow` per reading, or the error's text when Kafka did not answer. Ends when
    the parent sends anything, or closes its end (the parent is gone). Ctrl-C and SIGTERM sent
    to the whole process group are left to the parent, which stops the child after its parts
    (a child ended by them would be reported as a crash and started again); a native crash
    prints every thread's Python stack (``faulthandler``) before the child ends.
    """
    import faulthandler
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    faulthandler.enable()
    try:
        take_readings(plan, make_probe, every_s, conn.send, conn.poll)  # poll: a message, or the parent's end closed
    except (EOFError, OSError):  # the parent is gone
        return


def take_readings(
    plan: FlowPlan,
    make_probe: Callable[[], Any],
    every_s: float,
    deliver: Callable[[Flow | str], None],
    wait: Callable[[float], bool],
) -> None:
    """Take a reading, ``deliver`` it (or the error's text when Kafka did not answer), ``wait``; again.

    Ends when ``wait(every_s)`` returns true. The probe is made at the first reading (again after a
    failure to make it) and closed at the end.
    """
    from confluent_kafka import KafkaException

    from kernel.exceptions import ThreesError

    probe = None
    try:
        while True:
            try:
                if probe is None:
                    probe = make_probe()
                deliver(probe.flow(plan))
            except (ThreesError, KafkaException) as exc:
                deliver(str(exc))
            if wait(every_s):
                return
    finally:
        if probe is not None:
            probe.close()


def pipeline_topics(pipeline: Any) -> list[str]:
    """The topics of a pipeline in flow order: state topics, events, enriched, updates, dead letters."""
    topics = [s.topic for s in pipeline.sources]
    stream = pipeline.stream
    if stream is not None:
        topics += [t for snap in stream.snapshots for t in snap.topics]
        topics += [stream.events.topic, stream.enriched_topic, *(u.topic for u in stream.updates)]
    for svc in pipeline.sync:
        topics += [t for s in svc.sinks for t in s.topics]
    dead = ([stream.dead_letter_topic] if stream is not None else []) + [
        svc.dead_letter_topic for svc in pipeline.sync
    ]
    return list(dict.fromkeys([*topics, *dead]))
