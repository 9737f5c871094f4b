"""threes-jsonfile: an example third-party connector package for threes.

* ``jsonfile`` connection (:mod:`threes_jsonfile.connection`): a folder, optionally guarded by a
  token (the folder's ``.token`` file), standing in for a system with credentials;
* ``jsonfile_source`` (:mod:`threes_jsonfile.source`): the entities of the JSON Lines files
  (``*.jsonl``) of a sub-folder, into a compacted topic;
* ``jsonfile_sink`` (:mod:`threes_jsonfile.sink`): update records into one JSON file per key.

Registered through the ``threes.connectors`` and ``threes.connections`` entry points of its
``pyproject.toml``, and proven by threes' contract kit (:mod:`threes.testing`) in ``tests/``.
"""
