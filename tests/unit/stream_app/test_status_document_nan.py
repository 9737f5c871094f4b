"""The stream job's status document skips a real-time store's key count once the store closed (NaN)."""

from __future__ import annotations

from stream_app import metrics


def test_a_closed_stores_nan_key_count_is_left_out_not_a_crash() -> None:
    metrics.SNAPSHOT_KEYS.labels("nan-job", "airports").set_function(lambda: float("nan"))
    metrics.SNAPSHOT_KEYS.labels("live-job", "airports").set_function(lambda: 3.0)
    try:
        rows = {(r["job"], r["snapshot"]): r for r in metrics.status_document()["snapshots"]}
        assert rows[("live-job", "airports")]["keys"] == 3
        assert ("nan-job", "airports") not in rows
    finally:
        metrics.SNAPSHOT_KEYS.remove("nan-job", "airports")
        metrics.SNAPSHOT_KEYS.remove("live-job", "airports")
