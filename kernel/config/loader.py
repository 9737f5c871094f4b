"""Load connector config YAML into validated pydantic models.

One place reads config files: it keeps every key's line number, resolves
``${env:NAME}`` (``${env:NAME:-default}`` for a default, as in docker compose; only
variables on the allow-list: ``THREES_*`` and ``HOSTNAME``, plus the names or patterns
the operator lists in ``THREES_ENV_REFS``) and ``${file:path}`` (relative to the config
file; only under its folder, ``/run/secrets`` or a directory of ``THREES_FILE_REF_DIRS``)
references, validates the document with
the pipeline model, and reports **every** problem at once as
``file:line: path: message`` (like ``pipeline.yaml:14: sources[1].table: Field required``).
Values are never echoed in errors, so a secret cannot leak through one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kernel.config.references import resolve_references
from kernel.exceptions import ConfigError, ConfigProblem

M = TypeVar("M", bound=BaseModel)

Path_ = tuple[str | int, ...]


class _Yaml12BoolLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans: only true/false, so ``on``/``no``/``yes`` stay strings.

    YAML 1.1 (PyYAML's default) reads ``on: ...`` as ``True: ...`` and the
    country code ``NO`` as ``False`` (the "Norway problem"); editors using the
    JSON Schema from ``threes schema`` follow YAML 1.2, so do we.
    """


_Yaml12BoolLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12BoolLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def format_path(path: Path_) -> str:
    """Render a key path as ``sources[1].table``.

    Args:
        path: keys (str) and list indices (int), outermost first.

    Returns:
        The dotted path with list indices in brackets; ``""`` for the root.
    """
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _compose(text: str, file: str | None) -> tuple[Any, dict[Path_, int]]:
    """Parse YAML text into plain data plus a map from key path to 1-based line."""
    try:
        loader = _Yaml12BoolLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        msg = f"broken YAML: {exc.problem or exc}"
        raise ConfigError([ConfigProblem("", msg, file, line)]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigProblem("", f"broken YAML: {exc}", file)]) from exc

    lines: dict[Path_, int] = {}
    problems: list[ConfigProblem] = []

    def walk(n: yaml.Node, path: Path_) -> None:
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, value_node in n.value:
                key = key_node.value
                if key in seen:
                    problems.append(
                        ConfigProblem(
                            format_path((*path, key)), "duplicate key", file, key_node.start_mark.line + 1
                        )
                    )
                seen.add(key)
                lines[(*path, key)] = key_node.start_mark.line + 1
                walk(value_node, (*path, key))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, (*path, i))

    if node is not None:
        walk(node, ())
    if problems:
        raise ConfigError(problems)
    return data, lines


def _line_for(loc: tuple[Any, ...], data: Any, lines: dict[Path_, int]) -> tuple[Path_, int | None]:
    """Map a pydantic error location to a document path and the nearest known line.

    Pydantic inserts union tags (``sources.1.rds_source.table``) and validator
    names into ``loc``; parts that are not keys of the document are dropped.
    """
    path: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and node.get("type") == part:
            continue  # discriminated-union tag
        elif isinstance(part, str) and not part.startswith(("function-", "tagged-union")):
            path.append(part)  # a missing key: keep it in the path, line of the parent
            node = None
        else:
            continue
    for cut in range(len(path), -1, -1):
        line = lines.get(tuple(path[:cut]))
        if line is not None:
            return tuple(path), line
    return tuple(path), None


def validate_data(
    model: type[M],
    data: Any,
    *,
    file: str | None = None,
    lines: dict[Path_, int] | None = None,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> M:
    """Resolve references in ``data`` and validate it against ``model``.

    Args:
        model: the pydantic model of the whole document.
        data: the parsed document (dicts, lists, scalars).
        file: the file name to put in errors, if any.
        lines: key path -> line map from the YAML, if any.
        environ: variables for ``${env:NAME}``; ``os.environ`` when ``None``.
        base_dir: directory that relative ``${file:...}`` paths start from; the
            current directory when ``None``.

    Returns:
        The validated model instance.

    Raises:
        ConfigError: with every problem found, each with its path and line.
    """
    lines = lines or {}
    environ = os.environ if environ is None else environ
    ref_problems: list[tuple[Path_, str]] = []
    resolved = resolve_references(data, (), base_dir or Path.cwd(), environ, ref_problems)
    problems = [ConfigProblem(format_path(p), msg, file, lines.get(p)) for p, msg in ref_problems]
    if not isinstance(resolved, dict):
        problems.append(ConfigProblem("", "the document must be a mapping of keys to values", file, 1))
        raise ConfigError(problems)
    try:
        # relative paths (schemas, mapping files) start at the config's folder: one rule everywhere
        # environ: the file paths a config names (CA files, SQLite databases) are confined as ${file:} is
        instance = model.model_validate(resolved, context={"base_dir": base_dir or Path.cwd(), "environ": environ,
                                                           "config_file": file})
    except ValidationError as exc:
        problems += _validation_problems(exc, resolved, lines, file, [p for p, _ in ref_problems])
        raise ConfigError(sorted(problems, key=lambda p: (p.line or 0, p.path))) from None
    # Cross-references (a connector naming a connection...) are checked once
    # every field is valid, each problem with its own path and line.
    check = getattr(instance, "reference_problems", None)
    for ref_path, msg in check() if check else []:
        problems.append(ConfigProblem(format_path(ref_path), msg, file, _line_for(ref_path, resolved, lines)[1]))
    if problems:
        raise ConfigError(sorted(problems, key=lambda p: (p.line or 0, p.path)))
    from kernel.redact import register_secrets

    register_secrets(instance)  # masked in every log line and dead letter from now on
    return instance


_LEADING_PATH = re.compile(r"^((?:[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*)(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*)*): (.+)$",
                           re.S)


def _leading_path(message: str) -> tuple[tuple[str | int, ...], str] | None:
    """``("lookups", 0, "as_of"), "rest"`` of a message ``"lookups[0].as_of: rest"``; ``None`` without one."""
    m = _LEADING_PATH.match(message)
    if m is None or "[" not in m.group(1) and "." not in m.group(1):
        return None  # a bare word ("updates: ...") is a section, often not a key of the document
    parts: list[str | int] = []
    for piece in m.group(1).split("."):
        name, *indexes = re.split(r"\[(\d+)\]", piece)
        parts.append(name)
        parts += [int(i) for i in indexes if i]
    return tuple(parts), m.group(2)


def _validation_problems(exc: ValidationError, resolved: dict[str, Any], lines: dict[Path_, int], file: str | None,
                         failed_refs: list[Path_]) -> list[ConfigProblem]:
    """The validation errors as problems at their YAML path and line, in the words a YAML author reads.

    An error under a reference that could not be resolved is left out: the reference's own
    problem is its cause.
    """
    problems = []
    for err in exc.errors(include_input=False, include_url=False):
        path, line = _line_for(err["loc"], resolved, lines)
        if any(path[: len(r)] == r or r[: len(path)] == path for r in failed_refs):
            continue
        message = err["msg"].removeprefix("Value error, ")
        inner = _leading_path(message)
        if inner is not None and err["type"] == "value_error":
            # a model's validator names the key it is about ("lookups[0].as_of: ..."): report it there
            path, line = _line_for((*err["loc"], *inner[0]), resolved, lines)
            message = inner[1]
        if err["type"] == "extra_forbidden":
            message = "unknown key (not allowed here; check the spelling)"
        elif err["type"] == "union_tag_invalid":
            path = (*path, "type")
            line = lines.get(path, line)
        problems.append(ConfigProblem(format_path(path), message, file, line))
    return problems


def load_yaml_model(
    model: type[M], path: str | Path, *, environ: Mapping[str, str] | None = None
) -> M:
    """Read a YAML file and validate it against ``model``.

    Args:
        model: the pydantic model of the document.
        path: the YAML file.
        environ: variables for ``${env:NAME}``; ``os.environ`` when ``None``.

    Returns:
        The validated model.

    Raises:
        ConfigError: the file is missing, unreadable, broken YAML, or invalid;
            every problem is listed with file, line and key path.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([ConfigProblem("", f"cannot read config file: {exc.strerror}", str(path))]) from exc
    data, lines = _compose(text, str(path))
    return validate_data(
        model, data, file=str(path), lines=lines, environ=environ, base_dir=path.parent
    )


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def locate(problems: list[ConfigProblem], path: str | Path) -> list[ConfigProblem]:
    """Give problems found after loading (schema checks) the file and line of their key path.

    Args:
        problems: problems whose ``path`` is a key path of the document
            (``stream.lookups[1].on.dest``), without file or line.
        path: the config file they belong to.

    Returns:
        The same problems with ``file`` and the line of the key (of its nearest
        parent when the key is not in the file), sorted by line.
    """
    try:
        _, lines = _compose(Path(path).read_text(), str(path))
    except (OSError, ConfigError):
        lines = {}
    out = []
    for p in problems:
        parts: list[str | int] = [m.group(1) if m.group(1) is not None else int(m.group(2))
                                  for m in _PATH_PART.finditer(p.path)]
        line = None
        for cut in range(len(parts), -1, -1):
            line = lines.get(tuple(parts[:cut]))
            if line is not None:
                break
        out.append(ConfigProblem(p.path, p.message, p.file or str(path), p.line or line))
    return sorted(out, key=lambda p: (p.line or 0, p.path))
