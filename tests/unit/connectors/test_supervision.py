"""Unit tests of supervision: error policy, retry bounds, restart backoff, the source worker's restart loop."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError
from tenacity import Retrying, retry_if_exception_type, wait_none

from connectors.runtime.runner_state import RunnerStats
from connectors.runtime.standalone import SourceWorker, TaskSpec
from kernel.config.policies import ErrorPolicy, RetryPolicy
from kernel.exceptions import RetriableError
from kernel.supervision import RestartBackoff, describe_retry, retry_stop


def test_error_policy_defaults_and_bounds() -> None:
    e = ErrorPolicy()
    assert (e.retry_timeout_s, e.tolerance, e.retries_forever) == (300.0, "none", False)
    assert ErrorPolicy(retry_timeout_s=-1).retries_forever
    with pytest.raises(ValidationError, match="retry_timeout_s"):
        ErrorPolicy(retry_timeout_s=-2)
    with pytest.raises(ValidationError):
        ErrorPolicy(tolerance="some")
    assert [ErrorPolicy(restart_backoff_s=0.5, restart_max_backoff_s=3).restart_delay_s(n) for n in range(1, 6)] == [
        0.5, 1.0, 2.0, 3.0, 3.0]


def test_sources_take_tolerance_all_with_a_dead_letter_topic() -> None:
    from threes.config import pipeline_from_dict

    doc = {"kafka": {"bootstrap_servers": "127.0.0.1:1"},
           "connections": {"pg": {"type": "rds", "url": "postgresql+psycopg://u@127.0.0.1:1/d"}},
           "sources": [{"name": "s", "type": "rds_source", "connection": "pg", "topic": "t", "table": "x",
                        "mode": "incrementing", "incrementing_column": "id", "errors": {"tolerance": "all"}}]}
    source = pipeline_from_dict(doc).sources[0]
    assert source.errors.tolerance == "all"
    assert source.dead_letter_topic_name == "t.dlq"


def _attempts(errors: ErrorPolicy, retry: RetryPolicy, clock: list[float]) -> int:
    calls = 0

    def fail() -> None:
        nonlocal calls
        calls += 1
        clock[0] += 10.0  # every attempt takes 10 s
        raise RetriableError("down")

    r = Retrying(retry=retry_if_exception_type(RetriableError), stop=retry_stop(errors, retry), wait=wait_none(),
                 reraise=True, sleep=lambda _s: None)
    r.begin()
    import tenacity

    original = tenacity.time.monotonic
    tenacity.time.monotonic = lambda: clock[0]
    try:
        with pytest.raises(RetriableError):
            r(fail)
    finally:
        tenacity.time.monotonic = original
    return calls


def test_retries_are_bounded_by_time_not_attempts() -> None:
    # 35 s of retries at 10 s per attempt: 4 attempts (0, 10, 20, 30 s elapsed, the 4th ends at 40 > 35)
    assert _attempts(ErrorPolicy(retry_timeout_s=35), RetryPolicy(), [0.0]) == 4
    # max_attempts is an extra bound when set
    assert _attempts(ErrorPolicy(retry_timeout_s=1000), RetryPolicy(max_attempts=2), [0.0]) == 2
    assert describe_retry(ErrorPolicy(retry_timeout_s=-1), RetryPolicy()) == "forever"


def test_restart_backoff_grows_and_starts_over_after_progress() -> None:
    b = RestartBackoff(ErrorPolicy(restart_backoff_s=1, restart_max_backoff_s=4))
    assert [b.failed("x") for _ in range(4)] == [1, 2, 4, 4]
    b.restarting()
    b.succeeded()
    assert b.failed("y") == 1 and b.restarts == 1 and b.last_error == "y"


class _Runner:
    """A task runner that fails ``failures`` times, then runs until stopped."""

    runs: list[_Runner] = []

    def __init__(self, outcome: str):
        self.outcome = outcome
        self.stats = RunnerStats()
        _Runner.runs.append(self)

    def run(self, stop: threading.Event, once: bool) -> RunnerStats:
        if self.outcome == "failed":
            self.stats.state, self.stats.error = "failed", "database down"
        elif self.outcome == "unencodable":
            self.stats.state, self.stats.error = "failed", "key {'id': 2}: value cannot be encoded as Avro"
            self.stats.restartable = False
        else:
            stop.wait()
            self.stats.state = "stopped"
        return self.stats


def _worker(outcomes: list[str]) -> tuple[SourceWorker, TaskSpec]:
    from kernel.config.models import SourceConnectorConfig

    class Cfg(SourceConnectorConfig):
        implementation = "x:y"
        connection_type = "rds"
        type: str = "fake_source"

    worker = SourceWorker.__new__(SourceWorker)  # no Kafka: only the supervision loop is under test
    worker.runners, worker._threads, worker._stops, worker.finished, worker.backoffs = {}, {}, {}, {}, {}
    queue = list(outcomes)
    worker._runner = lambda spec: _Runner(queue.pop(0))  # type: ignore[method-assign]
    cfg = Cfg(name="src", connection="c", topic="t",
              errors=ErrorPolicy(restart_backoff_s=0.01, restart_max_backoff_s=0.02))
    return worker, TaskSpec(cfg, 0, 1)


def test_a_failed_source_task_is_restarted_with_backoff_until_it_runs() -> None:
    _Runner.runs = []
    worker, spec = _worker(["failed", "failed", "failed", "running"])
    worker.start(spec)
    thread = worker._threads[spec.key]
    for _ in range(500):
        if len(_Runner.runs) == 4:
            break
        thread.join(0.01)
    assert len(_Runner.runs) == 4 and worker.restarts() == {"src": 3}
    assert worker.backoffs["src"].last_error == "database down"
    assert worker.runners["src"] is _Runner.runs[-1]  # the live runner is the restarted one
    worker.stop()
    assert worker.finished["src"].state == "stopped"


def test_a_backfill_is_not_restarted() -> None:
    _Runner.runs = []
    worker, spec = _worker(["failed", "running"])
    worker.start(spec, once=True)
    worker._threads[spec.key].join(5)
    assert len(_Runner.runs) == 1 and worker.finished["src"].state == "failed" and worker.restarts() == {"src": 0}


def test_a_task_stopped_by_a_row_it_cannot_encode_is_not_restarted() -> None:
    """Issue #49: it would stop on the same row again; its one error line says how to move on."""
    _Runner.runs = []
    worker, spec = _worker(["unencodable", "running"])
    worker.start(spec)
    worker._threads[spec.key].join(5)
    assert len(_Runner.runs) == 1 and worker.restarts() == {"src": 0}
    assert worker.finished["src"].state == "failed" and "{'id': 2}" in (worker.finished["src"].error or "")
