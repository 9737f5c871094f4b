"""The live view's readings of the pipeline's flow, taken away from the supervision loop.

A :class:`FlowReader` takes :meth:`~threes.pipeline.kafka_probe.KafkaProbe.flow` readings
every few seconds, in a child process of its own (or a thread, for in-process fakes), so a
supervisor tick never waits on Kafka and a native crash of a Kafka client ends only that child.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from threes.pipeline.kafka_probe import Flow, FlowPlan

log = logging.getLogger(__name__)


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
            except Exception as exc:  # no reader now; the parts run on, a new one is tried
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
