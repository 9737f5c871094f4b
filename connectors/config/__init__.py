"""Connector config YAML: models, loading, validation.

Typical use::

    from connectors.config import load_pipeline
    pipeline = load_pipeline("examples/pipeline.yaml")   # raises ConfigError
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connectors.config.loader import load_yaml_model, validate_data
from connectors.config.pipeline import PipelineBase, pipeline_model


def load_pipeline(path: str | Path, *, environ: Mapping[str, str] | None = None) -> PipelineBase:
    """Load and validate a pipeline YAML file.

    Args:
        path: the connector config YAML.
        environ: variables for ``${env:NAME}``; ``os.environ`` when ``None``.

    Returns:
        The validated pipeline (an instance of :func:`pipeline_model`).

    Raises:
        ConfigError: every problem, each as ``file:line: key.path: message``.
    """
    return load_yaml_model(pipeline_model(), path, environ=environ)


def pipeline_from_dict(data: dict[str, Any], *, environ: Mapping[str, str] | None = None) -> PipelineBase:
    """Validate a pipeline given as a dict (tests, programmatic use).

    Raises:
        ConfigError: every problem, each with its key path.
    """
    return validate_data(pipeline_model(), data, environ=environ)


__all__ = ["PipelineBase", "load_pipeline", "pipeline_from_dict", "pipeline_model"]
