"""The worker-side probe: hash hits are confirmed by key, colliding hashes fall back to a string index."""

from __future__ import annotations

import pyarrow as pa

from stream_app.snapshot.indexed import _index, probe


def test_probe_confirms_hash_hits_by_key():
    table = pa.table({"__lk": ["a", "b", "c"], "__lh": [1, 2, 3]})
    index, by_key = _index(table)
    assert not by_key
    # "x" has the hash of "b" (a collision): it must not match b's row
    keys = pa.array(["c", "x", None, "a"])
    hashes = pa.array([3, 2, None, 1], pa.int64())
    assert probe(table, index, by_key, keys, hashes).tolist() == [2, -1, -1, 0]


def test_two_snapshot_keys_with_one_hash_index_by_string():
    table = pa.table({"__lk": ["a", "b", "c"], "__lh": [7, 7, 3]})
    index, by_key = _index(table)
    assert by_key
    keys = pa.array(["b", "a", "z", None])
    hashes = pa.array([7, 7, 7, None], pa.int64())
    assert probe(table, index, by_key, keys, hashes).tolist() == [1, 0, -1, -1]
