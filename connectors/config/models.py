"""Deprecated alias of :mod:`kernel.config.models` (the config models moved to the kernel package).

Importing it warns with a :class:`DeprecationWarning`; every name of
:mod:`kernel.config.models` is re-exported unchanged (including those that moved on to
:mod:`kernel.config.fields`, :mod:`kernel.config.policies` and :mod:`kernel.config.endpoints`).
"""

import warnings

from kernel.config.endpoints import *  # noqa: F403 - the whole public surface of the moved module
from kernel.config.fields import *  # noqa: F403
from kernel.config.models import *  # noqa: F403
from kernel.config.policies import *  # noqa: F403

warnings.warn(
    "connectors.config.models is deprecated: import kernel.config.models instead",
    DeprecationWarning,
    stacklevel=2,
)
