"""``threes run``: the whole pipeline of one YAML as supervised processes.

* :mod:`threes.pipeline.plan` - what runs (sources, stream job, sync services)
  and what each waits for before it starts, derived from the config alone;
* :mod:`threes.pipeline.processes` - child processes of the real ``threes``
  commands, each in its own process group, logging to a file;
* :mod:`threes.pipeline.probes` - readiness read from the children's metrics endpoints;
* :mod:`threes.pipeline.kafka_probe` - topics, watermarks and consumer groups read from Kafka;
* :mod:`threes.pipeline.flow_reader` - the live view's readings, taken in a child process;
* :mod:`threes.pipeline.parts` - the run's options and each part's state;
* :mod:`threes.pipeline.supervisor` - starts them in order, restarts a child
  that dies with backoff, stops them in reverse order;
* :mod:`threes.pipeline.view` - the rich live view;
* :mod:`threes.pipeline.control` - an operator's pause, resume and restart, carried out at each tick;
* :mod:`threes.pipeline.api`, :mod:`threes.pipeline.endpoint`, :mod:`threes.pipeline.page` - the
  management API, the run's HTTP endpoint (status page with actions, probes) and its page;
* :mod:`threes.pipeline.revisions` - each part's config revision (what a new YAML changes);
* :mod:`threes.pipeline.cli` - the ``threes run`` command.

Supervision *inside* a process (a failed source task or sink restarted with
backoff) belongs to the source runtime and the sync service; this package works
one level up, like systemd or a Kubernetes controller over the three commands.
"""
