"""Start the parts of a pipeline in order, keep them running, stop them in reverse order.

The supervisor ticks about twice a second. Each tick it

1. looks at every started child: one that exited is a start-up failure (the run
   stops with the end of its log) when it had never become ready, else it is
   restarted after a backoff (1 s, doubling up to 60 s; the count starts over
   once it stayed up for a minute), like systemd's ``Restart=on-failure``;
2. checks whether a starting child became ready (:mod:`threes.pipeline.probes`, :mod:`threes.pipeline.kafka_probe`);
3. starts the next waiting part once every earlier part was started and what it
   waits for holds (:mod:`threes.pipeline.plan`), creating the events topic
   first when the stream job is about to start; a Kafka that stops answering
   after it answered once (:class:`~threes.pipeline.kafka_probe.KafkaOutage`) is
   waited for, up to the start timeout;
4. shows the newest reading of the pipeline's flow, which a child process of its own takes from
   Kafka every ``flow_every_s`` (:class:`~threes.pipeline.flow_reader.FlowReader`), so a tick never
   waits on Kafka for the live view and a native crash of a Kafka client there ends only that
   child (a new one starts).

A stop (Ctrl-C / SIGTERM, or a failure) stops the started children in reverse
start order (sync, stream, sources), each with SIGTERM and its own clean-stop
time, then SIGKILL of its process group; a second Ctrl-C kills at once.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from kernel.exceptions import FatalError, SetupError
from threes.pipeline.control import PAUSE_FILE_ENV, Controls
from threes.pipeline.flow_reader import FlowReader
from threes.pipeline.kafka_probe import Flow, KafkaOutage, KafkaProbe
from threes.pipeline.parts import PartState, RunOptions, free_port
from threes.pipeline.plan import plan_run
from threes.pipeline.probes import scrape, source_cycles, sources_ready, sync_assigned
from threes.pipeline.processes import signal_group, spawn
from threes.pipeline.revisions import part_revisions

log = logging.getLogger(__name__)


CLEAN_EXITS = (0, -signal.SIGTERM, -signal.SIGINT)
"""Exit codes of a stopped child that count as a clean stop (systemd's default success statuses)."""


class Supervisor:
    """Runs one pipeline's parts as supervised child processes (see the module docstring).

    Args:
        pipeline: the validated pipeline.
        options: how to run it.
        env: the children's environment (default: this process's).
        on_update: called with the supervisor after every tick (the live view).

    Raises:
        ConfigError: nothing of ``options.only`` is in the config.
    """

    def __init__(self, pipeline: Any, options: RunOptions, env: dict[str, str] | None = None,
                 on_update: Callable[[Supervisor], None] | None = None):
        self.pipeline = pipeline
        self.options = options
        self.env = dict(env if env is not None else os.environ)
        self.on_update = on_update or (lambda _s: None)
        self.started_at = time.monotonic()
        sources_port = free_port() if "sources" in options.only else None
        stream = pipeline.stream
        stream_port = free_port() if stream is not None and stream.metrics_port is None else None
        self.ports = {"sources_metrics_port": sources_port, "stream_metrics_port": stream_port}
        self.parts = [PartState(p) for p in plan_run(
            pipeline, options.config, options.only, offsets_topic=options.offsets_topic, **self.ports,
        )]
        self.tasks = self._source_tasks() if any(p.name == "sources" for p in self.parts) else {}
        self.revision = 1  # the config revision: PUT /pipeline counts up
        revisions = part_revisions(pipeline)
        for state in self.parts:
            state.revision = revisions[state.name]
        self.control = Controls(self)  # the operator's requests (management API), carried out at each tick
        self.flow: Flow | None = None
        self.events: list[tuple[float, str]] = []  # (time.time(), message), newest last
        self.events_total = 0  # messages noted so far (``events`` keeps the last 50)
        self.phase = "starting"
        self._probe: KafkaProbe | None = None
        self._reader: FlowReader | None = None
        # the live view's readings run in a child process (picklable: a partial of KafkaProbe); tests that
        # put in-process fakes here set ``_flow_isolated = False``
        self._flow_probe: Callable[[], Any] = functools.partial(KafkaProbe, pipeline.kafka, options.offsets_topic)
        self._flow_isolated = True
        self._positions_at = 0.0
        self._positions: set[str] = set()

    # -- public ------------------------------------------------------------------------------------

    def part(self, name: str) -> PartState | None:
        """The state of part ``name``, ``None`` when it is not run here."""
        return next((p for p in self.parts if p.name == name), None)

    def run(self, stop: threading.Event, force: threading.Event | None = None) -> int:
        """Start the parts, supervise them until ``stop`` is set, then stop them in reverse order.

        Args:
            stop: set it (a signal handler) to stop the run.
            force: set it (a second signal) to kill the children at once while stopping.

        Returns:
            0 when every child stopped cleanly, 1 when one had to be killed or exited with an error.

        Raises:
            FatalError: a part failed to start (its exit code and the end of its log), or exited
                while ``restart`` is off.
            SetupError: Kafka cannot be reached (before it answered once in this run; later, a part
                waits for it), or a part waited longer than ``start_timeout_s``.
        """
        force = force or threading.Event()
        self._note(f"logs in {self.options.log_dir}")
        try:
            self._probe = KafkaProbe(self.pipeline.kafka, self.options.offsets_topic)
            while not stop.is_set():
                self.tick()
                self.on_update(self)
                stop.wait(0.5)
        finally:
            self.control.close()  # requests from now on are refused at once
            clean = self.shutdown(force)
            self.close()
        return 0 if clean else 1

    def start(self, ready: Callable[[], bool] | None = None, every_s: float = 1.0) -> None:
        """Tick until every part is ready, for a caller that drives the ticks itself (``threes demo``).

        Args:
            ready: an extra condition to wait for as well (``None``: none).
            every_s: seconds between ticks.

        Raises:
            FatalError, SetupError: as :meth:`run`; the children keep running (call :meth:`shutdown`).
        """
        while True:
            self.tick()
            self.on_update(self)
            if all(p.status == "ready" for p in self.parts) and (ready is None or ready()):
                return
            time.sleep(every_s)

    def pids(self) -> dict[str, int]:
        """Part name -> pid of its current process (parts started so far)."""
        return {p.name: p.child.pid for p in self.parts if p.child is not None}

    def restart_flow_reader(self) -> None:
        """Stop the live view's reader: the next tick starts one that reads the current pipeline's topics."""
        if self._reader is not None:
            self._reader.stop()
            self._reader = None

    def close(self) -> None:
        """Close the Kafka clients (after :meth:`shutdown`)."""
        self.restart_flow_reader()
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def tick(self) -> None:
        """One round of supervision (see the module docstring)."""
        self.control.run_pending()
        now = time.monotonic()
        for state in self.parts:
            if state.child is not None and state.status in ("starting", "ready"):
                code = state.child.returncode()
                if code is not None:
                    self._exited(state, code)
                elif state.status == "starting":
                    self._check_ready(state)
            elif state.status == "restarting" and state._restart_at is not None and now >= state._restart_at:
                self._spawn(state)
        self.control.tick()
        for i, state in enumerate(self.parts):
            if state.status != "waiting":
                continue
            try:
                if all(p.child is not None for p in self.parts[:i]) and self._needs_met(state):
                    if state.part.create_events is not None:
                        topic, spec = state.part.create_events
                        if self._probe_().ensure_topic(topic, spec):
                            self._note(f"created the events topic {topic} ({spec.partitions} partitions)")
                    self._spawn(state)
            except KafkaOutage as exc:  # it answered before: wait for it, up to the start timeout
                if not state.detail.startswith("waiting for Kafka"):
                    self._note(f"{state.name} waits for Kafka, which stopped answering: {exc}")
                state.detail = f"waiting for Kafka ({exc})"
            self._check_timeout(state, "to start")
            break  # one part at a time, in order
        for state in self.parts:
            if state.status == "starting":
                self._check_timeout(state, "to be ready")
        if all(p.status in ("ready", "paused") for p in self.parts):
            if self.phase != "running":
                self._note("every part is ready")
            self.phase = "running"
        elif self.phase in ("running", "recovering"):
            self.phase = "recovering"  # a part is being restarted
        if self._reader is None and self.options.flow_every_s != float("inf"):
            self._reader = FlowReader(
                self.pipeline, self._flow_probe, self.options.flow_every_s, isolated=self._flow_isolated
            )
            self._reader.start()
        if self._reader is not None and self._reader.latest is not None:
            self.flow = self._reader.latest

    def shutdown(self, force: threading.Event | None = None) -> bool:
        """Stop every started child in reverse start order; returns whether all stopped cleanly."""
        force = force or threading.Event()
        self.phase = "stopping"
        clean = True
        for state in reversed(self.parts):
            child = state.child
            if child is None or state.status in ("stopped", "failed"):
                state._restart_at = None
                if state.status in ("waiting", "restarting"):
                    state.set("stopped", "not started" if child is None else state.detail)
                continue
            if not child.alive():
                state.exit_code = child.returncode()
                state.set("stopped", f"exited with code {state.exit_code}")
                child.close_log()
                continue
            timeout = state.part.stop_timeout_s
            state.set("stopping", f"SIGTERM sent; up to {timeout:.0f} s for its clean stop")
            self.on_update(self)
            signal_group(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while child.alive() and time.monotonic() < deadline and not force.is_set():
                self.on_update(self)
                time.sleep(0.25)
            if child.alive():
                self._note(f"{state.name} did not stop in time: killing its process group")
                signal_group(child.pid, signal.SIGKILL)
                try:
                    child.process.wait(10)
                except Exception:  # a process that survives SIGKILL is reported, not raised
                    log.error("%s (pid %d) survived SIGKILL", state.name, child.pid)
                state.exit_code = None
                state.set("stopped", "killed")
                clean = False
            else:
                state.exit_code = child.returncode()
                state.set("stopped", f"exit code {state.exit_code}")
                # like systemd: death by the SIGTERM sent (a child still starting, before its handler) is clean
                clean = clean and state.exit_code in CLEAN_EXITS
                self._note(f"{state.name} stopped (exit code {state.exit_code})")
            signal_group(child.pid, signal.SIGTERM)  # what its group still holds (the Spark JVM, briefly)
            child.close_log()
        self.phase = "stopped"
        self.on_update(self)
        return clean

    # -- internals -----------------------------------------------------------------------------------

    def _probe_(self) -> KafkaProbe:
        if self._probe is None:
            self._probe = KafkaProbe(self.pipeline.kafka, self.options.offsets_topic)
        return self._probe

    def _note(self, message: str) -> None:
        log.info("run: %s", message)
        self.events.append((time.time(), message))
        self.events_total += 1
        del self.events[:-50]

    def _source_tasks(self) -> dict[str, int]:
        """Connector -> number of tasks (``task_count_for`` of its implementation)."""
        from connectors.runtime.standalone import task_specs

        counts: dict[str, int] = {}
        for spec in task_specs(self.pipeline.sources):
            counts[spec.config.name] = spec.task_count
        return counts

    def _spawn(self, state: PartState) -> None:
        log_path = self.options.log_dir / f"{state.name}.log"
        env = self.env if state.name != "sync" else {**self.env, PAUSE_FILE_ENV: str(self.control.pause_file)}
        try:
            state.child = spawn(state.name, state.part.args, log_path, env)
        except OSError as exc:
            raise FatalError(f"cannot start `threes {' '.join(state.part.args)}`: {exc}") from exc
        state._restart_at = None
        state.exit_code = None
        state.set("starting", "started")
        self._note(f"started {state.name} (pid {state.child.pid}): threes {' '.join(state.part.args)}")
        self._check_ready(state)

    def _needs_met(self, state: PartState) -> bool:
        part = state.part
        waiting: list[str] = []
        if part.wait_sources_ready:
            sources = self.part("sources")
            if sources is None or not sources.ever_ready:
                waiting.append("the sources' first snapshot")
        if part.topics:
            missing = self._probe_().missing(t.topic for t in part.topics)
            waiting += [f"topic {t.topic} (created by {t.creator})" for t in part.topics if t.topic in missing]
        if part.positions:
            now = time.monotonic()
            if now - self._positions_at >= 5.0:
                self._positions_at = now
                self._positions = self._probe_().stored_positions()
            waiting += [f"a stored position of source {n} (run elsewhere)" for n in part.positions
                        if n not in self._positions]
        state.detail = "waiting for " + ", ".join(waiting) if waiting else ""
        return not waiting

    def _check_ready(self, state: PartState) -> None:
        part = state.part
        if state.name == "sources":
            port = part.metrics_ports[0] if part.metrics_ports else None
            text = scrape(port, token=self._token(port)) if port is not None else None
            if part.metrics_ports and text is None:
                state.detail = "starting"
                return
            ready, waiting = sources_ready(source_cycles(text or ""), self.tasks)
            if waiting and part.metrics_ports:
                state.detail = f"first snapshot: {len(ready)}/{len(self.tasks)} done (waiting: {', '.join(waiting)})"
                return
            self._ready(state, f"{len(self.tasks)} source(s) caught up; polling")
        elif state.name == "stream":
            if part.metrics_ports and scrape(part.metrics_ports[0], token=self._token(part.metrics_ports[0])) is None:
                state.detail = "starting Spark, creating its topics, loading the snapshots"
                return
            self._ready(state, "every snapshot loaded; enriching events")
        else:
            texts = [scrape(p, token=self._token(p)) for p in part.metrics_ports]
            answering = [t for t in texts if t is not None]
            if len(answering) < len(part.metrics_ports):
                state.detail = f"starting ({len(answering)}/{len(part.metrics_ports)} services serve metrics)"
                return
            # serving metrics is not consuming: a restarted member may wait ~session.timeout.ms for partitions
            assigned: dict[str, int] = {}
            for text in answering:
                assigned.update(sync_assigned(text))
            waiting = sorted(name for name, n in assigned.items() if n <= 0)
            if waiting or not assigned and part.metrics_ports:
                state.detail = f"waiting for partitions ({', '.join(waiting) or 'no service reports them yet'})"
                return
            services = ", ".join(s.name for s in self.pipeline.sync)
            self._ready(state, f"consuming ({services})")

    def _token(self, port: int) -> str | None:
        """The bearer token of the config entry serving on ``port`` (``metrics_token``), if any."""
        entries = [self.pipeline.stream, *self.pipeline.sync]
        for entry in entries:
            if entry is not None and entry.metrics_port == port and entry.metrics_token is not None:
                return str(entry.metrics_token.get_secret_value())
        return None

    def _ready(self, state: PartState, detail: str) -> None:
        state.set("ready", detail)
        if not state.ever_ready or state.restarts:
            self._note(f"{state.name} ready: {detail}")
        state.ever_ready = True

    def _exited(self, state: PartState, code: int) -> None:
        child = state.child
        assert child is not None
        state.exit_code = code
        up_s = time.monotonic() - child.started
        child.close_log()
        what = f"`threes {' '.join(child.args)}` exited with code {code}"
        state.last_error = f"exit code {code}: {child.tail(3)}".strip()
        if state.status == "starting" and not state.ever_ready:
            state.set("failed", f"exit code {code} while starting")
            raise FatalError(f"{state.name} failed to start: {what}; the end of {child.log_path}:\n{child.tail()}")
        if not self.options.restart:
            state.set("failed", f"exit code {code}")
            raise FatalError(f"{state.name} stopped: {what} (--no-restart); the end of {child.log_path}:\n"
                             f"{child.tail()}")
        state._failures = 1 if up_s >= 60.0 else state._failures + 1
        delay = min(self.options.max_backoff_s, 2.0 ** (state._failures - 1))
        state.restarts += 1
        state._restart_at = time.monotonic() + delay
        state.set("restarting", f"exit code {code}; restart {state.restarts} in {delay:.0f} s")
        self._note(f"{state.name} exited with code {code} after {up_s:.0f} s; restarting in {delay:.0f} s "
                   f"(log: {child.log_path})")
        tail = child.tail()
        log.warning("run: %s%s", what, f"; the end of its log:\n{tail}" if tail else " (its log is empty)")

    def _check_timeout(self, state: PartState, what: str) -> None:
        limit = self.options.start_timeout_s
        if limit and time.monotonic() - state.since > limit:
            raise SetupError(
                f"{state.name} waited more than {limit:.0f} s {what}: {state.detail or state.status}",
                f"see {self.options.log_dir}; --start-timeout 0 waits forever",
            )
