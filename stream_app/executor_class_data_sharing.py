"""Class data sharing for the executors' JVMs of a standalone cluster on this host.

Only on a standalone master at a loopback address, whose workers run on this host and read this cache folder
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

The driver's archive, and the cache folder and keys both use, are
:mod:`stream_app.class_data_sharing`.
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stream_app.class_data_sharing import QUIET, archive_key, cache_dir, java_binary, prune, spark_jars_dir, take_lock

log = logging.getLogger(__name__)

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
    jars = (jars_dir or spark_jars_dir()).resolve()
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
                    "stream_app.executor_class_data_sharing",
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
    java = java_binary()
    if java is None:
        return None
    jvm_root = (root or cache_dir()) / "jvm"
    folder = jvm_root / archive_key(java, spark_jars_dir(), [], f"executor {executor_options}")
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
        if not take_lock(folder / EXECUTOR_LOCK):
            return mapped_only  # another process records
        _training_here.add(folder)
        prune(jvm_root, folder)
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
        java = java or java_binary()
        has_archive = (folder / EXECUTOR_ARCHIVE).is_file()
        previous = dumped.read_text().splitlines() if has_archive and dumped.is_file() else []
        total = _merged_classlist(folder, merged, previous)
        if java is None or total - len(previous) < max(MIN_NEW_CLASSES, len(previous) // 50):
            return False  # nothing (new enough) recorded: the archive stays as it is
        attempted = True
        installed = _dump(folder, java, merged, part, classpath or executor_classpath(), java_options, timeout_s)
    except Exception as exc:  # a failed dump only costs the executors' speed-up
        log.debug("class data sharing: executors' dump failed: %s", exc)
    finally:
        _clean_up(folder, attempted and not installed, [merged, part], lock)
    return installed


def _dump(
    folder: Path, java: str, merged: Path, part: Path, classpath: str, java_options: Sequence[str], timeout_s: float
) -> bool:
    """Run ``java -Xshare:dump`` of the ``merged`` class list; install the archive and the list if it exits with 0.

    Raises:
        subprocess.TimeoutExpired: the dump took longer than ``timeout_s``.
        OSError: ``java`` could not run, or the files could not be moved.
    """
    command = [
        java,
        "-Xshare:dump",
        f"-XX:SharedClassListFile={merged}",
        f"-XX:SharedArchiveFile={part}",
        "-cp",
        classpath,
        *_EXECUTOR_MODULE_OPTIONS,
        *java_options,
        QUIET,
    ]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s)
    if done.returncode == 0 and part.is_file():
        os.replace(part, folder / EXECUTOR_ARCHIVE)  # atomic: an executor maps no file or a complete one
        os.replace(merged, folder / EXECUTOR_CLASSES)
        return True
    log.debug("class data sharing: executors' dump failed: %s", done.stderr[-2000:])
    return False


def _clean_up(folder: Path, failed: bool, files: Sequence[Path], lock: Path) -> None:
    """After a dump: mark a failed one, remove its files and the recorded lists, release the lock."""
    try:
        if failed:
            (folder / EXECUTOR_FAILED).write_text(str(time.time()))
        for path in [*files, *folder.glob(_CLASSLIST_GLOB)]:
            path.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
    except OSError:  # the folder was removed meanwhile
        pass


def _main(argv: Sequence[str]) -> int:
    """``python -m stream_app.executor_class_data_sharing dump-executor <folder> [jvm options...]``."""
    if len(argv) < 2 or argv[0] != "dump-executor":
        print("usage: python -m stream_app.executor_class_data_sharing dump-executor <folder> [jvm options...]")
        return 2
    return 0 if dump_executor_archive(Path(argv[1]), java_options=argv[2:]) else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
