"""What a database error means: retry later, back off, wait for the target, refuse the record, or stop.

The decision goes by what the server said (PostgreSQL's SQLSTATE class, MySQL's
error number), never by the driver's exception class: psycopg raises SQLSTATE
54000 ("index row size exceeds btree maximum", a value no retry can store) as an
``OperationalError``, the same class as a dropped connection.

The meanings go by blast radius, not by SQLSTATE class alone: an error any record
would hit (no privilege, a missing table or column, a read-only database, a full
disk) is the *target's* (``target``: the sink blocks, nothing is dead-lettered),
even though PostgreSQL files privileges and missing objects under class 42 with
datatype mismatches. Only an error about the record's data (classes 22, 23, 54,
and the datatype errors of class 42) is a ``record`` error.

Sources: PostgreSQL docs, "Appendix A. PostgreSQL Error Codes" (the first two
characters of a SQLSTATE are its class); MariaDB/MySQL "Server Error Message
Reference" and "Client Error Message Reference".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Meaning = Literal["busy", "transient", "target", "record", "suspect", "fatal"]

# PostgreSQL SQLSTATEs that mean "the server is busy": back off, pause the partitions.
PG_BUSY = frozenset({
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "53300",  # too_many_connections
    "53200",  # out_of_memory
})
# PostgreSQL SQLSTATEs any record would hit: the target must change (a GRANT, a migration, space).
PG_TARGET = frozenset({
    "42501",  # insufficient_privilege (REVOKE, row-level security)
    "42P01",  # undefined_table
    "42703",  # undefined_column
    "42704",  # undefined_object
    "42883",  # undefined_function (a trigger's function dropped)
    "3F000",  # invalid_schema_name
    "25006",  # read_only_sql_transaction (default_transaction_read_only, a standby after failover)
    "53100",  # disk_full
})
# Classes any record would hit: invalid authorization (28), invalid catalog name (3D), invalid
# schema name (3F), and class 42 except the datatype errors listed in PG_RECORD_42.
PG_TARGET_CLASSES = frozenset({"28", "3D", "3F", "42"})
# Class 42 errors about a value's type (a field whose Avro type the column does not take).
PG_RECORD_42 = frozenset({"42804", "42846", "42P10", "42P18", "42725", "42P08"})
# Classes that pass with time: connection exception, transaction rollback,
# insufficient resources, operator intervention (admin shutdown, crash
# shutdown, cannot connect now), system error (I/O), and a standby that
# cannot serve (hot standby conflicts are 40001 already).
PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
# Classes that refuse this record's data for good: data exception, integrity
# constraint violation, program limit exceeded (54000 an index row too big).
PG_RECORD_CLASSES = frozenset({"22", "23", "54"})
# Internal errors may or may not be about the data: dead-lettered only when the
# record's neighbours were applied (the sink runtime bisects and judges).
PG_SUSPECT_CLASSES = frozenset({"XX"})

# MySQL/MariaDB error numbers.
MYSQL_BUSY = frozenset({1205, 1213, 1040, 1317, 3024, 1203})  # lock wait, deadlock, too many connections...
MYSQL_TARGET = frozenset({
    1044, 1045, 1142, 1143, 1227,  # access denied (database, login, table, column, privilege)
    1049, 1146, 1054,  # unknown database, table, column
    1036, 1290, 1792,  # table read only, --read-only, read-only transaction
    1021, 1114,  # disk full, table is full
})
MYSQL_TRANSIENT = frozenset({
    1037, 1038, 1041, 1053, 1077, 1078, 1079, 1080, 1152, 1153, 1154, 1155, 1156, 1157, 1158, 1159,
    1160, 1161, 1180, 1181, 1836, 1927, 2002, 2003, 2005, 2006, 2013, 2014, 2026, 2055,
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
            shutting down, out of resources), ``target`` (any record would hit
            it: a permission, a missing table or column, read-only, disk full;
            the sink blocks until the target changes), ``record`` (the data is
            refused for good: dead letter topic), ``suspect`` (an internal
            error: a record error only if its neighbours succeed), ``fatal``
            (none of these: the task fails and restarts).
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
    # MySQL first: its SQLSTATE is mostly the generic HY000, its error number says what happened
    meaning = _mysql(orig, text) if dialect in ("mysql", "mariadb") else None
    return meaning or _sqlstate(orig, text) or _sqlite(orig, text) or _without_code(exc, orig, dialect, text)


def _mysql(orig: BaseException, text: str) -> DbErrorMeaning | None:
    """By MySQL/MariaDB's error number (``None`` without one)."""
    args = getattr(orig, "args", ())
    code = args[0] if args and isinstance(args[0], int) else None
    if code is None:
        return None
    if code in MYSQL_BUSY:
        return DbErrorMeaning("busy", str(code), text)
    if code in MYSQL_TARGET:
        return DbErrorMeaning("target", str(code), text)
    if code in MYSQL_TRANSIENT or 2000 <= code < 3000:  # 2xxx: client errors (connection lost...)
        return DbErrorMeaning("transient", str(code), text)
    if code in MYSQL_RECORD:
        return DbErrorMeaning("record", str(code), text)
    return DbErrorMeaning("fatal", str(code), text)


def _sqlstate(orig: BaseException, text: str) -> DbErrorMeaning | None:
    """By the SQLSTATE (PostgreSQL's codes and classes; ``None`` without one)."""
    state = getattr(orig, "sqlstate", None) or getattr(getattr(orig, "diag", None), "sqlstate", None)
    if not state:
        return None
    if state in PG_BUSY:
        return DbErrorMeaning("busy", state, text)
    if state in PG_TARGET:
        return DbErrorMeaning("target", state, text)
    if state[:2] in PG_TRANSIENT_CLASSES:
        return DbErrorMeaning("transient", state, text)
    if state[:2] in PG_RECORD_CLASSES or state in PG_RECORD_42:
        return DbErrorMeaning("record", state, text)
    if state[:2] in PG_TARGET_CLASSES:
        return DbErrorMeaning("target", state, text)
    if state[:2] in PG_SUSPECT_CLASSES:
        return DbErrorMeaning("suspect", state, text)
    return DbErrorMeaning("fatal", state, text)


def _sqlite(orig: BaseException, text: str) -> DbErrorMeaning | None:
    """By SQLite's extended error name (Python >= 3.11: ``SQLITE_BUSY``, ``SQLITE_CONSTRAINT_CHECK``...)."""
    name = getattr(orig, "sqlite_errorname", None)
    if not name:
        return None
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return DbErrorMeaning("busy", name, text)
    if name.startswith(("SQLITE_READONLY", "SQLITE_FULL", "SQLITE_PERM", "SQLITE_AUTH")):
        return DbErrorMeaning("target", name, text)
    if name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_NOMEM", "SQLITE_PROTOCOL")):
        return DbErrorMeaning("transient", name, text)
    if name.startswith(("SQLITE_CONSTRAINT", "SQLITE_TOOBIG", "SQLITE_MISMATCH", "SQLITE_RANGE")):
        return DbErrorMeaning("record", name, text)
    return DbErrorMeaning("fatal", name, text)


def _without_code(exc: BaseException, orig: BaseException, dialect: str, text: str) -> DbErrorMeaning:
    """By the driver's exception class when the server gave no code (a refused or lost connection...)."""
    from sqlalchemy.exc import DBAPIError

    kind = type(orig).__name__
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
