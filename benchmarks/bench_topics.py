"""The Kafka topics a benchmark run creates, deleted when it ends.

Every benchmark writes its data to new ``bench.*`` topics (fresh names per run,
so runs never read each other's records). Left behind, they pile up on the
local stack's broker, which then holds hundreds of topics and gigabytes of logs,
spends part of a core with nothing running, and every figure on a 2-core machine
is measured next to it (``bench_topics/stale_topics`` in ``RESULTS.md``). So
each benchmark deletes, when it ends, the ``bench.`` topics that appeared while
it ran; ``THREES_BENCH_KEEP_TOPICS=1`` keeps them
(to run a scratch harness on the same topics again).

Do not run two benchmarks at once against one broker (their figures would be
worthless anyway on 2 cores): the second to finish would delete the first's topics.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)
PREFIX = "bench."


class BenchTopics:
    """Remembers the broker's topics at the start; :meth:`drop` deletes the ``bench.`` topics added since.

    Args:
        conf: librdkafka configuration of the broker (``KafkaConfig.librdkafka_config()``).
    """

    def __init__(self, conf: dict[str, Any]):
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(conf)
        self.before = self._names()

    def _names(self) -> set[str]:
        return set(self.admin.list_topics(timeout=30).topics)

    def drop(self) -> list[str]:
        """Delete the ``bench.`` topics created since the start (unless ``THREES_BENCH_KEEP_TOPICS=1``).

        Returns:
            The topics deleted (none when kept). Failures are logged, never raised:
            the figures are already printed.
        """
        added = sorted(t for t in self._names() - self.before if t.startswith(PREFIX))
        if not added or os.environ.get("THREES_BENCH_KEEP_TOPICS") == "1":
            if added:
                log.info("kept %d benchmark topics (THREES_BENCH_KEEP_TOPICS=1)", len(added))
            return []
        for topic, future in self.admin.delete_topics(added, operation_timeout=60).items():
            try:
                future.result()
            except Exception as exc:  # reported, the run's figures stand
                log.warning("benchmark topic %s not deleted: %s", topic, exc)
        log.info("deleted %d benchmark topics", len(added))
        return added
