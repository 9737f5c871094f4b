"""Deprecated alias of :mod:`kernel.config.models` (the config models moved to the kernel package).

Importing it warns with a :class:`DeprecationWarning`; every name of
:mod:`kernel.config.models` is re-exported unchanged.
"""

import warnings

from kernel.config.models import *  # noqa: F403 - the whole public surface of the moved module

warnings.warn(
    "connectors.config.models is deprecated: import kernel.config.models instead",
    DeprecationWarning,
    stacklevel=2,
)
