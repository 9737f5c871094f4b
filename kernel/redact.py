"""Secrets out of everything printed: URLs' userinfo and query strings, and every configured secret value.

Two layers, because a secret can reach a message through text nobody wrote for
it (a driver's error that echoes the connection string, a library's debug log):

* :func:`mask_url` / :func:`redact` rewrite the shapes a secret takes in text:
  ``scheme://user:PW@host`` keeps the user and masks ``PW``; query options and
  ``key=value`` pairs named like a secret (``password``, ``secret``, ``token``,
  ``api_key``, ``sslpassword``...) keep the name and mask the value;
* every ``SecretStr`` of a loaded config is registered (:func:`register_secrets`)
  and replaced wherever it appears, whatever the text around it.

:class:`RedactingFilter` applies both to every log record (message and
traceback) at the handlers, so library loggers are covered too; the dead letter
topic's error text and ``threes check``'s lines go through :func:`redact`.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

MASK = "**********"

_lock = threading.Lock()
_secrets: set[str] = set()
_secrets_re: re.Pattern[str] | None = None

# scheme://user:password@host -> keep the scheme and the user
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@?#]*):(?P<pw>[^\s@/?#]*)@")
# password=..., ?secret_key=..., "api_key": "...": keep the name, mask the value
_SECRET_NAMES = r"[\w.-]*(?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|credential)[\w.-]*"
_KEY_VALUE = re.compile(
    rf"(?i)(?P<name>\b{_SECRET_NAMES}['\"]?)(?P<sep>\s*[=:]\s*)(?P<q>['\"]?)(?P<value>[^\s&'\",;)}}]+)"
)


MIN_REGISTERED_LENGTH = 8
"""Shorter secrets are masked only where their shape shows (URL, ``password=``): masking a
short value everywhere would mask ordinary words (a local stack's password ``threes``)."""


def register_secret(value: str | None) -> None:
    """Mask ``value`` in everything :func:`redact` sees from now on (see :data:`MIN_REGISTERED_LENGTH`)."""
    global _secrets_re
    if not value or len(value) < MIN_REGISTERED_LENGTH:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        ordered = sorted(_secrets, key=len, reverse=True)  # the longest first: a secret inside another
        _secrets_re = re.compile("|".join(re.escape(s) for s in ordered))


def register_secrets(model: Any) -> None:
    """Register every ``SecretStr`` value found in a pydantic model (recursively, through lists and dicts)."""
    from pydantic import BaseModel, SecretStr

    seen: set[int] = set()

    def walk(value: Any) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, SecretStr):
            register_secret(value.get_secret_value())
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name, None))
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, str) and re.fullmatch(_SECRET_NAMES, str(key), re.IGNORECASE):
                    register_secret(item)  # a secret in a pass-through map (spark.hadoop.fs.s3a.secret.key)
                else:
                    walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(model)


def mask_url(url: str) -> str:
    """Return ``url`` with the password of its userinfo and secret query values masked.

    Args:
        url: any URL or connection string (``postgresql://u:PW@h/db?sslpassword=X``).

    Returns:
        The same text with ``PW`` and ``X`` replaced by ``**********``.
    """
    return redact(url)


def redact(text: str) -> str:
    """Mask secrets in free text: URL passwords, secret-named ``key=value`` pairs, registered secrets."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    text = _KEY_VALUE.sub(lambda m: f"{m.group('name')}{m.group('sep')}{m.group('q')}{MASK}", text)
    pattern = _secrets_re
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return text


def redact_document(value: Any) -> Any:
    """A copy of a JSON-like document with every string passed through :func:`redact` (keys too).

    The status document (``/status``, ``/status.json``, ``threes status``) carries error
    texts written by drivers (``last_error``), which can echo a connection URL: it gets
    the same masking as the logs.

    Args:
        value: dicts, lists, tuples, strings and scalars.

    Returns:
        The same shape; tuples become lists (as in JSON).
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_document(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_document(v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """A handler filter that masks secrets in a record's message and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:  # logging's API
        """Rewrite the record in place; always keep it."""
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to logging's own error path
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a :class:`RedactingFilter` to every handler of ``logger`` (the root logger by default), once."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
