"""Durations of the stream config (``'1 day'``, ``'15 minutes'``) in seconds."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^(\d+)\s+(second|minute|hour|day|week)s?$")


_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}


def duration_s(text: str) -> int:
    """Seconds of a duration of the config (``'1 day'``, ``'15 minutes'``).

    Raises:
        ValueError: not ``<n> second(s)|minute(s)|hour(s)|day(s)|week(s)``.
    """
    m = _DURATION.match(text.strip())
    if m is None:
        raise ValueError("expected '<n> second(s)|minute(s)|hour(s)|day(s)|week(s)', e.g. '1 day'")
    return int(m.group(1)) * _SECONDS[m.group(2)]
