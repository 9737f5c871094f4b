"""What a database error means: retry later, back off, refuse the record, or stop.

The decision goes by what the server said (PostgreSQL's SQLSTATE class, MySQL's
error number), never by the driver's exception class: psycopg raises SQLSTATE
54000 ("index row size exceeds btree maximum", a value no retry can store) as an
``OperationalError``, the same class as a dropped connection.

Sources: PostgreSQL docs, "Appendix A. PostgreSQL Error Codes" (the first two
characters of a SQLSTATE are its class); MariaDB/MySQL "Server Error Message
Reference" and "Client Error Message Reference".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Meaning = Literal["busy", "transient", "record", "fatal"]

# PostgreSQL SQLSTATEs that mean "the server is busy": back off, pause the partitions.
PG_BUSY = frozenset({
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "53300",  # too_many_connections
    "53200",  # out_of_memory
    "53100",  # disk_full
})
# Classes that pass with time: connection exception, transaction rollback,
# insufficient resources, operator intervention (admin shutdown, crash
# shutdown, cannot connect now), system error (I/O), and a standby that
# cannot serve (hot standby conflicts are 40001 already).
PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
# Classes that refuse this record's data for good: data exception, integrity
# constraint violation, syntax error or access rule violation (42804 a datatype
# mismatch, 42P10...), program limit exceeded (54000 an index row too big).
PG_RECORD_CLASSES = frozenset({"22", "23", "42", "54", "XX"})

# MySQL/MariaDB error numbers.
MYSQL_BUSY = frozenset({1205, 1213, 1040, 1317, 3024, 1203})  # lock wait, deadlock, too many connections...
MYSQL_TRANSIENT = frozenset({
    1021, 1037, 1038, 1041, 1053, 1077, 1078, 1079, 1080, 1152, 1153, 1154, 1155, 1156, 1157, 1158, 1159,
    1160, 1161, 1180, 1181, 1290, 1836, 1927, 2002, 2003, 2005, 2006, 2013, 2014, 2026, 2055,
})
MYSQL_RECORD = frozenset({
    1048,  # column cannot be null
    1062,  # duplicate entry (another unique index)
    1071,  # specified key was too long
    1118,  # row size too large
    1136,  # column count doesn't match
    1216, 1217, 1451, 1452,  # foreign key constraint fails
    1241,  # operand should contain 1 column
    1264, 1690,  # out of range value
    1265,  # data truncated
    1292,  # incorrect value (date, double...)
    1300, 1366,  # invalid / incorrect string value (charset)
    1364,  # field doesn't have a default value
    1406,  # data too long for column
    1416,  # cannot get geometry object
    3140,  # invalid JSON text
    3819, 4025,  # check constraint violated (MySQL, MariaDB)
})


@dataclass(frozen=True)
class DbErrorMeaning:
    """The meaning of one database error.

    Attributes:
        meaning: ``busy`` (back off: lock, timeout, deadlock, too many
            connections), ``transient`` (retry: connection lost, server
            shutting down, out of resources), ``record`` (the data is refused
            for good: dead letter topic), ``fatal`` (no retry or skip helps:
            a missing table, a permission).
        code: the SQLSTATE or MySQL error number as text, ``""`` when the
            server said nothing (the connection never opened).
        text: the error's first line, without statement or parameters.
    """

    meaning: Meaning
    code: str
    text: str


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def classify(exc: BaseException, dialect: str) -> DbErrorMeaning:
    """Classify a database error by what the server said.

    Args:
        exc: the error, a SQLAlchemy ``DBAPIError`` (its ``orig`` is read) or
            the driver's own exception.
        dialect: SQLAlchemy dialect name (``postgresql``, ``mysql``,
            ``mariadb``, ``sqlite``).

    Returns:
        Its :class:`DbErrorMeaning`. Without a server code, a driver
        ``OperationalError``/``InterfaceError`` (a refused or lost connection)
        or an invalidated connection is ``transient``; ``DataError`` and
        ``IntegrityError`` are ``record``; anything else is ``fatal``.
    """
    from sqlalchemy.exc import DBAPIError

    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = _first_line(orig)
    kind = type(orig).__name__
    # MySQL first: its SQLSTATE is mostly the generic HY000, its error number says what happened
    if dialect in ("mysql", "mariadb"):
        args = getattr(orig, "args", ())
        code = args[0] if args and isinstance(args[0], int) else None
        if code is not None:
            if code in MYSQL_BUSY:
                return DbErrorMeaning("busy", str(code), text)
            if code in MYSQL_TRANSIENT or 2000 <= code < 3000:  # 2xxx: client errors (connection lost...)
                return DbErrorMeaning("transient", str(code), text)
            if code in MYSQL_RECORD:
                return DbErrorMeaning("record", str(code), text)
            return DbErrorMeaning("fatal", str(code), text)
    state = getattr(orig, "sqlstate", None) or getattr(getattr(orig, "diag", None), "sqlstate", None)
    if state:
        if state in PG_BUSY:
            return DbErrorMeaning("busy", state, text)
        if state[:2] in PG_TRANSIENT_CLASSES:
            return DbErrorMeaning("transient", state, text)
        if state[:2] in PG_RECORD_CLASSES:
            return DbErrorMeaning("record", state, text)
        return DbErrorMeaning("fatal", state, text)
    name = getattr(orig, "sqlite_errorname", None)  # Python >= 3.11: SQLITE_BUSY, SQLITE_CONSTRAINT_CHECK...
    if name:
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return DbErrorMeaning("busy", name, text)
        if name.startswith(("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CANTOPEN", "SQLITE_NOMEM", "SQLITE_PROTOCOL")):
            return DbErrorMeaning("transient", name, text)
        if name.startswith(("SQLITE_CONSTRAINT", "SQLITE_TOOBIG", "SQLITE_MISMATCH", "SQLITE_RANGE")):
            return DbErrorMeaning("record", name, text)
        return DbErrorMeaning("fatal", name, text)
    if dialect == "sqlite" and ("database is locked" in text or "database table is locked" in text):
        return DbErrorMeaning("busy", "", text)
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return DbErrorMeaning("transient", "", text)
    if kind in ("DataError", "IntegrityError"):
        return DbErrorMeaning("record", "", text)
    if kind in ("OperationalError", "InterfaceError"):
        return DbErrorMeaning("transient", "", text)
    if isinstance(orig, (ValueError, TypeError, OverflowError)):
        return DbErrorMeaning("record", "", text)
    return DbErrorMeaning("fatal", "", text)
