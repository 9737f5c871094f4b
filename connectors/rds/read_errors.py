"""The errors an RDS source raises for a failed read: retried or fatal by what the server said, its own words."""

from __future__ import annotations

from kernel.exceptions import FatalError, RetriableError


def read_error(exc: BaseException, dialect: str, message: str) -> Exception:
    """The error to raise for a failed read, by what the server said (:mod:`connectors.rds.errors`).

    ``RetriableError`` when the error passes (a lost connection, a serialization
    failure, a shutdown), ``FatalError`` otherwise (a permission, a missing column).
    """
    from connectors.rds.errors import classify

    meaning = classify(exc, dialect)
    suffix = f" (SQLSTATE/code {meaning.code})" if meaning.code else ""
    if meaning.meaning in ("busy", "transient"):
        return RetriableError(message + suffix)
    return FatalError(message + suffix)


def db_reason(exc: BaseException) -> str:
    """The database's own message, first line, without SQLAlchemy's statement dump (no values leak)."""
    orig = getattr(exc, "orig", None)
    text_ = str(orig if orig is not None else exc).strip()
    return text_.splitlines()[0] if text_ else type(exc).__name__
