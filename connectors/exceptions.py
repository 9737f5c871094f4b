"""Deprecated alias of :mod:`kernel.exceptions` (the error taxonomy moved to the kernel package).

Importing it warns with a :class:`DeprecationWarning`; every name of
:mod:`kernel.exceptions` is re-exported unchanged.
"""

import warnings

from kernel.exceptions import *  # noqa: F403 - the whole public surface of the moved module
from kernel.exceptions import __all__ as _moved_all

__all__ = list(_moved_all)

warnings.warn(
    "connectors.exceptions is deprecated: import kernel.exceptions instead",
    DeprecationWarning,
    stacklevel=2,
)
