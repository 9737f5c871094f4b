"""Operating-system helpers: service users, folder permissions, Debian packages, programs and JDKs."""

from __future__ import annotations

import logging
import os
import pwd
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from .common import LocalStackError
from .process import run

logger = logging.getLogger(__name__)


def is_root() -> bool:
    """Whether we run as root (services that refuse root then run as another user)."""
    return os.geteuid() == 0


def ensure_system_user(name: str) -> pwd.struct_passwd:
    """Return the OS user ``name``, creating it as a system user when missing (root only).

    Raises:
        LocalStackError: If the user is missing and cannot be created.
    """
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        what=f"create the OS user {name!r} (useradd)",
    )
    return pwd.getpwnam(name)


def chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    """Give ``path`` and everything below it to ``user`` (skips entries already owned)."""
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            full = os.path.join(root, name)
            st = os.lstat(full)
            if st.st_uid != user.pw_uid or st.st_gid != user.pw_gid:
                os.lchown(full, user.pw_uid, user.pw_gid)
    os.chown(path, user.pw_uid, user.pw_gid)


def make_traversable(path: Path) -> None:
    """Let other users reach ``path``: add the ``x`` bit for others to each parent folder.

    Only folders that lack it are changed (never read or write bits).
    """
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if not mode & 0o001:
            logger.info("making %s traversable (chmod o+x) for the service users", parent)
            os.chmod(parent, mode | 0o001)


def as_user(user: str | None, cmd: Sequence[str]) -> list[str]:
    """Prefix ``cmd`` so that it execs as ``user`` (keeps the environment); no-op for None."""
    if user is None:
        return list(cmd)
    entry = pwd.getpwnam(user)
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--",
        *cmd,
    ]


SYSTEM_BIN = (Path("/usr/sbin"), Path("/usr/bin"), Path("/usr/local/sbin"), Path("/usr/local/bin"))
"""Where Debian's packages put server programs (``sbin`` is often not on a non-root ``PATH``)."""


def find_program(*names: str, folders: Iterable[Path] = SYSTEM_BIN) -> Path | None:
    """Return the first ``folder/name`` that exists (folders in order, then names in order), or None.

    Args:
        names: Program names, preferred first (``mariadbd``, ``mysqld``).
        folders: Folders to look in, preferred first.
    """
    for folder in folders:
        for name in names:
            path = folder / name
            if path.exists():
                return path
    return None


def apt_install(package: str, *, title: str, missing: str, env_var: str, log: Path) -> None:
    """Install Debian's ``package`` with ``apt-get`` (root only): the first-run install of a database.

    ``apt-get install`` is tried first and ``apt-get update`` only when it fails
    (stale or empty package lists); both wait up to 5 minutes for a dpkg lock
    held by another install (two services installing in the same ``up``)
    instead of failing.

    Args:
        package: Debian package name (``postgresql``).
        title: Human name of the service (``PostgreSQL``).
        missing: What is missing, for the error when we are not root (``pg_ctl missing``).
        env_var: The variable that points at a running server instead.
        log: File apt's output is appended to.

    Raises:
        LocalStackError: If we are not root, or ``apt-get`` fails.
    """
    if not is_root():
        raise LocalStackError(
            f"{title} is not installed ({missing}); install it with "
            f"'sudo apt-get install -y {package}' or set {env_var}"
        )
    logger.info("installing Debian's %s package for %s (first run only)", package, title)
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    wait_lock = ["-o", "DPkg::Lock::Timeout=300"]
    install = ["apt-get", *wait_lock, "install", "-y", "--no-install-recommends", package]
    try:
        run(install, what=f"install {package} with apt-get", log=log, env=env)
    except LocalStackError:
        logger.info("apt-get install %s failed; updating the package lists and trying again", package)
        run(["apt-get", *wait_lock, "update"], what="run apt-get update", log=log, env=env)
        run(install, what=f"install {package} with apt-get (see {log})", log=log, env=env)


def java_major(java_home: Path) -> int | None:
    """Return the feature version of the JDK at ``java_home`` (17, 21, 25...), or None."""
    try:
        release = (java_home / "release").read_text()
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release, re.MULTILINE)
    if not match or not (java_home / "bin" / "java").exists():
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def find_java(minimum: int, *, prefer: Sequence[str] = (), env_vars: Sequence[str] = ("JAVA_HOME",)) -> Path:
    """Find a JDK home with feature version ``>= minimum``.

    Order: the ``env_vars`` that point at a good enough JDK, then ``prefer``
    paths, then the newest JDK under ``/usr/lib/jvm``.

    Raises:
        LocalStackError: If there is none.
    """
    candidates = [Path(os.environ[v]) for v in env_vars if os.environ.get(v)]
    candidates += [Path(p) for p in prefer]
    for home in candidates:
        major = java_major(home)
        if major is not None and major >= minimum:
            return home
    found: list[tuple[int, Path]] = []
    jvm = Path("/usr/lib/jvm")
    if jvm.is_dir():
        for home in jvm.iterdir():
            major = java_major(home)
            if major is not None and major >= minimum and not home.is_symlink():
                found.append((major, home))
    if found:
        return max(found)[1]
    raise LocalStackError(
        f"no Java {minimum}+ JDK found (checked {', '.join(env_vars)} and /usr/lib/jvm); "
        f"install one, e.g. apt-get install -y openjdk-17-jdk-headless"
        + (" (Elasticsearch needs 21+; set ES_JAVA_HOME)" if minimum >= 21 else "")
    )
