"""``${env:NAME}`` and ``${file:path}`` in a config, resolved; the files and variables a config may read.

A config file is data that may come from someone with less power than the process that runs it.
``${env:...}`` reads only allow-listed variables (:func:`env_ref_allowed`); ``${file:...}``, and
any file a config names (a CA file, a SQLite database), only under the config's folder and the
directories where secrets are mounted (:func:`file_allowed`). ``$${`` escapes a literal ``${``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_REF = re.compile(r"\$(\$?)\{(env|file):([^}]*)\}")

Path_ = tuple[str | int, ...]


FILE_REF_DIRS_VARIABLE = "THREES_FILE_REF_DIRS"
"""Environment variable: more directories ``${file:...}`` may read under (``os.pathsep``-separated)."""
DEFAULT_FILE_REF_DIRS = ("/run/secrets", "/var/run/secrets")
"""Where Docker and Kubernetes mount secrets: always readable by ``${file:...}``."""


ENV_REFS_VARIABLE = "THREES_ENV_REFS"
"""Environment variable: more variables ``${env:...}`` may read, comma-separated names or ``fnmatch``
patterns (``PGPASSWORD,KAFKA_*``; ``*`` allows every variable, Kafka Connect's ``EnvVarConfigProvider``
default). It is read from the process's environment, never from a config file."""
DEFAULT_ENV_REFS = ("THREES_*", "HOSTNAME")
"""The variables ``${env:...}`` may always read: threes' own, and the host name (static membership)."""


def env_ref_allowed(name: str, environ: Mapping[str, str]) -> bool:
    """Whether a config file may read the environment variable ``name`` (``${env:name}``).

    A config file is data that may come from someone with less power than the process that runs
    it: an unrestricted ``${env:...}`` would let it read the process's cloud keys into a field
    that ``threes check`` prints. The allow-list is :data:`DEFAULT_ENV_REFS` plus
    ``THREES_ENV_REFS`` (after Kafka Connect's ``EnvVarConfigProvider`` ``allowlist.pattern``).

    Args:
        name: the variable's name.
        environ: the environment, for ``THREES_ENV_REFS``.
    """
    extra = [p.strip() for p in environ.get(ENV_REFS_VARIABLE, "").split(",") if p.strip()]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in (*DEFAULT_ENV_REFS, *extra))


def file_ref_roots(base_dir: Path, environ: Mapping[str, str]) -> list[Path]:
    """The directories ``${file:...}`` may read under: the config's folder and the allowed ones.

    Args:
        base_dir: the config file's folder.
        environ: the environment, for ``THREES_FILE_REF_DIRS``.

    Returns:
        Resolved absolute paths.
    """
    extra = [d for d in environ.get(FILE_REF_DIRS_VARIABLE, "").split(os.pathsep) if d.strip()]
    return [Path(d).expanduser().resolve() for d in [str(base_dir), *DEFAULT_FILE_REF_DIRS, *extra]]


def file_allowed(path: str | Path, base_dir: Path, environ: Mapping[str, str]) -> bool:
    """Whether a config may name the file ``path`` (a ``${file:...}``, a CA or CRL file, a SQLite database).

    Args:
        path: the path as written (relative to ``base_dir`` unless absolute; ``~`` expanded).
        base_dir: the config file's folder.
        environ: the environment, for ``THREES_FILE_REF_DIRS``.

    Returns:
        ``True`` when the path, with symbolic links and ``..`` resolved, is under the config's
        folder, ``/run/secrets``, ``/var/run/secrets`` or a directory of ``THREES_FILE_REF_DIRS``.
    """
    file_path = Path(path).expanduser()
    if not file_path.is_absolute():
        file_path = base_dir / file_path
    real = file_path.resolve()  # symbolic links and .. resolved: where the read really goes
    return any(real.is_relative_to(root) for root in file_ref_roots(base_dir, environ))


def resolve_references(
    data: Any, path: Path_, base_dir: Path, environ: Mapping[str, str], problems: list[tuple[Path_, str]]
) -> Any:
    """Replace ``${env:NAME}`` / ``${file:path}`` in every string of a parsed document.

    Args:
        data: the document (dicts, lists, scalars).
        path: the key path of ``data`` in the document (``()`` at the top).
        base_dir: the config's folder: relative ``${file:...}`` paths start there.
        environ: the environment (``${env:...}``, ``THREES_ENV_REFS``, ``THREES_FILE_REF_DIRS``).
        problems: gets ``(key path, message)`` for each reference that cannot be resolved (not set,
            not on the allow-list, outside the allowed directories, unreadable); its value becomes ``""``.

    Returns:
        ``data`` with every reference replaced; ``$${`` escapes a literal ``${``.
    """
    if isinstance(data, dict):
        return {k: resolve_references(v, (*path, k), base_dir, environ, problems) for k, v in data.items()}
    if isinstance(data, list):
        return [resolve_references(v, (*path, i), base_dir, environ, problems) for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data

    def substitute(m: re.Match[str]) -> str:
        escaped, kind, ref = m.groups()
        if escaped:
            return m.group(0)[1:]
        if kind == "env":
            ref, has_default, default = ref.partition(":-")
            if not env_ref_allowed(ref, environ):
                problems.append((path, f"${{env:{ref}}} is not on the allow-list of environment variables a config "
                                       f"may read ({', '.join(DEFAULT_ENV_REFS)}): not read; rename the variable "
                                       f"THREES_..., or let the process allow it with {ENV_REFS_VARIABLE}={ref}"))
                return ""
            if ref not in environ and has_default:
                return default
            if ref not in environ:
                problems.append((path, f"environment variable {ref} is not set (referenced as ${{env:{ref}}})"))
                return ""
            return environ[ref]
        file_path = Path(ref).expanduser()
        if not file_path.is_absolute():
            file_path = base_dir / file_path
        if not file_allowed(ref, base_dir, environ):
            problems.append((path, f"${{file:{ref}}} is outside the config's folder and the allowed directories "
                                   f"({FILE_REF_DIRS_VARIABLE}, {', '.join(DEFAULT_FILE_REF_DIRS)}): not read"))
            return ""
        try:
            return file_path.read_text().rstrip("\r\n")
        except OSError as exc:
            problems.append((path, f"cannot read ${{file:{ref}}}: {exc.strerror}"))
            return ""

    return _REF.sub(substitute, data)
