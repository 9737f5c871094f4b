"""The example pipelines shipped inside the ``threes`` package.

The repository's ``examples/`` folder is the one copy of each example; ``threes/examples`` links to it and the
wheel ships its YAML and Avro files as package data (``pyproject.toml``), so ``threes demo`` finds its pipeline
after ``pip install 'threes[demo]'`` in any folder, not only in a clone.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from kernel.exceptions import SetupError

NYCFLIGHTS13 = "nycflights13/pipeline.yaml"
"""The demo's pipeline, relative to the examples folder."""


def example_path(name: str = NYCFLIGHTS13) -> Path:
    """The file of a shipped example, as a path on disk.

    A path rather than a :mod:`importlib.resources` traversable because the demo hands it to the processes it
    starts, and a pipeline resolves its relative schema paths against the YAML's folder.

    Args:
        name: the file relative to the examples folder, e.g. ``"nycflights13/pipeline.yaml"`` or
            ``"pipeline.yaml"``.

    Returns:
        The absolute path of the file inside the installed package (an editable install: the repository's
        ``examples/``).

    Raises:
        SetupError: the package was installed without its examples, or from a zip archive.
    """
    ref = resources.files("threes") / "examples" / name
    if not isinstance(ref, Path) or not ref.is_file():
        raise SetupError(f"the example {name} is not installed with threes", "reinstall it: pip install 'threes[demo]'")
    return ref.resolve()
