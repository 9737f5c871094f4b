"""Dead letters selected for ``threes dlq`` (pure logic: times, filters, the headers a replay sends)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kernel.dlq import DeadLetter
from kernel.exceptions import ThreesError
from threes.dead_letters import REPLAYED_FROM, Letter, parse_time, select_letters

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
MS = int(NOW.timestamp() * 1000)


def letter(offset: int, topic: str, message: str, at_ms: int, *, replayed: bool = False) -> Letter:
    context = DeadLetter(topic, 0, offset * 10, "write", "SkippableRecordError", message, "svc")
    original = [("version", b"\x00\x01")] + ([(REPLAYED_FROM, b"dlq:0:1")] if replayed else [])
    headers = context.headers(original)
    headers = [(k, str(at_ms).encode()) if k == "dlq.timestamp_ms" else (k, v) for k, v in headers]
    return Letter("dlq", 0, offset, at_ms, context, b"k", b"v", tuple(headers))


def test_times_are_iso_or_ages() -> None:
    assert parse_time("2026-05-01T12:00", NOW) == MS  # UTC unless zoned
    assert parse_time("2026-05-01T14:00+02:00", NOW) == MS
    assert parse_time("2026-05-01", NOW) == MS - 12 * 3600 * 1000
    assert parse_time("90s", NOW) == MS - 90_000
    assert parse_time("2h", NOW) == MS - 2 * 3600 * 1000
    assert parse_time("3d", NOW) == MS - 3 * 86400 * 1000
    with pytest.raises(ThreesError, match="not a time"):
        parse_time("yesterday", NOW)


def test_filters_by_reason_topic_window_and_id() -> None:
    letters = [letter(0, "a", "value too long for varchar(5)", MS - 10_000),
               letter(1, "b", "value too long for varchar(5)", MS),
               letter(2, "a", "numeric field overflow", MS + 10_000)]
    ids = lambda selected: [x.offset for x in selected]  # noqa: E731
    assert ids(select_letters(letters, reason="VARCHAR(5)")) == [0, 1]
    assert ids(select_letters(letters, reason="skippablerecorderror: numeric")) == [2]
    assert ids(select_letters(letters, topic="a")) == [0, 2]
    assert ids(select_letters(letters, since_ms=MS)) == [1, 2]
    assert ids(select_letters(letters, until_ms=MS)) == [0]
    assert ids(select_letters(letters, topic="a", reason="varchar")) == [0]
    assert ids(select_letters(letters, ids=["dlq:0:1", "dlq:0:9"])) == [1]
    assert letters[1].id == "dlq:0:1"


def test_a_replay_sends_the_original_headers_only() -> None:
    # a replayed record dead-lettered again must carry no stale dlq.* header (from_headers would read them)
    again = letter(0, "a", "boom", MS, replayed=True)
    assert again.original_headers() == [("version", b"\x00\x01")]
    assert again.reason == "SkippableRecordError: boom"


def test_a_source_dead_letter_is_listed_and_never_put_back_in_its_topic() -> None:
    """Issue #49: a source's dead letter is a row that has no Avro record: replaying it to the topic is refused."""
    from threes.config import pipeline_from_dict
    from threes.dead_letters import _check_selection, dead_letter_topics

    doc = {"kafka": {"bootstrap_servers": "127.0.0.1:1"},
           "connections": {"pg": {"type": "rds", "url": "postgresql+psycopg://u@127.0.0.1:1/d"}},
           "sources": [{"name": n, "type": "rds_source", "connection": "pg", "topic": f"state.{n}", "table": "x",
                        "mode": "incrementing", "incrementing_column": "id", "errors": {"tolerance": tol}}
                       for n, tol in (("a", "all"), ("b", "none"))]}
    assert dead_letter_topics(pipeline_from_dict(doc)) == ["state.a.dlq"]
    row = Letter("state.a.dlq", 0, 3, 1, DeadLetter("state.a", -1, -1, "encode", "SerdeError", "m", "a"),
                 b"k", b'{"id": 2}')
    with pytest.raises(ThreesError, match="could not encode"):
        _check_selection([row], None, {}, False)
    _check_selection([row], "json.rows", {}, False)  # to another topic: the caller's choice
