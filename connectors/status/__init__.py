"""The runtime view: ``threes status``, the ``/status`` page and ``/status.json`` of every long-running process.

One document shape everywhere (:mod:`connectors.status.document`): a process
serves the part it knows (its source tasks, its sync service), ``threes status``
gathers the rest from Kafka (committed offsets against high watermarks, stored
source positions, snapshot topics' end offsets) and merges what each process
serves.
"""
