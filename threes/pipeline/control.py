"""What an operator asks of a running ``threes run``: pause, resume, restart a part, reload the config.

The management API (:mod:`threes.pipeline.api`) answers on the HTTP server's threads; the
supervisor owns the parts on its own thread. So a request is handed over
(:meth:`Controls.submit`) and carried out at the start of the supervisor's next tick, about
twice a second; its answer goes back to the waiting request. Nothing blocks a tick: a
part that must stop is sent SIGTERM and marked ``stopping``; each tick then looks whether it
exited (or kills its group once its clean-stop time is up) and does what was asked next.

* **pause** a source or the stream job: its process stops cleanly (the sources store their
  positions, the stream job finishes its micro-batch and checkpoint) and is not restarted:
  nothing polls. **resume** starts it again: the sources from their stored positions, the
  stream job from its checkpoint.
* **pause** the sync services: the process keeps running and keeps its partitions, but
  consumes nothing (``Consumer.pause``, see :mod:`sync_service.service`): the supervisor
  creates the pause file named by ``$THREES_PAUSE_FILE`` in the child's environment, which
  every sync service looks at each turn; a restarted child starts paused. Committed offsets
  stay where they were. **resume** deletes the file.
* **restart**: a clean stop, then a start at once (counted in ``restarts``).
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from threes.pipeline.processes import signal_group

if TYPE_CHECKING:
    from threes.pipeline.parts import PartState
    from threes.pipeline.supervisor import Supervisor

log = logging.getLogger(__name__)

PAUSE_FILE_ENV = "THREES_PAUSE_FILE"
"""The variable that names a sync process's pause file (it consumes nothing while the file exists)."""


class ActionError(Exception):  # an answer of the API, not a failure of the run
    """A request that cannot be carried out now: ``code`` (404, 409) and why."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class Controls:
    """The operator's requests to one supervisor (see the module docstring).

    Args:
        sup: the supervisor.
        wait_s: how long :meth:`submit` waits for the supervisor to take a request, seconds.
    """

    def __init__(self, sup: Supervisor, wait_s: float = 30.0):
        self.sup = sup
        self.wait_s = wait_s
        self._pending: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self.closed = False

    @property
    def pause_file(self) -> Path:
        """The sync process's pause file (in the run's log folder: a new run starts unpaused)."""
        return self.sup.options.log_dir / "sync.paused"

    def submit(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` on the supervisor's thread at its next tick; returns its result.

        Raises:
            ActionError: what ``action`` raised, or 503 when the supervisor did not take it in time.
        """
        if self.closed:
            raise ActionError(503, "the run is stopping")
        future: Future[Any] = Future()
        self._pending.put((action, future))
        try:
            return future.result(self.wait_s)
        except TimeoutError:
            raise ActionError(503, "the supervisor did not take the request in time: try again") from None

    def close(self) -> None:
        """Refuse requests from now on (the run stops), and those still waiting."""
        self.closed = True
        while True:
            try:
                _action, future = self._pending.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(ActionError(503, "the run is stopping"))

    def run_pending(self) -> None:
        """Carry out the requests handed over since the last tick (the supervisor's thread)."""
        while True:
            try:
                action, future = self._pending.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(action())
            except BaseException as exc:  # the request's answer, whatever went wrong
                future.set_exception(exc)

    # -- requests (on the supervisor's thread) -------------------------------------------------------

    def state(self, name: str) -> PartState:
        """The part ``name``, or :class:`ActionError` 404."""
        found = self.sup.part(name)
        if found is None:
            names = ", ".join(p.name for p in self.sup.parts)
            raise ActionError(404, f"no part {name!r} in this run (parts: {names})")
        return found

    def pause(self, name: str) -> str:
        """Pause part ``name``; returns its state after the request."""
        state = self.state(name)
        if state.paused:
            return api_state(state)
        if state.status in ("waiting", "failed", "stopped"):
            raise ActionError(409, f"{name} is {state.status}: only a started part can be paused")
        state.paused = True
        if name == "sync":
            self.pause_file.parent.mkdir(parents=True, exist_ok=True)
            self.pause_file.write_text("paused by the management API\n")
            self.sup._note("sync paused: its services hold their partitions and consume nothing")
        else:
            self._stop(state, "pause")
        return api_state(state)

    def resume(self, name: str) -> str:
        """Resume part ``name``; returns its state after the request."""
        state = self.state(name)
        if not state.paused:
            return api_state(state)
        state.paused = False
        if name == "sync":
            self.pause_file.unlink(missing_ok=True)
            self.sup._note("sync resumed")
        elif state.status == "paused":
            self.sup._spawn(state)
        elif state._intent == "pause":
            state._intent = "restart"  # still stopping: start again once it stopped
        return api_state(state)

    def restart(self, name: str) -> str:
        """Restart part ``name`` (a clean stop, then a start); returns its state after the request."""
        state = self.state(name)
        if state.status == "paused" or state._intent == "pause":
            raise ActionError(409, f"{name} is paused: resume it instead")
        if state.status == "restarting":
            self.sup._spawn(state)
            return api_state(state)
        if state.status not in ("starting", "ready"):
            raise ActionError(409, f"{name} is {state.status}: only a started part can be restarted")
        self._stop(state, "restart")
        return api_state(state)

    def _stop(self, state: PartState, then: str) -> None:
        """Send the part's process group SIGTERM; :meth:`tick` does ``then`` once it exited."""
        child = state.child
        if child is None or not child.alive():
            state._intent = then
            return
        timeout = state.part.stop_timeout_s
        state._intent, state._stop_deadline = then, time.monotonic() + timeout
        state.set("stopping", f"stopping to {then}; up to {timeout:.0f} s for its clean stop")
        self.sup._note(f"{state.name}: {then} requested: SIGTERM sent")
        signal_group(child.pid, signal.SIGTERM)

    # -- progress (each tick) ----------------------------------------------------------------------

    def tick(self) -> None:
        """Carry on the stops under way: once a part exited, pause it or start it again."""
        for state in self.sup.parts:
            if state._intent is None:
                continue
            child = state.child
            if child is not None and child.alive():
                if state._stop_deadline is not None and time.monotonic() > state._stop_deadline:
                    self.sup._note(f"{state.name} did not stop in time: killing its process group")
                    signal_group(child.pid, signal.SIGKILL)
                    state._stop_deadline = None
                continue
            if child is not None:
                state.exit_code = child.returncode()
                signal_group(child.pid, signal.SIGTERM)  # what its group still holds (the Spark JVM, briefly)
                child.close_log()
            then, state._intent, state._stop_deadline = state._intent, None, None
            if then == "restart":
                state.restarts += 1
                self.sup._spawn(state)
            else:
                state.set("paused", f"paused (exit code {state.exit_code}); resume starts it again")
                self.sup._note(f"{state.name} paused")


def api_state(state: PartState) -> str:
    """The state the API shows: the supervisor's status, ``paused`` for a paused part that stopped or holds."""
    if state.paused and state.status in ("ready", "starting", "paused"):
        return "paused"
    if state._intent == "pause":
        return "pausing"
    return state.status
