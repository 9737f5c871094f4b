"""The connector API: what a connector author implements, apart from the runtime that drives it.

Like Kafka Connect's ``connect-api`` beside its ``connect-runtime``:

* :mod:`connectors.api.source` - :class:`~connectors.api.source.SourceTask` and the
  :class:`~connectors.api.source.SourceBatch` es it yields (driven by :mod:`connectors.runtime`).
* :mod:`connectors.api.sink` - :class:`~connectors.api.sink.Sink` and the batches the sync
  service hands it (driven by :mod:`sync_service`).
"""
