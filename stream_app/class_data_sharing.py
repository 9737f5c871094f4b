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

**Executors** (:func:`executor_archive`), only on a standalone master at a
loopback address, whose workers run on this host and read this cache folder
(executors on other hosts would not find the file): a JDK *static* archive
(JEP 310), as an executor JVM is stopped by its worker with a signal and may be
killed before a dynamic archive is complete. The first application of an
installation runs its executors with ``-XX:DumpLoadedClassList`` (one text file
per application and executor: a killed executor leaves a usable list); at that
process's exit a background process waits until the lists stop changing, merges
them and runs ``java -Xshare:dump`` with the executors' class path into a
``.part`` file, renamed to ``executor.jsa`` when ``java`` exits with status 0
(one core, in the background). Later applications' executors map it, and go on recording
(one process at a time): a list with classes the archive lacks (a first
application that only wrote topics; a later one that reads them and joins) is
dumped again with them, so the archive converges on what the applications load:
executors register sooner, and bootstraps and restarts are faster
(``snapshot_scale/executor_class_data_sharing`` in benchmarks/RESULTS.md). A failed
dump is not retried for a day.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
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


def _java_binary() -> str | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def _spark_jars_dir() -> Path:
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
    except Exception as exc:  # noqa: BLE001 - a timeout or a closed pipe: no archive this time
        log.debug("class data sharing: training JVM did not exit: %s", exc)
        try:
            proc.kill()
        except Exception:  # noqa: BLE001
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


def _take_lock(lock: Path) -> bool:
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


def _prune(root: Path, keep: Path) -> None:
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
    java = _java_binary()
    if java is None:
        return None
    jvm_root = (root or cache_dir()) / "jvm"
    folder = jvm_root / archive_key(java, _spark_jars_dir(), extra_classpath, java_options)
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
    if not _take_lock(folder / LOCK):
        return None  # another process trains this installation's archive (or the folder is read-only)
    _prune(jvm_root, folder)
    part = folder / f"driver-{os.getpid()}.jsa.part"
    return DriverArchive(folder, (f"-XX:ArchiveClassesAtExit={part}", QUIET), part)


# -- the executors' archive (a standalone cluster on this host) -------------------------------------

EXECUTOR_ARCHIVE = "executor.jsa"
EXECUTOR_LOCK = "executor-training.lock"
EXECUTOR_FAILED = "executor-dump.failed"
EXECUTOR_CLASSES = "executor.classes"
MIN_NEW_CLASSES = 200
"""A dump needs at least this many classes (or 2%) that the current archive lacks."""
_CLASSLIST_GLOB = "executor-*.classlist"
_RETRY_FAILED_S = 86400.0
# what Spark 4 adds to every executor's command; the archive is dumped with the same module options
_EXECUTOR_MODULE_OPTIONS = ("-XX:+IgnoreUnrecognizedVMOptions", "--add-modules=jdk.incubator.vector")
# a training process of this interpreter: the folder it trains (several sessions of one process train together)
_training_here: set[Path] = set()


def executor_classpath(jars_dir: Path | None = None) -> str:
    """The class path a standalone worker gives the executors it launches from this Spark installation.

    ``<SPARK_HOME>/conf:<jars>/slf4j-api-*.jar:<jars>/*`` (Spark 4's launcher). An executor whose
    class path does not start with it (``spark.executor.extraClassPath`` set, another installation)
    runs without the archive: the JVM checks, and ignores an archive that does not fit.
    """
    jars = (jars_dir or _spark_jars_dir()).resolve()
    slf4j = sorted(jars.glob("slf4j-api-*.jar"))
    return ":".join([str(jars.parent / "conf"), *(str(p) for p in slf4j[:1]), str(jars / "*")])


@dataclass(frozen=True)
class ExecutorArchive:
    """The executors' archive of one installation, and what the executors' JVMs run with.

    Attributes:
        folder: ``<cache>/jvm/<key>`` (the key covers ``java``, Spark's jars and the executors'
            JVM options).
        java_options: options to add to ``spark.executor.extraJavaOptions``: map the archive (when
            one exists), and record the classes the executors load (``-XX:DumpLoadedClassList``,
            one file per application and executor) when this process records.
        training: whether this process records (one process at a time); at its exit a background
            process dumps the lists into a new archive if they hold classes the archive lacks
            (:func:`dump_executor_archive`, one core in the background).
    """

    folder: Path
    java_options: tuple[str, ...]
    training: bool
    executor_options: str = ""

    def finish(self) -> None:
        """Start the background dump of the recorded class lists (a training process's exit; once)."""
        if not self.training or self.folder not in _training_here:
            return
        _training_here.discard(self.folder)
        lock = self.folder / EXECUTOR_LOCK
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stream_app.class_data_sharing",
                    "dump-executor",
                    str(self.folder),
                    *shlex.split(self.executor_options),
                ],
                cwd=str(Path(__file__).resolve().parents[1]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives this process; its own session: no signal of ours reaches it
            )
            lock.write_text(str(proc.pid))  # the dumper holds the training now
        except OSError as exc:
            log.debug("class data sharing: executors' dump not started: %s", exc)
            lock.unlink(missing_ok=True)


def executor_archive(executor_options: str, root: Path | None = None) -> ExecutorArchive | None:
    """What the executors of a new application on a standalone cluster *of this host* run with.

    Only for a master on a loopback address: its workers run here and see this cache folder (an
    executor on another host would not find the archive; there, bake an archive into the image).

    Args:
        executor_options: the executors' other JVM options (part of the key, and of the dump).
        root: the cache folder (default :func:`cache_dir`).

    Returns:
        The archive to map and, for one process at a time, the recording; without recording (another
        process records, the cache folder cannot be written, or a dump failed within the last day)
        only the archive, or ``None`` when there is none yet (or no ``java`` is found).
    """
    java = _java_binary()
    if java is None:
        return None
    jvm_root = (root or cache_dir()) / "jvm"
    folder = jvm_root / archive_key(java, _spark_jars_dir(), [], f"executor {executor_options}")
    archive = folder / EXECUTOR_ARCHIVE
    mapped: tuple[str, ...] = ()
    if archive.is_file():
        mapped = (f"-XX:SharedArchiveFile={archive}", QUIET)
        try:
            os.utime(folder)  # used: kept by the pruning of unused installations
        except OSError:
            pass
    mapped_only = ExecutorArchive(folder, mapped, False) if mapped else None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        failed_at = (folder / EXECUTOR_FAILED).stat().st_mtime
    except FileNotFoundError:
        failed_at = 0.0
    except OSError as exc:
        log.debug("class data sharing: executors do not record: %s: %s", folder, exc)
        return mapped_only
    if time.time() - failed_at < _RETRY_FAILED_S:
        return mapped_only
    classlist = folder / "executor-{{APP_ID}}-{{EXECUTOR_ID}}.classlist"  # Spark fills the placeholders
    recording = ExecutorArchive(folder, (*mapped, f"-XX:DumpLoadedClassList={classlist}"), True, executor_options)
    if folder not in _training_here:  # this process's first application here: take the recording
        if not _take_lock(folder / EXECUTOR_LOCK):
            return mapped_only  # another process records
        _training_here.add(folder)
        _prune(jvm_root, folder)
        atexit.register(recording.finish)
    return recording


def _merged_classlist(folder: Path, out: Path, previous: Sequence[str] = ()) -> int:
    """Merge ``previous`` and the recorded class lists into ``out``; returns the lines written.

    A line cut by a killed executor (no newline at the end of its file) is dropped.
    """
    seen: dict[str, None] = dict.fromkeys(previous)
    for path in sorted(folder.glob(_CLASSLIST_GLOB)):
        text = path.read_text(errors="replace")
        lines = text.split("\n")
        complete = lines if text.endswith("\n") else lines[:-1]
        seen.update(dict.fromkeys(ln for ln in complete if ln and not ln.startswith("#")))
    out.write_text("".join(f"{ln}\n" for ln in seen))
    return len(seen)


def _wait_quiet(folder: Path, quiet_s: float, timeout_s: float) -> None:
    """Wait until no class list changed for ``quiet_s`` (the executors exited), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stamps = [p.stat().st_mtime for p in folder.glob(_CLASSLIST_GLOB)]
        if not stamps or time.time() - max(stamps) >= quiet_s:
            return
        time.sleep(1.0)


def dump_executor_archive(
    folder: Path,
    java: str | None = None,
    classpath: str | None = None,
    java_options: Sequence[str] = (),
    quiet_s: float = 5.0,
    timeout_s: float = 600.0,
) -> bool:
    """Dump the executors' classes into ``executor.jsa`` when their lists hold classes it lacks.

    The classes of the current archive (``executor.classes``) and the recorded lists are merged;
    when the merge adds at least ``max(MIN_NEW_CLASSES, 2%)`` classes (or no archive exists yet),
    ``java -Xshare:dump`` runs with the executors' class path (:func:`executor_classpath`) into a
    ``.part`` file, renamed into place only when ``java`` exits with status 0, and the merge
    becomes ``executor.classes``. So an installation's archive grows to what its applications load
    (a first application that only wrote topics, later ones that read them and join), and stops
    being dumped when nothing new is loaded. The recorded lists are removed either way; a failed
    dump leaves ``executor-dump.failed`` (no recording for a day).

    Args:
        folder: the installation's folder (:attr:`ExecutorArchive.folder`).
        java: the ``java`` binary (default: the one Spark's launcher runs).
        classpath: the executors' class path (default :func:`executor_classpath`).
        java_options: JVM options of the dump besides the module options Spark gives executors.
        quiet_s: the class lists must be unchanged this long (their executors exited).
        timeout_s: at most this long for the dump.

    Returns:
        Whether a new archive was installed (never raises).
    """
    lock = folder / EXECUTOR_LOCK
    merged = folder / f"executor-{os.getpid()}.classes"
    part = folder / f"executor-{os.getpid()}.jsa.part"
    dumped = folder / EXECUTOR_CLASSES
    installed, attempted = False, False
    try:
        _wait_quiet(folder, quiet_s, 120.0)
        java = java or _java_binary()
        has_archive = (folder / EXECUTOR_ARCHIVE).is_file()
        previous = dumped.read_text().splitlines() if has_archive and dumped.is_file() else []
        total = _merged_classlist(folder, merged, previous)
        if java is None or total - len(previous) < max(MIN_NEW_CLASSES, len(previous) // 50):
            return False  # nothing (new enough) recorded: the archive stays as it is
        attempted = True
        command = [
            java,
            "-Xshare:dump",
            f"-XX:SharedClassListFile={merged}",
            f"-XX:SharedArchiveFile={part}",
            "-cp",
            classpath or executor_classpath(),
            *_EXECUTOR_MODULE_OPTIONS,
            *java_options,
            QUIET,
        ]
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s)
        if done.returncode == 0 and part.is_file():
            os.replace(part, folder / EXECUTOR_ARCHIVE)  # atomic: an executor maps no file or a complete one
            os.replace(merged, dumped)
            installed = True
        else:
            log.debug("class data sharing: executors' dump failed: %s", done.stderr[-2000:])
    except Exception as exc:  # noqa: BLE001 - a failed dump only costs the executors' speed-up
        log.debug("class data sharing: executors' dump failed: %s", exc)
    finally:
        try:
            if attempted and not installed:
                (folder / EXECUTOR_FAILED).write_text(str(time.time()))
            for path in [merged, part, *folder.glob(_CLASSLIST_GLOB)]:
                path.unlink(missing_ok=True)
            lock.unlink(missing_ok=True)
        except OSError:  # the folder was removed meanwhile
            pass
    return installed


def _main(argv: Sequence[str]) -> int:
    """``python -m stream_app.class_data_sharing dump-executor <folder> [jvm options...]``."""
    if len(argv) < 2 or argv[0] != "dump-executor":
        print("usage: python -m stream_app.class_data_sharing dump-executor <folder> [jvm options...]")
        return 2
    return 0 if dump_executor_archive(Path(argv[1]), java_options=argv[2:]) else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
