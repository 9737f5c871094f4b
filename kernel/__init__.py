"""The kernel every part of threes shares, below the connectors and above the wire format (:mod:`schemas`).

* :mod:`kernel.config` - the pipeline's config models (Kafka, connections, policies, connector
  bases), the YAML loader with each key's line, the Kafka client option allow-list.
* :mod:`kernel.exceptions` - the error taxonomy, grouped by what the caller does.
* :mod:`kernel.kafka` - the Kafka clients' defaults, topic administration (compacted and internal
  topics), committed offsets and latest-per-key reads.
* :mod:`kernel.updates` - the update topics' contract: the ``version`` and source-time headers.
* :mod:`kernel.dlq` - the dead letter record every part writes.
* :mod:`kernel.status` - the status document's shape and the HTTP endpoint (``/metrics``,
  ``/status``) every long-running process serves.
* :mod:`kernel.supervision` - retry and restart policies, stoppable sleeps.
* :mod:`kernel.redact` - secrets kept out of every log, error and document.

The stream job (:mod:`stream_app`) imports this package and :mod:`schemas` only; the
connectors (:mod:`connectors`) and the sync service (:mod:`sync_service`) build on it.
"""
