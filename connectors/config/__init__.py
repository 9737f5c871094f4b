"""Deprecated: the config models moved to :mod:`kernel.config`.

``connectors.config.models`` still imports (with a :class:`DeprecationWarning`) for
third-party connectors written against it; import :mod:`kernel.config.models` instead.
"""
