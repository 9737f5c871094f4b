"""The snapshot: a GlobalKTable-like table of compacted topics that micro-batches join against.

Modules, from data to runtime:

* :mod:`~stream_app.snapshot.data`: pure functions from compacted-topic records
  to the latest value per key (lookup keys, tombstones).
* :mod:`~stream_app.snapshot.decoding`: the record decoders of the snapshot
  formats (single-object and Confluent Avro, Connect JSON, Debezium envelopes).
* :mod:`~stream_app.snapshot.arrow_tables`: the base and overlay on the driver
  as Arrow tables (change sets, IPC bytes, nullable schemas).
* :mod:`~stream_app.snapshot.view`: :class:`~stream_app.snapshot.view.SnapshotView`,
  what one micro-batch joins.
* :mod:`~stream_app.snapshot.engines`: where a snapshot's base lives by its size
  (broadcast for small snapshots, partitioned by key on the executors above).
* :mod:`~stream_app.snapshot.partitioned`: the partitioned store on the
  executors: bootstrap, merges and versions written and read by the executors.
* :mod:`~stream_app.snapshot.mapped`: a version's lookup files (hash-sorted
  Arrow IPC per bucket) and the point lookups the Python workers run on them.
* :mod:`~stream_app.snapshot.indexed`: the opt-in indexed engine (an Arrow
  broadcast indexed per Python worker) and the overlay applied on lookups.
* :mod:`~stream_app.snapshot.delta`: small refreshes decoded on the driver.
* :mod:`~stream_app.snapshot.reading`: offset ranges read and decoded into
  overlay log rows.
* :mod:`~stream_app.snapshot.refresh`: the catch-up before each micro-batch.
* :mod:`~stream_app.snapshot.checkpoints`: when a checkpoint is written, whether
  the newest one is usable.
* :mod:`~stream_app.snapshot.runtime`: :class:`Snapshot`, the live snapshot
  (readiness gate, catch-up before each micro-batch, checkpoints, replays).
* :mod:`~stream_app.snapshot.version_intervals`, :mod:`~stream_app.snapshot.versioned`,
  :mod:`~stream_app.snapshot.as_of_join`: a versioned snapshot's intervals, its
  store, and the as-of join.
* :mod:`~stream_app.snapshot.query` (the HTTP route), with
  :mod:`~stream_app.snapshot.query_keys`, :mod:`~stream_app.snapshot.query_reads`
  and :mod:`~stream_app.snapshot.offline_query`: interactive queries.
"""
