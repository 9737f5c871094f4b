"""The progress listener: its bookkeeping of query ends (what StreamJob.stop waits for), and counted queries."""

from __future__ import annotations

import threading
import uuid
from types import SimpleNamespace

from stream_app.progress import ProgressListener


def query(active: bool = True) -> SimpleNamespace:
    return SimpleNamespace(id=uuid.uuid4(), runId=str(uuid.uuid4()), isActive=active)


def terminated(q: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(id=q.id, runId=uuid.UUID(q.runId), exception=None)


def test_waits_for_the_end_of_every_query_running_when_registered():
    late = ProgressListener("job")
    enrich, aggregate, ended_before = query(), query(), query(active=False)
    late.expect(enrich)
    late.expect(ended_before)  # its end may have been delivered before the listener was added: not waited for
    late.watch(aggregate, "updates.delays")
    late.onQueryTerminated(terminated(enrich))
    assert not late.wait_terminated(0.01)  # the aggregation's end has not arrived
    ender = threading.Thread(target=late.onQueryTerminated, args=(terminated(aggregate),))
    ender.start()
    assert late.wait_terminated(30)
    ender.join()


def test_an_end_delivered_before_expect_counts():
    late = ProgressListener("job")
    q = query()
    late.onQueryTerminated(terminated(q))  # the bus was faster than expect()
    late.expect(q)
    assert late.wait_terminated(0)


def test_a_counted_querys_progress_goes_to_its_callback_and_no_other():
    listener = ProgressListener("job")
    counted, other = query(), query()
    got: list[int] = []
    listener.count(counted, lambda progress: got.append(progress.batchId))
    listener.expect(other)
    for q, epoch in ((counted, 3), (other, 7), (counted, 4)):
        listener.onQueryProgress(SimpleNamespace(progress=SimpleNamespace(id=q.id, batchId=epoch, stateOperators=[])))
    assert got == [3, 4]
    listener.onQueryTerminated(terminated(other))
    assert not listener.wait_terminated(0)  # a counted query's end is waited for too
    listener.onQueryTerminated(terminated(counted))
    assert listener.wait_terminated(0)
