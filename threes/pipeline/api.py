"""The management API of ``threes run``, on the port of its status page (Kafka Connect's REST conventions).

JSON in and out; an error is ``{"error": "..."}`` with its status code (404 an unknown part,
409 a request the part's state forbids, 400 an invalid pipeline, 401/403 refused by the
guard of :mod:`kernel.status.guard`).

=========================================  =====================================================
``GET /parts``                             every part: state, lag, last error, restarts, revision
``GET /parts/{name}`` (``/status``)        one part
``POST /parts/{name}/pause|resume|restart``  ``202``: carried out at the supervisor's next tick
``GET /parts/{name}/offsets``              the sources' stored positions; the sync services'
                                           committed records and lag
``DELETE /parts/{name}/offsets``           the sources' positions forgotten (they snapshot again);
                                           ``409`` unless the sources are paused or stopped
``GET /pipeline``                          the run's config file and revision
``PUT /pipeline``                          a new YAML revision: ``400`` with ``validate``'s
                                           ``file:line`` problems, else written and only the parts
                                           whose config changed restarted
=========================================  =====================================================
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel.exceptions import ConfigError, ThreesError
from kernel.redact import redact
from threes.pipeline.control import ActionError, api_state
from threes.pipeline.revisions import changed_parts, part_revisions

if TYPE_CHECKING:
    from kernel.status.http import StatusServer
    from threes.pipeline.parts import PartState
    from threes.pipeline.supervisor import Supervisor

log = logging.getLogger(__name__)

ACTIONS = ("pause", "resume", "restart")


def part_document(sup: Supervisor, state: PartState) -> dict[str, Any]:
    """What the API says of one part (no secret: names, states, counts, redacted error text)."""
    flow = sup.flow
    lag = sum(flow.lag.values()) if flow is not None and state.name == "sync" and flow.lag else None
    return {
        "name": state.name,
        "state": api_state(state),
        "detail": "holds its partitions and consumes nothing"
        if state.paused and state.name == "sync"
        else state.detail,
        "paused": state.paused,
        "pid": state.child.pid if state.child is not None and state.child.alive() else None,
        "for_s": round(time.monotonic() - state.since, 1),
        "restarts": state.restarts,
        "lag": lag,
        "last_error": redact(state.last_error) if state.last_error else None,
        "config_revision": state.revision,
    }


def run_document(sup: Supervisor) -> dict[str, Any]:
    """The run's status document (``/status.json`` and the page): its phase, revision and parts."""
    return {
        "config": str(sup.options.config),
        "phase": sup.phase,
        "revision": sup.revision,
        "parts": [part_document(sup, s) for s in sup.parts],
    }


class ManagementApi:
    """The routes of the management API over one supervisor.

    Args:
        sup: the running supervisor.
    """

    def __init__(self, sup: Supervisor):
        self.sup = sup

    def mount(self, server: StatusServer) -> None:
        """Add the API's routes to ``server``."""
        server.add_route("/parts", self.read)
        server.add_route("/pipeline", self.read)
        server.add_action("/parts", self.act)
        server.add_action("/pipeline", self.act)

    # -- GET ------------------------------------------------------------------------------------

    def read(self, path: str, _query: dict[str, list[str]]) -> tuple[int, Any]:
        """``GET`` under ``/parts`` and ``/pipeline``."""
        steps = [p for p in path.split("/") if p]
        if steps == ["pipeline"]:
            return 200, {
                "config": str(self.sup.options.config),
                "revision": self.sup.revision,
                "parts": {s.name: s.revision for s in self.sup.parts},
            }
        if steps == ["parts"]:
            return 200, [part_document(self.sup, s) for s in self.sup.parts]
        state = self.sup.part(steps[1])
        if state is None:
            return 404, {"error": f"no part {steps[1]!r} in this run"}
        if len(steps) == 2 or steps[2:] == ["status"]:
            return 200, part_document(self.sup, state)
        if steps[2:] == ["offsets"]:
            try:
                return 200, self._offsets(state.name)
            except ThreesError as exc:
                return 503, {"error": str(exc)}
        return 404, {"error": f"not found: {path}"}

    def _offsets(self, name: str) -> dict[str, Any]:
        if name == "sources":
            stored = self._store()[0]
            return {
                "part": name,
                "offsets": [
                    {
                        "key": p.key,
                        "connector": p.connector,
                        "task": p.task,
                        "topic": p.topic,
                        "position": p.position,
                        "updated_ms": p.updated_ms,
                    }
                    for p in stored
                ],
            }
        if name == "sync":
            flow = self.sup.flow
            if flow is None:
                return {"part": name, "offsets": []}
            return {
                "part": name,
                "offsets": [
                    {"service": svc, "committed": committed, "lag": flow.lag.get(svc)}
                    for svc, committed in flow.committed.items()
                ],
            }
        stream = self.sup.pipeline.stream
        return {"part": name, "offsets": [], "checkpoint": str(stream.checkpoint_location)}

    def _store(self) -> tuple[list[Any], Any]:
        from connectors.runtime.offsets import OffsetStore
        from kernel.kafka.topics import internal_topic_options

        pipeline = self.sup.pipeline
        names = {s.name for s in pipeline.sources}
        store = OffsetStore(
            pipeline.kafka.librdkafka_config(), self.sup.options.offsets_topic, **internal_topic_options(pipeline.kafka)
        )
        stored = sorted((p for p in store.load_all().values() if p.connector in names), key=lambda p: p.key)
        return stored, store

    # -- POST, PUT, DELETE ------------------------------------------------------------------------

    def act(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """A state-changing request (after the guard)."""
        steps = [p for p in path.split("/") if p]
        try:
            if steps == ["pipeline"]:
                if method != "PUT":
                    return 405, {"error": "PUT /pipeline with the new YAML as the body"}
                return self._put_pipeline(body)
            if len(steps) == 3 and steps[2] in ACTIONS and method == "POST":
                name, action = steps[1], steps[2]
                state = self.sup.control.submit(lambda: getattr(self.sup.control, action)(name))
                return 202, {"name": name, "action": action, "state": state}
            if len(steps) == 3 and steps[2] == "offsets" and method == "DELETE":
                return self.sup.control.submit(lambda: self._reset(steps[1]))
        except ActionError as exc:
            return exc.code, {"error": str(exc)}
        except ThreesError as exc:
            return 503, {"error": str(exc)}
        return 405, {
            "error": f"{method} {path}: not an action (POST /parts/NAME/pause|resume|restart, "
            "DELETE /parts/NAME/offsets, PUT /pipeline)"
        }

    def _reset(self, name: str) -> tuple[int, Any]:
        """Forget the sources' stored positions (on the supervisor's thread: no resume meanwhile)."""
        from kernel.kafka import clients

        state = self.sup.control.state(name)
        if name != "sources":
            raise ActionError(400, f"{name} keeps no positions to reset (only the sources do)")
        if state.child is not None and state.child.alive():
            raise ActionError(409, f"{name} is {api_state(state)}: pause it first (POST /parts/{name}/pause)")
        stored, store = self._store()
        keys = [p.key for p in stored]
        if keys:
            store.reset(keys, clients.kafka_producer(self.sup.pipeline.kafka))
        self.sup._note(f"reset {len(keys)} source position(s): resumed sources snapshot again")
        return 200, {"name": name, "reset": keys}

    def _put_pipeline(self, body: bytes) -> tuple[int, Any]:
        """Validate a new revision as ``threes validate`` does; write it and restart the parts it changes."""
        config = Path(self.sup.options.config)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return 400, {"error": "the body is not UTF-8 text"}
        new = self._validate(config, text)
        if isinstance(new, list):
            return 400, {"error": f"invalid pipeline: {len(new)} problem(s)", "problems": new}
        from threes.pipeline.plan import plan_run

        options = self.sup.options
        fresh = {
            p.name: p
            for p in plan_run(new, config, options.only, offsets_topic=options.offsets_topic, **self.sup.ports)
        }
        if set(fresh) != {s.name for s in self.sup.parts}:
            return 409, {
                "error": f"the revision runs other parts ({', '.join(fresh)}) than this run "
                f"({', '.join(s.name for s in self.sup.parts)}): restart `threes run` for it"
            }
        changed = [p for p in changed_parts(self.sup.pipeline, new) if p in fresh]
        return 200, self.sup.control.submit(lambda: self._apply(config, text, new, {n: fresh[n] for n in changed}))

    @staticmethod
    def _validate(config: Path, text: str) -> Any:
        """The new pipeline, or its problems as ``file:line: key: message`` lines naming ``config``."""
        from threes.config import load_pipeline
        from threes.schemas_check import schema_problems

        draft = config.with_name(f".{config.name}.{os.getpid()}.new")
        try:
            draft.write_text(text)
            pipeline = load_pipeline(draft)
            problems = schema_problems(pipeline, draft)
            if problems:
                raise ConfigError(problems)
        except ConfigError as exc:
            return [redact(str(p)).replace(str(draft), str(config)) for p in exc.problems]
        finally:
            draft.unlink(missing_ok=True)
        return pipeline

    def _apply(self, config: Path, text: str, new: Any, changed: dict[str, Any]) -> dict[str, Any]:
        """Write the revision (atomically), then restart what changed (the supervisor's thread).

        Args:
            config: the run's config file.
            text: the new YAML.
            new: its pipeline.
            changed: part name -> its new plan (:class:`~threes.pipeline.plan.Part`), for the parts it changes.
        """
        tmp = config.with_name(f".{config.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, config)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise ActionError(409, f"cannot write {config}: {exc.strerror}") from None
        sup = self.sup
        sup.pipeline = new
        sup.revision += 1
        if "sources" in changed:
            sup.tasks = sup._source_tasks()
        sup.restart_flow_reader()  # the live view reads the new revision's topics and groups
        revisions = part_revisions(new)
        restarted = []
        for name, part in changed.items():
            state = sup.control.state(name)
            state.part, state.revision = part, revisions[name]
            if state.status in ("starting", "ready", "restarting"):
                sup.control.restart(name)
                restarted.append(name)
        sup._note(f"config revision {sup.revision}: restarted {', '.join(restarted) or 'nothing'}")
        return {"revision": self.sup.revision, "changed": list(changed), "restarted": restarted}
