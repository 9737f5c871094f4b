"""The runtime view: the ``/status`` page and ``/status.json`` every long-running process serves.

One document shape everywhere (:mod:`kernel.status.document`): a process
serves the part it knows (its source tasks, its sync service); ``threes status`` (:mod:`threes.status`)
(:mod:`threes.status_gather`) gathers the rest from Kafka (committed offsets against high watermarks, stored
source positions, snapshot topics' end offsets) and merges what each process
serves.
"""
