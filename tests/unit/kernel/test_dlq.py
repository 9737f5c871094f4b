"""A dead letter is always writable: the record is fitted under the dead letter topic's limit (issue #49, part 1)."""

from __future__ import annotations

from kernel.dlq import (
    DEFAULT_MESSAGE_MAX_BYTES,
    OMITTED_HEADER,
    RECORD_BYTES_HEADER,
    DeadLetter,
    dead_letter_limit,
    dead_letter_topic_config,
    record_bytes,
)

LETTER = DeadLetter("updates.items", 3, 41, "write", "SkippableRecordError", "is over max_record_bytes", "svc/es")
ORIGINAL_HEADERS = [("version", b"\x00" * 8)]


def test_a_record_that_fits_is_kept_whole_with_its_size() -> None:
    key, value, headers = LETTER.record(b"k", b"v" * 100, ORIGINAL_HEADERS, max_bytes=1_000_000)
    assert (key, value) == (b"k", b"v" * 100)
    h = dict(headers)
    assert h[RECORD_BYTES_HEADER] == b"101" and OMITTED_HEADER not in h
    assert headers[-1] == ("version", b"\x00" * 8)
    assert DeadLetter.from_headers(headers).omitted == ()


def test_a_record_over_the_limit_is_written_without_its_value_and_says_so() -> None:
    value = b"x" * 3_000_000
    key, out, headers = LETTER.record(b"k", value, ORIGINAL_HEADERS, max_bytes=1_000_000)
    assert key == b"k" and out is None
    assert record_bytes(key, out, headers) < 1_000_000
    context = DeadLetter.from_headers(headers)
    assert (context.topic, context.partition, context.offset) == ("updates.items", 3, 41)
    assert context.omitted == ("value",) and context.original_bytes == 3_000_001
    assert ("version", b"\x00" * 8) in headers  # small original headers stay


def test_huge_headers_and_key_are_left_out_in_turn() -> None:
    big_headers = [("h", b"y" * 2_000_000)]
    _, value, headers = LETTER.record(b"k", b"v", big_headers, max_bytes=1_000_000)
    assert value is None and DeadLetter.from_headers(headers).omitted == ("value", "headers")
    assert all(name != "h" for name, _ in headers)
    key, value, headers = LETTER.record(b"k" * 2_000_000, b"v", None, max_bytes=1_000_000)
    assert key is None and value is None
    assert DeadLetter.from_headers(headers).omitted == ("value", "headers", "key")
    assert record_bytes(key, value, headers) < 1_000_000


def test_the_limit_is_the_smaller_of_the_producer_and_the_topic() -> None:
    assert dead_letter_limit({}) == DEFAULT_MESSAGE_MAX_BYTES
    assert dead_letter_limit({"message.max.bytes": 5_000_000}) == 5_000_000
    assert dead_letter_limit({"message.max.bytes": 5_000_000}, 2_000_000) == 2_000_000
    assert dead_letter_topic_config({"message.max.bytes": "4000000"}) == {"max.message.bytes": "4000000"}


def test_dead_letters_written_before_the_size_headers_still_read() -> None:
    context = DeadLetter.from_headers(LETTER.headers())
    assert context.omitted == () and context.original_bytes is None
