"""SourceContract: what every source connector must do, against its real system and a real Kafka.

A subclass says how to create, change and read its system (a table, an index, a
bucket prefix, a folder); the contract then checks, for every source:

* a first run snapshots the system: the topic's latest value per key equals the
  system's current state, compared row by row;
* inserts, updates and deletes in the system appear as records and tombstones,
  and the topic again equals the system;
* a second run with nothing changed adds no live key and changes no value (a
  replay is harmless), and the stored position is not moved backwards;
* ``threes offsets reset`` makes the next run re-snapshot;
* bad credentials fail the task with a clear error that holds no secret.

Kafka comes from the kit's plugin (:mod:`threes.testing.plugin`: ``--threes-kafka`` or
``THREES_KAFKA_BOOTSTRAP``); the system is the subclass's business (its own fixtures,
reached through ``ctx["request"].getfixturevalue``). Example::

    from threes.testing.source import SourceContract

    class TestMySourceContract(SourceContract):
        def setup_system(self, ctx): ...      # create the table/index/prefix, names into ctx
        def connections(self, ctx): ...       # the `connections:` mapping
        def bad_connections(self, ctx): ...   # wrong credentials + the secret that must not leak
        def source_config(self, ctx): ...     # the source entry (name=ctx["name"], topic=ctx["topic"])
        def make_row(self, i, version=0): ... # entity i in its version-th state
        def upsert(self, ctx, rows): ...
        def delete(self, ctx, keys): ...
        def system_state(self, ctx): ...      # {key tuple: value as the topic must hold it}
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from connectors.runtime.offsets import OffsetStore
from connectors.runtime.runner_state import RunnerStats
from connectors.runtime.standalone import SourceWorker, task_specs
from kernel.config.models import KafkaConfig
from kernel.config.policies import RetryPolicy
from kernel.kafka.committed import latest_per_key
from kernel.kafka.topics import end_offsets
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from threes.config import PipelineBase, pipeline_from_dict


def run_once(
    pipeline: PipelineBase, offsets_topic: str = "_threes_offsets", retry: RetryPolicy | None = None
) -> dict[str, RunnerStats]:
    """Run every source of ``pipeline`` once, until each task caught up or failed.

    Args:
        pipeline: a validated pipeline; its ``sources`` run.
        offsets_topic: the compacted topic of the source positions.
        retry: the retry policy of transient failures; the worker's default when ``None``.

    Returns:
        Task key (``name`` or ``name#i``) -> the task's stats (``state``, ``error``, ``acked``,
        ``tombstones``, ``rows_read``...).
    """
    worker = SourceWorker(pipeline, offsets_topic=offsets_topic, retry=retry)
    for spec in task_specs(pipeline.sources):
        worker.start(spec, once=True)
    worker.wait(threading.Event())
    return worker.stats()


def topic_state(kafka_conf: Mapping[str, Any], topic: str) -> dict[tuple, dict[str, Any]]:
    """Latest decoded value per decoded key (key as a tuple of its field values, in schema order).

    Read ``read_committed`` to the topic's end offsets; tombstoned keys are absent.
    """
    de = AvroDeserializer(SchemaStore(dict(kafka_conf)))
    out: dict[tuple, dict[str, Any]] = {}
    for k, v in latest_per_key(dict(kafka_conf), topic).items():  # read_committed
        out[tuple(de(k).values())] = de(v)
    return out


def count_records(kafka_conf: Mapping[str, Any], topic: str) -> int:
    """Records written to ``topic`` so far (sum of end offsets; compaction does not run in a test's lifetime)."""
    return sum(end_offsets(kafka_conf, topic).values())


class SourceContract:
    """Subclass and implement the hooks; pytest collects the ``test_`` methods for every subclass.

    Hooks receive ``ctx``, a dict the subclass fills in :meth:`setup_system`
    (names of its table/index/bucket, clients).
    """

    #: How many rows the contract creates first (keep CI fast).
    initial_rows = 20

    # -- hooks ---------------------------------------------------------------------------------------

    def setup_system(self, ctx: dict[str, Any]) -> None:
        """Create the empty entity store (table, index, prefix) and put its names in ``ctx``."""
        raise NotImplementedError

    def source_config(self, ctx: dict[str, Any]) -> dict[str, Any]:
        """The source's config entry (name, type, connection, topic=ctx['topic'] ...)."""
        raise NotImplementedError

    def connections(self, ctx: dict[str, Any]) -> dict[str, Any]:
        """The ``connections:`` mapping the source needs."""
        raise NotImplementedError

    def bad_connections(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """Connections with wrong credentials, and the secret that must not appear in the error."""
        raise NotImplementedError

    def upsert(self, ctx: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        """Insert or update entities (each dict has the key fields)."""
        raise NotImplementedError

    def delete(self, ctx: dict[str, Any], keys: list[tuple]) -> None:
        """Delete entities by key tuple."""
        raise NotImplementedError

    def system_state(self, ctx: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
        """The system's current entities, keyed by key tuple, values as the topic should hold them."""
        raise NotImplementedError

    def make_row(self, i: int, version: int = 0) -> dict[str, Any]:
        """The ``i``-th entity, in its ``version``-th state."""
        raise NotImplementedError

    def settle(self, ctx: dict[str, Any]) -> None:  # optional hook
        """Wait until changes are visible to the source (refresh, commit delay)."""

    # -- fixtures ------------------------------------------------------------------------------------

    @pytest.fixture
    def ctx(
        self, request: pytest.FixtureRequest, threes_unique: str, threes_kafka_conf: dict[str, Any]
    ) -> dict[str, Any]:
        """The test's context: ``unique``, ``topic``, ``name``, ``kafka_conf``, ``request``, then the system's names."""
        ctx: dict[str, Any] = {"unique": threes_unique, "topic": f"state.test.{threes_unique}",
                               "name": f"src-{threes_unique}", "kafka_conf": threes_kafka_conf, "request": request}
        self.setup_system(ctx)
        return ctx

    def pipeline(self, ctx: dict[str, Any], kafka: KafkaConfig, connections: dict[str, Any] | None = None,
                 **overrides: Any) -> PipelineBase:
        """A pipeline of the source under test on ``kafka`` (its whole config: security settings included)."""
        source = {**self.source_config(ctx), **overrides}
        pipeline = pipeline_from_dict({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
            "connections": connections or self.connections(ctx),
            "sources": [source],
        })
        return pipeline.model_copy(update={"kafka": kafka})

    def assert_topic_equals_system(self, ctx: dict[str, Any]) -> None:
        """Assert that the topic's live keys and latest values equal the system's entities."""
        expected = self.system_state(ctx)
        actual = topic_state(ctx["kafka_conf"], ctx["topic"])
        assert sorted(actual) == sorted(expected), "live keys of the topic differ from the system's keys"
        for key, row in expected.items():
            assert actual[key] == row, f"key {key}: topic holds {actual[key]!r}, system holds {row!r}"

    def run_ok(self, pipeline: PipelineBase) -> RunnerStats:
        """Run the source once and assert it caught up; returns its task's stats."""
        stats = run_once(pipeline)
        (s,) = stats.values()
        assert s.state == "caught_up", s.error
        return s

    # -- the contract --------------------------------------------------------------------------------

    def test_snapshot_then_inserts_updates_deletes(self, ctx: dict[str, Any], threes_kafka: KafkaConfig) -> None:
        """A first run snapshots; inserts, updates and deletes follow as records and tombstones."""
        n = self.initial_rows
        self.upsert(ctx, [self.make_row(i) for i in range(n)])
        self.settle(ctx)
        pipeline = self.pipeline(ctx, threes_kafka)
        first = self.run_ok(pipeline)
        assert first.acked >= n
        self.assert_topic_equals_system(ctx)

        # updates of some, deletes of others, new ones
        self.upsert(ctx, [self.make_row(i, version=1) for i in range(0, n, 3)])
        gone = [tuple(self.key_of(self.make_row(i))) for i in range(1, n, 4)]
        self.delete(ctx, gone)
        self.upsert(ctx, [self.make_row(i) for i in range(n, n + 5)])
        self.settle(ctx)
        before = count_records(ctx["kafka_conf"], ctx["topic"])
        second = self.run_ok(pipeline)
        assert second.tombstones >= len(gone), "every delete must become a tombstone"
        assert count_records(ctx["kafka_conf"], ctx["topic"]) > before
        self.assert_topic_equals_system(ctx)

    def test_replay_is_harmless_and_position_only_moves_forward(
        self, ctx: dict[str, Any], threes_kafka: KafkaConfig
    ) -> None:
        """A second run with nothing changed changes no value and deletes nothing."""
        self.upsert(ctx, [self.make_row(i) for i in range(self.initial_rows)])
        self.settle(ctx)
        pipeline = self.pipeline(ctx, threes_kafka)
        self.run_ok(pipeline)
        store = OffsetStore(ctx["kafka_conf"])
        stored = store.load(ctx["name"])
        assert stored is not None, "a position must be stored after a run"
        state = topic_state(ctx["kafka_conf"], ctx["topic"])
        again = self.run_ok(pipeline)
        assert again.tombstones == 0
        assert topic_state(ctx["kafka_conf"], ctx["topic"]) == state
        assert store.load(ctx["name"]) is not None
        self.assert_topic_equals_system(ctx)

    def test_offsets_reset_resnapshots(self, ctx: dict[str, Any], threes_kafka: KafkaConfig) -> None:
        """``threes offsets reset`` makes the next run read every entity again."""
        from kernel.kafka import clients

        n = self.initial_rows
        self.upsert(ctx, [self.make_row(i) for i in range(n)])
        self.settle(ctx)
        pipeline = self.pipeline(ctx, threes_kafka)
        self.run_ok(pipeline)
        written = count_records(ctx["kafka_conf"], ctx["topic"])
        store = OffsetStore(ctx["kafka_conf"])
        store.reset([ctx["name"]], clients.kafka_producer(threes_kafka))
        assert store.load(ctx["name"]) is None
        again = self.run_ok(pipeline)
        assert again.rows_read >= n, "a reset position must re-read every entity"
        assert count_records(ctx["kafka_conf"], ctx["topic"]) >= written + n
        self.assert_topic_equals_system(ctx)

    def test_bad_credentials_fail_clearly(self, ctx: dict[str, Any], threes_kafka: KafkaConfig) -> None:
        """Wrong credentials fail the task with an error naming it and holding no secret."""
        connections, secret = self.bad_connections(ctx)
        pipeline = self.pipeline(ctx, threes_kafka, connections=connections)
        # one attempt: a refused login is not worth retrying in a test
        stats = _run_once_no_retry(pipeline)
        (s,) = stats.values()
        assert s.state == "failed"
        assert s.error is not None, "a failed task carries its error"
        assert ctx["name"] in s.error
        assert secret not in s.error

    def key_of(self, row: dict[str, Any]) -> tuple:
        """The key tuple of an entity (default: the first field)."""
        return (next(iter(row.values())),)


def _run_once_no_retry(pipeline: PipelineBase) -> dict[str, RunnerStats]:
    return run_once(pipeline, retry=RetryPolicy(max_attempts=1))
