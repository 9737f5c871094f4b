"""LiveKeys: the on-disk key set of reconciliation (no Kafka: records applied through its SQL directly)."""

from __future__ import annotations

from connectors.runtime.state import LiveKeys


def _filled(n: int) -> LiveKeys:
    live = LiveKeys("tag")
    live._db.executemany("INSERT INTO live (k, tag) VALUES (?, ?)",
                         ((f"k{i:05d}".encode(), f"obj{i % 3}") for i in range(n)))
    return live


def test_split_then_unseen_is_the_set_difference_in_chunks() -> None:
    live = _filled(12_000)  # more than one chunk of the streamed reads
    try:
        system = [f"k{i:05d}".encode() for i in range(0, 12_000, 2)] + [b"new-1", b"new-2"]
        missing: list[bytes] = []
        for i in range(0, len(system), 1000):
            missing.extend(live.split(system[i:i + 1000]))
        assert missing == [b"new-1", b"new-2"]
        assert list(live.unseen()) == [f"k{i:05d}".encode() for i in range(1, 12_000, 2)]
        assert len(live) == 12_000 and b"k00003" in live and b"nope" not in live
        assert live.get(b"k00004") == "obj1" and live.get(b"nope", "-") == "-"
    finally:
        live.close()


def test_by_tag_groups_keys_per_object() -> None:
    live = _filled(9)
    try:
        groups = dict(live.by_tag())
        assert sorted(groups) == ["obj0", "obj1", "obj2"]
        assert sorted(groups["obj1"]) == [b"k00001", b"k00004", b"k00007"]
        assert [k for k, _t in live.items()] == sorted(k for ks in groups.values() for k in ks)
    finally:
        live.close()
