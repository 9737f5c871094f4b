"""Class data sharing for the driver's JVM: Spark's classes mapped from an archive of an earlier run.

A new driver JVM loads, parses and verifies thousands of classes from Spark's jars
before and during its first query; most of a session's start and of the first
micro-batch's planning is that. A JDK *dynamic archive* (JEP 350, JDK 13+)
holds those classes already parsed and verified, and a later JVM maps it
(``-XX:SharedArchiveFile``): a session and its first query start sooner
(``driver_start`` in benchmarks/RESULTS.md).

How an archive comes to exist (no command to run):

1. A driver started when no archive matches its installation runs with
   ``-XX:ArchiveClassesAtExit=<folder>/driver-<pid>.jsa.part`` (training). One
   process trains at a time (``training.lock``, taken over when its process is
   gone); drivers started meanwhile run without an archive.
2. At this process's exit (``atexit``), the JVM is asked to exit (its stdin is
   closed: PySpark's gateway then calls ``System.exit``), it writes the
   archive (once), and the file is renamed to ``driver.jsa`` only when
   the JVM exited with status 0. An archive being written is never mapped: a
   truncated one crashes the JVM (SIGBUS, checked), so only a complete file
   ever takes the final name, by an atomic rename.
3. Later drivers map ``driver.jsa``. The JVM checks it against its own build
   and class path and runs without it when they differ; the folder is keyed by
   the ``java`` binary, Spark's jars, the extra jars and the driver's JVM
   options, so an upgrade trains a new archive instead of ignoring the old one.

The archives live under ``$THREES_CACHE_DIR`` (default ``~/.cache/threes``)
``/jvm/<key>/`` (``archive_mb`` of ``driver_start`` in benchmarks/RESULTS.md); an installation no driver used for a week
loses its archive when another one trains. The JVM's own ``cds`` log lines are
switched off (``-Xlog:cds*=off``): a training run would print hundreds of
"skipping class" warnings. An archive trained with one heap size is mapped with
another (checked: 1, 2 and 4 GB).

The executors' archive (a standalone cluster on this host) is
:mod:`stream_app.executor_class_data_sharing`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ARCHIVE = "driver.jsa"
LOCK = "training.lock"
UNUSED_DAYS = 7
_STALE_S = 3600.0
QUIET = "-Xlog:cds*=off"


def cache_dir() -> Path:
    """``$THREES_CACHE_DIR``, else ``$XDG_CACHE_HOME/threes``, else ``~/.cache/threes``."""
    explicit = os.environ.get("THREES_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "threes"


def java_binary() -> str | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def spark_jars_dir() -> Path:
    """Spark's ``jars`` folder: ``$SPARK_HOME/jars``, else the pyspark package's."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _stat_line(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{path} missing"
    return f"{path} {st.st_size} {st.st_mtime_ns}"


def archive_key(java: str, jars_dir: Path, extra: Sequence[str], java_options: str) -> str:
    """The key of an installation: 16 hex digits over everything an archive depends on.

    Args:
        java: the ``java`` binary's real path.
        jars_dir: Spark's ``jars`` folder (the driver's class path).
        extra: other class path entries (``spark.jars``, ``SPARK_DIST_CLASSPATH``).
        java_options: the driver's JVM options from the settings (the heap size is left out: the
            JVM itself refuses an archive it cannot use).
    """
    lines = [_stat_line(java), str(jars_dir.resolve()), java_options]
    try:
        lines += sorted(_stat_line(str(p)) for p in jars_dir.iterdir() if p.suffix == ".jar")
    except OSError:
        lines.append("no jars folder")
    lines += [_stat_line(os.path.realpath(e)) for e in extra]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DriverArchive:
    """The archive of one installation, and what the driver's JVM runs with.

    Attributes:
        folder: ``<cache>/jvm/<key>``.
        java_options: JVM options to add (map the archive, or train one).
        part: the file a training JVM writes (``None``: the archive exists and is mapped); the
            process that trains holds :attr:`lock` until :meth:`finish`.
    """

    folder: Path
    java_options: tuple[str, ...]
    part: Path | None

    @property
    def lock(self) -> Path:
        """The file a training process holds (one trainer per installation at a time)."""
        return self.folder / LOCK

    @property
    def archive(self) -> Path:
        """The installed archive's path (it may not exist yet)."""
        return self.folder / ARCHIVE

    def finish(self, proc: Any, timeout_s: float = 60.0) -> bool:
        """Let a training JVM exit and write its archive; name it ``driver.jsa`` when complete.

        Args:
            proc: the driver JVM's ``subprocess.Popen`` (PySpark's gateway process).
            timeout_s: how long to wait for the JVM to exit and write.

        Returns:
            Whether an archive was installed (never raises: a failed training only costs a
            retraining later).
        """
        if self.part is None:
            return False
        try:
            return _install(proc, self.part, self.archive, timeout_s)
        finally:
            self.part.unlink(missing_ok=True)  # what an incomplete training left (gone once installed)
            self.lock.unlink(missing_ok=True)

    def abandon(self) -> None:
        """Give the training up (no JVM of this process will write the archive)."""
        if self.part is not None:
            self.part.unlink(missing_ok=True)
            self.lock.unlink(missing_ok=True)


def _install(proc: Any, part: Path, archive: Path, timeout_s: float) -> bool:
    """Wait for the training JVM to exit; rename its archive into place after a clean exit."""
    try:
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.close()  # PySpark's gateway exits (System.exit) when its stdin closes
        code = proc.wait(timeout_s)
    except Exception as exc:  # a timeout or a closed pipe: no archive this time
        log.debug("class data sharing: training JVM did not exit: %s", exc)
        try:
            proc.kill()
        except Exception:
            pass
        return False
    if code != 0 or not part.exists():
        return False
    try:
        os.replace(part, archive)  # atomic: a reader sees no file or a complete one
    except OSError as exc:
        log.debug("class data sharing: archive not installed: %s", exc)
        return False
    log.debug("class data sharing: archive written %s", archive)
    return True


def take_lock(lock: Path) -> bool:
    """Create ``lock`` with this process's pid; a lock whose process is gone is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(lock.read_text().strip() or "0")
                os.kill(owner, 0)  # raises when that process is gone
                if time.time() - lock.stat().st_mtime < _STALE_S:
                    return False
            except (OSError, ValueError):
                pass
            lock.unlink(missing_ok=True)  # stale: its trainer died before finishing
            continue
        except OSError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True
    return False


def prune(root: Path, keep: Path) -> None:
    """Drop the archives of installations no driver used for ``UNUSED_DAYS``; drop stale training files.

    A training file (``*.part``) not written for ``_STALE_S`` is what a killed or cut-off training
    left (an archive is written in well under a minute), in any installation's folder: one left in
    another installation's folder would otherwise hold its hundreds of MB until that folder's week
    of disuse. Removing it keeps the folder's modification time, which records its last use.
    """
    now = time.time()
    try:
        folders = [p for p in root.iterdir() if p.is_dir() and p != keep]
    except OSError:
        return
    for folder in [keep, *folders]:
        try:
            stat = folder.stat()
        except OSError:
            continue
        if folder != keep and now - stat.st_mtime > UNUSED_DAYS * 86400:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        removed = False
        for part in folder.glob("*.part"):
            try:
                if now - part.stat().st_mtime > _STALE_S:
                    part.unlink()
                    removed = True
            except OSError:
                continue
        if removed and folder != keep:
            try:
                os.utime(folder, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            except OSError:
                pass


def driver_archive(
    extra_classpath: Sequence[str], java_options: str = "", root: Path | None = None
) -> DriverArchive | None:
    """What the next driver JVM of this process runs with: the installation's archive, or a training.

    Args:
        extra_classpath: jars besides Spark's own on the driver's class path.
        java_options: the driver's other JVM options (part of the key).
        root: the cache folder (default :func:`cache_dir`).

    Returns:
        ``None`` (no archive, no training) when no ``java`` is found, the cache folder cannot be
        written, or another process is training this installation's archive.
    """
    java = java_binary()
    if java is None:
        return None
    jvm_root = (root or cache_dir()) / "jvm"
    folder = jvm_root / archive_key(java, spark_jars_dir(), extra_classpath, java_options)
    if (folder / ARCHIVE).is_file():
        try:
            os.utime(folder)  # used: kept by the pruning of unused installations
        except OSError:
            pass
        return DriverArchive(folder, (f"-XX:SharedArchiveFile={folder / ARCHIVE}", QUIET), None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.debug("class data sharing off: %s: %s", folder, exc)
        return None
    if not take_lock(folder / LOCK):
        return None  # another process trains this installation's archive (or the folder is read-only)
    prune(jvm_root, folder)
    part = folder / f"driver-{os.getpid()}.jsa.part"
    return DriverArchive(folder, (f"-XX:ArchiveClassesAtExit={part}", QUIET), part)
