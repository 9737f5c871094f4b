"""The error taxonomy of threes, and the errors of the Avro serde and the schema store.

Every error threes raises on purpose roots in :class:`ThreesError` and is grouped by what
the caller does about it; the grouping follows meltano singer-sdk's ``exceptions.py`` and
Kafka Connect's ``RetriableException`` / ``ConnectException`` split:

* :class:`ConfigError` - fix the config file; carries every problem with its path.
* :class:`SetupError` - a system cannot be reached or refuses our credentials.
* :class:`RetriableError` / :class:`SinkBackpressureError` - try again later.
* :class:`FatalError` - stop the task; retrying cannot help.
* :class:`SkippableRecordError` - send this one record to the dead letter queue.

The taxonomy lives here, in the bottom layer, so the wire format can raise it without
importing anything above it (as Kafka's ``common.errors`` sits in its clients library);
:mod:`kernel.exceptions` re-exports it for the framework and the connectors. A record
that cannot be decoded is a :class:`SerdeError` (a :class:`SkippableRecordError`: it goes to
the dead letter queue); a schema that cannot be registered stops the task (a :class:`FatalError`).

Every error message is written for the person who runs the pipeline: it says
what is wrong and what to do, and never contains a secret.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class ThreesError(Exception):
    """Root of every error raised on purpose by threes."""


@dataclass(frozen=True)
class ConfigProblem:
    """One problem found in a config file.

    Attributes:
        path: the key path inside the document, e.g. ``sources[1].table``
            (empty for a problem with the file as a whole).
        message: what is wrong, without the offending value when it could be a secret.
        file: the config file's path as given by the user, or ``None`` for a dict.
        line: 1-based line of the key (or of its parent mapping when the key is
            missing), or ``None`` when unknown.
    """

    path: str
    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(ThreesError):
    """The configuration is invalid; ``problems`` lists every problem found at once."""

    def __init__(self, problems: Iterable[ConfigProblem] | str):
        if isinstance(problems, str):
            problems = [ConfigProblem(path="", message=problems)]
        self.problems: list[ConfigProblem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class SetupError(ThreesError):
    """A system cannot be reached, or it refuses the configured credentials.

    Args:
        message: what failed, e.g. ``"Kafka at 127.0.0.1:9092 did not answer"``.
        hint: what to do about it, e.g. ``"start it with `threes local up`"``.
    """

    refused: bool = False
    """``True`` when the system answered and refused (credentials, certificate): waiting cannot help."""

    def __init__(self, message: str, hint: str | None = None):
        self.hint = hint
        super().__init__(f"{message}. {hint}" if hint else message)


class RetriableError(ThreesError):
    """A transient failure: the same operation may succeed when tried again."""


class SinkBackpressureError(RetriableError):
    """The target asks us to slow down (HTTP 429, lock timeout, ...).

    The sync service pauses the partitions that feed the target and retries after
    ``retry_after`` seconds (quix-streams ``SinkBackpressureError``).

    Args:
        retry_after: seconds to wait before the next attempt.
        message: a description of what the target answered.
    """

    def __init__(self, retry_after: float, message: str = "target applied backpressure"):
        self.retry_after = retry_after
        super().__init__(f"{message} (retry after {retry_after:.3g} s)")


class FatalError(ThreesError):
    """The task cannot go on; retrying will not help (bad schema, missing table...)."""


class SkippableRecordError(ThreesError):
    """One record cannot be processed; it goes to the dead letter queue with this reason."""

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
