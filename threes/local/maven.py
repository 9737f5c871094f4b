"""Fetch Java artifacts with Maven into the project-local folder.

Every call uses a project-local repository (``.threes/m2``) and batch mode, and
writes into a temporary folder that is renamed into place only when Maven
succeeded, so an interrupted download never looks complete.
"""

from __future__ import annotations

import logging
import shutil
import threading
from importlib import resources
from pathlib import Path

from .common import Layout, LocalStackError
from .process import run

logger = logging.getLogger(__name__)

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
"""Pinned plugin, so that a fresh machine resolves the same thing every time."""

_bootstrap_lock = threading.Lock()
_bootstrapped: set[Path] = set()


def _mvn() -> str:
    exe = shutil.which("mvn")
    if exe is None:
        raise LocalStackError("Maven (mvn) is not installed; install it (apt-get install -y maven) and retry")
    return exe


def _run_mvn(layout: Layout, args: list[str], *, what: str, log_name: str, cwd: Path) -> None:
    """Run Maven; the first call per repository runs alone so plugins download once.

    Concurrent Maven processes that download the same artifact into one local
    repository can trip over each other; after the first call the plugin and
    its dependencies are present and later calls only fetch disjoint artifacts.
    """
    cmd = [_mvn(), "-B", "-q", "-Dstyle.color=never", f"-Dmaven.repo.local={layout.m2}", *args]
    log = layout.logs / f"maven-{log_name}.log"
    marker = layout.m2 / ".plugin-ready"
    if layout.m2 not in _bootstrapped and not marker.exists():
        with _bootstrap_lock:
            if layout.m2 not in _bootstrapped and not marker.exists():
                run(cmd, what=what, log=log, cwd=cwd, timeout=1200)
                marker.touch()
                _bootstrapped.add(layout.m2)
                return
    run(cmd, what=what, log=log, cwd=cwd, timeout=1200)


def copy_artifact(layout: Layout, coordinates: str, target: Path, *, log_name: str) -> Path:
    """Download one artifact (``group:artifact:version[:type[:classifier]]``) to ``target``.

    Skipped when ``target`` already exists.

    Args:
        layout: The project-local folder.
        coordinates: Maven coordinates, named exactly (no ranges).
        target: Final file path.
        log_name: Suffix of the Maven log (``logs/maven-<log_name>.log``).

    Returns:
        ``target``.

    Raises:
        LocalStackError: If Maven fails (offline, unknown artifact...).
    """
    if target.exists():
        return target
    tmp = target.parent / f".{target.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    logger.info("downloading %s with Maven (first run only)", coordinates)
    _run_mvn(
        layout,
        [
            f"{DEPENDENCY_PLUGIN}:copy",
            f"-Dartifact={coordinates}",
            f"-DoutputDirectory={tmp}",
            "-Dmdep.overWriteReleases=true",
        ],
        what=f"download {coordinates} with Maven",
        log_name=log_name,
        cwd=tmp,
    )
    files = [p for p in tmp.iterdir() if p.is_file()]
    if len(files) != 1:
        raise LocalStackError(f"Maven copied {len(files)} files for {coordinates}, expected 1")
    files[0].replace(target)
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def copy_dependencies(
    layout: Layout,
    pom_resource: str,
    target: Path,
    *,
    log_name: str,
    properties: dict[str, str] | None = None,
) -> Path:
    """Copy the (transitive, runtime-scope) dependencies of a packaged pom into ``target``.

    Skipped when ``target`` already exists (it is created only on success).

    Args:
        layout: The project-local folder.
        pom_resource: File name of a pom shipped in this package (``kafka-pom.xml``).
        target: Final folder of jars.
        log_name: Suffix of the Maven log.
        properties: Maven properties (``-Dname=value``) the pom reads, e.g. ``{"spark.version": "4.2.0"}``.

    Returns:
        ``target``.

    Raises:
        LocalStackError: If Maven fails.
    """
    if target.exists():
        return target
    work = target.parent / f".{target.name}.work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pom = work / "pom.xml"
    pom.write_text(resources.files(__package__).joinpath(pom_resource).read_text())
    out = work / "jars"
    logger.info("resolving %s with Maven (first run only)", pom_resource)
    _run_mvn(
        layout,
        [
            "-f",
            str(pom),
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
            *(f"-D{name}={value}" for name, value in (properties or {}).items()),
        ],
        what=f"resolve the jars of {pom_resource} with Maven",
        log_name=log_name,
        cwd=work,
    )
    if not out.is_dir() or not any(out.glob("*.jar")):
        raise LocalStackError(f"Maven resolved no jars for {pom_resource}; see the Maven log")
    out.replace(target)
    shutil.rmtree(work, ignore_errors=True)
    return target
