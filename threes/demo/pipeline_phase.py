"""The demo's **pipeline** phase: replay the flights, make the reference changes, watch the sinks fill.

From the first replayed flight until every sink holds every flight (the phase the 120 s target is
about): the replay runs in a thread of its own, the watching loop ticks the supervisor, reads the
progress about once a second, samples latencies, measures CPU per component and drives the
mid-stream reference changes. :class:`PipelinePhase` returns the phase's part of the summary.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernel.exceptions import FatalError, ThreesError
from threes.demo.changes import ChangeDriver, default_changes
from threes.demo.data import FLIGHT_KEY
from threes.demo.latency import LatencySampler
from threes.demo.monitor import Progress, ProgressProbe, Targets

if TYPE_CHECKING:
    from threes.demo.replay import Replayer, ReplayStats
    from threes.demo.run import DemoRun

log = logging.getLogger(__name__)


class PipelinePhase:
    """One demo run's pipeline phase (see the module docstring).

    Args:
        run: the demo run (its options, live state, supervisor and phase timer).
        pipeline: the pipeline config.
        targets: what the run watches.
        probe: reads the progress.
        flights: the Arrow table of the flights to replay, in event-time order.
        references: the reference tables as loaded (the changes are made to them).
    """

    def __init__(self, run: DemoRun, pipeline: Any, targets: Targets, probe: ProgressProbe, flights: Any,
                 references: dict[str, Any]):
        from threes.demo.oracle import ROUTE_KEY

        self.run_ = run
        self.pipeline = pipeline
        self.targets = targets
        self.probe = probe
        self.flights = flights
        opts, state = run.options, run.state
        self.total = state.total
        self.sinks = targets.sinks  # what "every sink holds every flight" waits for
        self.sampler = LatencySampler(probe, FLIGHT_KEY, ROUTE_KEY, every=opts.sample_every)
        state.changes = default_changes() if opts.changes else []
        self.driver = ChangeDriver(pipeline, probe, state.changes, self.total, references, exact=opts.exact_changes)
        self.replayer = self._replayer()

    def run(self) -> dict[str, Any]:
        """Replay, make the changes, watch until every sink is complete; the phase's summary."""
        from threes.demo.replay import ReplayStats

        run, opts = self.run_, self.run_.options
        stats = ReplayStats()
        failure: list[BaseException] = []
        done = run._phase("pipeline")
        meter = cpu_meter(run.supervisor, self.pipeline)
        thread = self._start_replay(self.replayer, stats, failure)
        while stats.started is None and thread.is_alive():
            time.sleep(0.05)
        t0 = stats.started or time.time()
        run.state.first_event_at = t0
        self._watch(thread, stats, failure, meter, deadline=t0 + opts.timeout_s)
        cpu = run.state.cpu = meter.read().as_dict(self.total, per="flight") if meter is not None else {}
        progress = run.state.progress = self.probe.read(fresh=True)  # lists the archive now, for the sampler too
        self.sampler.poll()
        done()
        return self._summary(stats, progress, t0, cpu)

    def _replayer(self) -> Replayer:
        from schemas import load_schema
        from threes.demo.replay import Replayer

        opts = self.run_.options
        return Replayer(
            self.pipeline.kafka,
            self.targets.events_topic,
            load_schema("nycflights13/flight"),
            FLIGHT_KEY,
            key_schema=load_schema("nycflights13/flight_key"),
            partitions=opts.partitions,
            rate=opts.rate,
        )

    def _start_replay(self, replayer: Replayer, stats: ReplayStats,
                      failure: list[BaseException]) -> threading.Thread:
        """Start replaying the flights in a thread; an exception it raises goes to ``failure``."""
        from threes.demo.replay import table_source

        def on_produce(index: int, row: dict[str, Any]) -> None:
            self.sampler.on_produce(index, row)
            self.driver.gate(index)

        def replay() -> None:
            try:
                replayer.run(table_source(self.flights, "nycflights13 flights"), stats, on_produce=on_produce)
            except BaseException as exc:  # reported by the watching loop
                failure.append(exc)

        thread = threading.Thread(target=replay, name="demo-replay", daemon=True)
        thread.start()
        return thread

    def _watch(self, thread: threading.Thread, stats: ReplayStats, failure: list[BaseException], meter: Any,
               deadline: float) -> None:
        """Tick, read the progress and drive the changes about once a second until every sink is complete.

        Raises:
            FatalError: a part exited, the replay failed, or ``deadline`` passed first.
        """
        run = self.run_
        state = run.state
        completed: dict[str, float] = state.sinks_done
        tick = 0
        while True:
            run.supervisor.tick()  # raises when a part exited (no restarts in the demo)
            if failure:
                raise failure[0] if isinstance(failure[0], ThreesError) else FatalError(f"replay: {failure[0]}")
            progress = self.probe.read()
            state.progress, state.events_in, state.replay_rate = progress, stats.acked, stats.rate
            if "replay" not in completed and not thread.is_alive():
                completed["replay"] = stats.finished or time.time()
            self._note_sinks(progress, completed)
            all_sinks = {"replay", *self.sinks} <= set(completed)
            if tick % 2 == 0 or all_sinks:
                self.sampler.poll()
                state.latencies = self.sampler.latencies()
            if meter is not None and tick % 5 == 0:
                state.cpu = meter.read().as_dict(stats.acked, per="flight")
            self.driver.poll(stats.produced, progress.enriched_out)
            run.on_update(state)
            if all_sinks and not _waiting_for_changes(self.driver, progress.at, completed, self.sinks):
                return
            if time.time() > deadline:
                raise self._late(stats, progress)
            tick += 1
            time.sleep(1.0)

    def _note_sinks(self, progress: Progress, completed: dict[str, float]) -> None:
        """Record in ``completed`` when each sink first held every flight."""
        total = self.total
        search = _service_of(self.pipeline, "elasticsearch_sink")
        if progress.es_docs < total <= progress.committed.get(search, 0) and progress.lag.get(search, 1) == 0:
            self.probe.es_refresh()  # the sink has written everything: make it visible to the count now
            progress.es_docs = self.probe.es_count()
        if progress.es_docs >= total:
            completed.setdefault("elasticsearch", progress.at)
        if progress.pg_flights is not None and progress.pg_flights >= total:
            completed.setdefault("postgres", progress.at)
        archive = _service_of(self.pipeline, "s3_sink")
        if progress.committed.get(archive, 0) >= total and progress.lag.get(archive, 1) == 0:
            completed.setdefault("s3", progress.at)

    def _late(self, stats: ReplayStats, progress: Progress) -> FatalError:
        opts = self.run_.options
        return FatalError(
            f"not complete {opts.timeout_s:.0f} s after the first flight: events in "
            f"{stats.acked}/{self.total}, enriched {progress.enriched_out}, Elasticsearch "
            f"{progress.es_docs}, route_stats flights {_or_none(progress.pg_flights)}, archive committed "
            f"{progress.committed.get(_service_of(self.pipeline, 's3_sink'), 0)} (logs: {self.run_.log_dir})"
        )

    def _summary(self, stats: ReplayStats, progress: Progress, t0: float, cpu: dict[str, Any]) -> dict[str, Any]:
        """The phase's part of the demo's summary (JSON-ready)."""
        opts, targets, sinks, total = self.run_.options, self.targets, self.sinks, self.total
        completed = self.run_.state.sinks_done
        until = round(max(completed[s] for s in sinks) - t0, 1)
        checked = {
            "elasticsearch": {"index": targets.es[1], "docs": progress.es_docs},
            "s3": {
                "bucket": targets.s3[1],
                "prefix": targets.s3[2],
                "objects": progress.s3_objects,
                "rows": progress.committed.get(_service_of(self.pipeline, "s3_sink"), 0),
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
                "paused_for_changes_s": round(self.driver.paused_s, 1),
            },
            "first_flight_to_sink_complete_s": {s: round(completed[s] - t0, 1) for s in sinks},
            "first_flight_to_all_sinks_s": until,
            "target_s": opts.target_s,
            "target_met": until <= opts.target_s,
            "throughput_events_per_s": round(total / max(until, 1e-6)),
            "sinks": {s: checked[s] for s in sinks},
            "latency_s": self.sampler.latencies(),
            "latency_note": f"1 flight in {opts.sample_every} sampled; produce call to first poll (~1 s) that sees it",
            "lag": dict(progress.lag),
            "cpu": cpu,
        }


def cpu_meter(supervisor: Any, pipeline: Any) -> Any:
    """Start measuring CPU per component (``None`` where ``/proc`` cannot be read: not Linux).

    Components: each pipeline process (``sources``, ``sync``, ``stream``), this process
    (``demo``: the replay and the watcher) and the local stack's servers it recorded (the
    Spark standalone cluster's only when the stream job runs on a ``spark://`` master).
    """
    from threes.demo.cpu import CpuMeter, stack_pids

    def roots() -> dict[str, int]:
        out = dict(supervisor.pids())
        out["demo"] = os.getpid()
        try:
            servers = stack_pids()
            stream = getattr(pipeline, "stream", None)
            if stream is None or not str(stream.spark.master).startswith("spark://"):
                # a standalone cluster left running (tests, another job) does no work for this demo
                servers = {k: v for k, v in servers.items() if not k.startswith("spark-")}
            out.update(servers)
        except Exception as exc:  # measuring must never fail the run
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
