"""The operator's requests to a run's parts (:mod:`threes.pipeline.control`), on real child processes.

A stand-in supervisor starts ``sleep`` processes (each in its own session, as the real
parts) and the controls act on them with real signals: a paused source or stream job is
stopped and stays stopped until resumed, a paused sync process keeps running with its
pause file present, a restart is a stop and a start, a part that ignores SIGTERM is killed
once its stop time is up, and requests from other threads wait for the next tick.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from threes.pipeline.control import ActionError, Controls, api_state
from threes.pipeline.parts import PartState, RunOptions
from threes.pipeline.plan import Part
from threes.pipeline.processes import Child


class StandIn:
    """What :class:`~threes.pipeline.control.Controls` uses of a supervisor, with ``sleep`` as every part."""

    def __init__(self, tmp: Path, command: list[str] | None = None):
        self.options = RunOptions(config=tmp / "pipeline.yaml", log_dir=tmp / "logs")
        self.command = command or ["sleep", "60"]
        self.parts = [PartState(Part(name, [], stop_timeout_s=10.0)) for name in ("sources", "stream", "sync")]
        self.notes: list[str] = []
        self.control = Controls(self, wait_s=10.0)  # type: ignore[arg-type]
        for state in self.parts:
            self._spawn(state)
            state.set("ready")

    def part(self, name: str) -> PartState | None:
        return next((p for p in self.parts if p.name == name), None)

    def _note(self, message: str) -> None:
        self.notes.append(message)

    def _spawn(self, state: PartState) -> None:
        process = subprocess.Popen(self.command, start_new_session=True)
        state.child = Child(state.name, [], self.options.log_dir / f"{state.name}.log", process, time.monotonic())
        state.set("starting", "started")

    def tick_until(self, done: object, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, [api_state(p) for p in self.parts]
            self.control.run_pending()  # as the supervisor's tick does, first
            self.control.tick()
            time.sleep(0.05)

    def stop(self) -> None:
        for state in self.parts:
            if state.child is not None and state.child.alive():
                state.child.process.kill()
                state.child.process.wait(10)


@pytest.fixture
def sup(tmp_path: Path):
    stand_in = StandIn(tmp_path)
    yield stand_in
    stand_in.stop()


def test_a_paused_source_stops_and_stays_stopped_until_resumed(sup: StandIn) -> None:
    sources = sup.part("sources")
    assert sources is not None and sources.child is not None
    first = sources.child
    assert sup.control.pause("sources") == "pausing"
    sup.tick_until(lambda: api_state(sources) == "paused")
    assert not first.alive() and first.returncode() == -15  # SIGTERM: its clean stop
    for _ in range(5):  # ticks go by: nothing starts it again
        sup.control.tick()
    assert sources.child is first and sources.paused
    assert sup.control.resume("sources") == "starting"
    assert sources.child is not first and sources.child.alive() and not sources.paused


def test_a_paused_sync_process_keeps_running_with_its_pause_file(sup: StandIn) -> None:
    sync = sup.part("sync")
    assert sync is not None and sync.child is not None
    assert sup.control.pause("sync") == "paused"
    assert sup.control.pause_file.exists() and sync.child.alive()
    assert sup.control.pause("sync") == "paused"  # twice: nothing more
    assert sup.control.resume("sync") == "ready"
    assert not sup.control.pause_file.exists() and sync.child.alive()


def test_a_restart_stops_and_starts_and_counts(sup: StandIn) -> None:
    stream = sup.part("stream")
    assert stream is not None and stream.child is not None
    first = stream.child
    assert sup.control.restart("stream") == "stopping"
    sup.tick_until(lambda: stream.child is not first)
    assert stream.restarts == 1 and stream.child.alive() and not first.alive()


def test_a_resume_while_the_pause_is_stopping_the_part_starts_it_again(sup: StandIn) -> None:
    stream = sup.part("stream")
    assert stream is not None and stream.child is not None
    first = stream.child
    sup.control.pause("stream")
    sup.control.resume("stream")
    sup.tick_until(lambda: stream.child is not first)
    assert api_state(stream) == "starting" and not stream.paused


def test_requests_the_state_forbids_are_refused(sup: StandIn) -> None:
    with pytest.raises(ActionError) as unknown:
        sup.control.pause("nothing")
    assert unknown.value.code == 404 and "parts: sources, stream, sync" in str(unknown.value)
    sup.control.pause("stream")
    with pytest.raises(ActionError) as paused:
        sup.control.restart("stream")
    assert paused.value.code == 409 and "resume it instead" in str(paused.value)
    sources = sup.part("sources")
    assert sources is not None
    sources.set("waiting")
    with pytest.raises(ActionError) as waiting:
        sup.control.pause("sources")
    assert waiting.value.code == 409


def test_a_part_that_ignores_sigterm_is_killed_once_its_stop_time_is_up(tmp_path: Path) -> None:
    stubborn = StandIn(tmp_path, ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"])
    try:
        sources = stubborn.part("sources")
        assert sources is not None and sources.child is not None
        sources.part.stop_timeout_s = 0.5
        time.sleep(0.3)  # the shell has set its trap
        stubborn.control.pause("sources")
        stubborn.tick_until(lambda: api_state(sources) == "paused")
        assert sources.child.returncode() == -9
        assert any("did not stop in time" in note for note in stubborn.notes)
    finally:
        stubborn.stop()


def test_a_request_from_another_thread_waits_for_the_next_tick_and_a_closed_run_refuses(sup: StandIn) -> None:
    answers: list[str] = []
    caller = threading.Thread(target=lambda: answers.append(sup.control.submit(lambda: sup.control.pause("sync"))))
    caller.start()
    time.sleep(0.2)
    assert answers == [] and not sup.control.pause_file.exists()  # not carried out off the supervisor's thread
    sup.tick_until(lambda: answers)
    caller.join(5)
    assert answers == ["paused"]
    sup.control.close()
    with pytest.raises(ActionError) as closed:
        sup.control.submit(lambda: "anything")
    assert closed.value.code == 503
