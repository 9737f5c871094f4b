"""The connector contract kit: the tests every source and sink must pass, shipped with threes.

Like singer-sdk's ``singer_sdk.testing`` or Kafka Connect's ``EmbeddedConnectCluster``: a
connector package, built-in or third-party, proves itself by subclassing one class per kind
and pointing pytest at a Kafka cluster, nothing else of this repository:

* :class:`threes.testing.source.SourceContract`: snapshot, inserts/updates/deletes as
  records and tombstones (the topic equals the system row by row), harmless replays, an
  offsets reset that re-snapshots, bad credentials that fail clearly without the secret;
* :class:`threes.testing.sink.SinkContract`: a batch written once, a replay that changes
  nothing, tombstones that delete, an older version that never wins, ``check()`` failing
  fast on bad credentials.

The pytest plugin (:mod:`threes.testing.plugin`, entry point ``pytest11: threes``, loaded by
pytest once threes is installed) adds the options ``--threes-kafka HOST:PORT`` /
``THREES_KAFKA_BOOTSTRAP`` and ``--threes-kafka-config FILE`` / ``THREES_KAFKA_CONFIG``, and
the fixtures ``threes_kafka``, ``threes_kafka_conf`` and ``threes_unique``. A third-party
example lives in the repository's ``examples/thirdparty/``.

This module imports nothing: pytest imports the plugin at start-up, and the contracts (which
import the runtime) only load with the test modules that use them.
"""
