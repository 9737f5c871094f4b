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
