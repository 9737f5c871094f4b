"""The connector registry: the ``threes.connectors`` and ``threes.connections`` entry-point groups.

Like Kafka Connect's plugin path, but the Python way: any installed
distribution can add a connector by declaring, in its ``pyproject.toml``::

    [project.entry-points."threes.connectors"]
    my_source = "my_package.config:MySourceConfig"

The entry point names the connector's *config model* (a subclass of
:class:`~kernel.config.models.SourceConnectorConfig` or
``SinkConnectorConfig``), whose ``implementation`` names the class that runs.
Validating a config therefore imports no database, Elasticsearch or S3 client.
The framework itself imports no technology subpackage.

A technology's connection model (a :class:`~kernel.config.models.ConnectionConfig`
subclass, with its client factory and its ``check``) is registered the same way::

    [project.entry-points."threes.connections"]
    my_system = "my_package.connection:MySystemConnection"
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, TypeVar, overload

from kernel.config.models import ConnectionConfig, ConnectorConfig, SinkConnectorConfig, SourceConnectorConfig
from kernel.exceptions import FatalError

if TYPE_CHECKING:  # for the annotations only: validating a config imports no connector code
    from connectors.api.sink import Sink
    from connectors.api.source import SourceTask

_Model = TypeVar("_Model")  # the base class of an entry-point group

GROUP = "threes.connectors"
CONNECTIONS_GROUP = "threes.connections"


def _load(group: str, base: type[_Model], what: str) -> dict[str, type[_Model]]:
    """Load an entry-point group's classes, each a subclass of ``base``, by entry-point name.

    Raises:
        FatalError: an entry point cannot be imported or is not a ``base`` subclass (naming the plugin).
    """
    found: dict[str, type[_Model]] = {}
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            model = ep.load()
        except Exception as exc:  # a broken plugin must say which one
            raise FatalError(f"{what} plugin {ep.name!r} ({ep.value}) cannot be loaded: {exc}") from exc
        if not (isinstance(model, type) and issubclass(model, base)):
            raise FatalError(f"{what} plugin {ep.name!r} ({ep.value}) is not a {base.__name__} subclass")
        found[ep.name] = model
    return found


@functools.cache
def config_models() -> dict[str, type[ConnectorConfig]]:
    """Load every registered connector config model.

    Returns:
        Registry key (e.g. ``"rds_source"``) -> config model class, sorted by key.

    Raises:
        FatalError: an entry point cannot be imported or is not a connector config.
    """
    return _load(GROUP, ConnectorConfig, "connector")


def models_for(role: str) -> list[type[ConnectorConfig]]:
    """Config models of one role.

    Args:
        role: ``"source"`` or ``"sink"``.

    Returns:
        The registered models whose ``role`` matches, in registry-key order.
    """
    return [m for m in config_models().values() if m.role == role]


@overload
def load_implementation(config: SourceConnectorConfig) -> type[SourceTask]: ...


@overload
def load_implementation(config: SinkConnectorConfig) -> type[Sink]: ...


@overload
def load_implementation(config: ConnectorConfig) -> type[SourceTask] | type[Sink]: ...


def load_implementation(config: ConnectorConfig) -> type[SourceTask] | type[Sink]:
    """Import the class that runs a connector.

    Args:
        config: a validated connector config.

    Returns:
        The class named by ``config.implementation`` (``"module:Class"``): a :class:`SourceTask` subclass for a
        source's config, a :class:`Sink` subclass for a sink's (not checked here: the class is the plugin's).

    Raises:
        FatalError: the module or class does not exist.
    """
    module_name, _, attr = config.implementation.partition(":")
    try:
        implementation: type[SourceTask] | type[Sink] = getattr(importlib.import_module(module_name), attr)
        return implementation
    except (ImportError, AttributeError) as exc:
        raise FatalError(
            f"connector {config.name!r} of type {config.type!r}: implementation "
            f"{config.implementation!r} is not available: {exc}"
        ) from exc


@functools.cache
def connection_models() -> dict[str, type[ConnectionConfig]]:
    """Load every registered connection model.

    Returns:
        Connection type (e.g. ``"rds"``) -> model class, sorted by type.

    Raises:
        FatalError: an entry point cannot be imported or is not a ``ConnectionConfig`` subclass.
    """
    return _load(CONNECTIONS_GROUP, ConnectionConfig, "connection")
