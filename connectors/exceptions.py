"""Errors of threes, grouped by what the caller does about them.

The taxonomy is defined in :mod:`schemas.exceptions`, the bottom layer, so the wire format
raises the same classes; this module is where the framework, the connectors and the
runtimes import it from:

* :class:`ConfigError` - fix the config file; carries every problem with its path.
* :class:`SetupError` - a system cannot be reached or refuses our credentials.
* :class:`RetriableError` / :class:`SinkBackpressureError` - try again later.
* :class:`FatalError` - stop the task; retrying cannot help.
* :class:`SkippableRecordError` - send this one record to the dead letter queue.
"""

from __future__ import annotations

from schemas.exceptions import (
    ConfigError,
    ConfigProblem,
    FatalError,
    RetriableError,
    SetupError,
    SinkBackpressureError,
    SkippableRecordError,
    ThreesError,
)

__all__ = [
    "ConfigError",
    "ConfigProblem",
    "FatalError",
    "RetriableError",
    "SetupError",
    "SinkBackpressureError",
    "SkippableRecordError",
    "ThreesError",
]
