"""Errors of the Avro serde.

All derive from :class:`connectors.exceptions.SkippableRecordError` or
:class:`~connectors.exceptions.FatalError`, so callers handle them by what to do:
a record that cannot be decoded goes to the dead letter queue; a schema that
cannot be registered stops the task.
"""

from __future__ import annotations

from connectors.exceptions import FatalError, SkippableRecordError


class SerdeError(SkippableRecordError):
    """A record cannot be encoded or decoded."""


class NotSingleObjectError(SerdeError):
    """The bytes do not start with the Avro single-object marker ``C3 01``."""


class UnknownSchemaError(SerdeError):
    """The fingerprint in a record names a writer schema found nowhere.

    Attributes:
        fingerprint: the 8-byte CRC-64-AVRO fingerprint, as found in the record.
    """

    def __init__(self, fingerprint: bytes, where: str):
        self.fingerprint = fingerprint
        super().__init__(
            f"unknown Avro writer schema fingerprint {fingerprint.hex()} (not in {where}); "
            "the producer must register its schema before writing"
        )


class SchemaRegistrationError(FatalError):
    """A writer schema could not be stored in the schema topic."""


class SchemaNotFoundError(FatalError):
    """A named ``.avsc`` schema is neither a file nor a schema shipped in ``schemas/``."""


class IncompatibleSchemaError(FatalError):
    """A new writer schema breaks its subject's compatibility level; nothing was registered or produced.

    Attributes:
        topic: the topic whose key or value schema changed.
        subject: ``<topic>-key`` or ``<topic>-value``.
        level: the compatibility level checked (``BACKWARD``...).
        problems: ``(field path, problem)`` pairs.
    """

    def __init__(self, topic: str, subject: str, level: str, problems: list[tuple[str, str]]):
        self.topic = topic
        self.subject = subject
        self.level = level
        self.problems = problems
        fields = "; ".join(f"field {field!r}: {why}" for field, why in problems)
        super().__init__(
            f"topic {topic!r}: the new {subject.rsplit('-', 1)[-1]} schema is not {level} compatible "
            f"(subject {subject!r}): {fields}. Nothing was produced. Make the change compatible (a default "
            "for an added field, a promotion such as int to long), or set the topic's topic_spec.compatibility"
        )


class KeySchemaChangeError(FatalError):
    """A source's key schema changed and no re-key was asked for; nothing was registered or produced.

    Attributes:
        topic: the topic.
        problems: ``(field path, problem)`` pairs describing the change.
    """

    def __init__(self, topic: str, connector: str, problems: list[tuple[str, str]], remedy: str | None = None):
        self.topic = topic
        self.connector = connector
        self.problems = problems
        fields = "; ".join(f"field {field!r}: {why}" for field, why in problems) or "the key schema differs"
        super().__init__(
            f"topic {topic!r}: the key schema of source {connector!r} changed ({fields}); new key bytes "
            "would leave every entity twice in the topic (old key and new key) and reconciliation would then "
            "delete them downstream. Nothing was produced. "
            + (remedy or "To re-key the topic (tombstone every old key, then re-snapshot under the new key), "
               f"set `rekey: true` on source {connector!r}")
        )
