"""stream_app.class_data_sharing: which archive a driver maps, and how a training installs one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream_app import class_data_sharing as cds
from stream_app import executor_class_data_sharing as ecds


def _jvm_like(script: str) -> subprocess.Popen:
    """A process that behaves as the gateway JVM: it runs ``script`` once its stdin closes."""
    return subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdin.read(); {script}"], stdin=subprocess.PIPE)


def test_the_key_follows_the_installation(tmp_path: Path) -> None:
    java, jars = tmp_path / "java", tmp_path / "jars"
    jars.mkdir()
    java.write_bytes(b"jvm")
    (jars / "spark-core.jar").write_bytes(b"core")
    extra = tmp_path / "kafka.jar"
    extra.write_bytes(b"kafka")
    key = cds.archive_key(str(java), jars, [str(extra)], "")
    assert key == cds.archive_key(str(java), jars, [str(extra)], "")
    assert key != cds.archive_key(str(java), jars, [str(extra)], "-XX:+UseParallelGC")  # other JVM options
    assert key != cds.archive_key(str(java), jars, [], "")  # another class path
    (jars / "spark-core.jar").write_bytes(b"core, upgraded")
    assert key != cds.archive_key(str(java), jars, [str(extra)], "")  # a jar changed


def test_a_first_driver_trains_and_holds_the_lock_a_second_runs_without(tmp_path: Path) -> None:
    first = cds.driver_archive([], "", root=tmp_path)
    assert first is not None and first.part is not None
    assert first.java_options == (f"-XX:ArchiveClassesAtExit={first.part}", cds.QUIET)
    assert first.part.parent == first.folder and first.part.name.endswith(".jsa.part")
    assert first.lock.read_text() == str(os.getpid())
    assert cds.driver_archive([], "", root=tmp_path) is None  # one trainer at a time
    first.abandon()
    assert not first.lock.exists()


def test_a_lock_left_by_a_process_that_is_gone_is_taken_over(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    first = cds.driver_archive([], "", root=tmp_path)
    assert first is not None
    first.lock.write_text(gone.stdout.strip())  # its trainer died before finishing
    second = cds.driver_archive([], "", root=tmp_path)
    assert second is not None and second.part is not None
    second.abandon()


def test_finish_installs_the_archive_only_when_the_jvm_exits_cleanly(tmp_path: Path) -> None:
    training = cds.driver_archive([], "", root=tmp_path)
    assert training is not None and training.part is not None
    proc = _jvm_like(f"open({str(training.part)!r}, 'wb').write(b'archive')")
    assert training.finish(proc, timeout_s=30)
    assert training.archive.read_bytes() == b"archive"
    assert not training.part.exists() and not training.lock.exists()
    mapped = cds.driver_archive([], "", root=tmp_path)  # the next driver maps it
    assert mapped is not None and mapped.part is None
    assert mapped.java_options == (f"-XX:SharedArchiveFile={training.archive}", cds.QUIET)


def test_a_failed_or_hung_training_leaves_no_archive(tmp_path: Path) -> None:
    training = cds.driver_archive([], "", root=tmp_path)
    assert training is not None and training.part is not None
    failed = _jvm_like(f"open({str(training.part)!r}, 'wb').write(b'trunc'); sys.exit(1)")
    assert not training.finish(failed, timeout_s=30)
    assert not training.archive.exists() and not training.part.exists() and not training.lock.exists()

    again = cds.driver_archive([], "", root=tmp_path)
    assert again is not None and again.part is not None
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    started = time.monotonic()
    assert not again.finish(hung, timeout_s=1)
    assert time.monotonic() - started < 30 and hung.wait(10) != 0  # killed, not left running
    assert not again.archive.exists() and not again.lock.exists()


def test_an_unusable_cache_folder_turns_it_off(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert cds.driver_archive([], "", root=blocked) is None


def test_installations_unused_for_a_week_lose_their_archive(tmp_path: Path) -> None:
    root = tmp_path / "jvm"
    week = cds.UNUSED_DAYS * 86400
    for name, age in (("recent", 3600), ("unused", week + 3600)):
        (root / name).mkdir(parents=True)
        (root / name / cds.ARCHIVE).write_bytes(b"x")
        then = time.time() - age
        os.utime(root / name, (then, then))
    training = cds.driver_archive([], "", root=tmp_path)
    assert training is not None
    assert sorted(p.name for p in root.iterdir()) == sorted(["recent", training.folder.name])
    training.abandon()


def test_stale_training_files_go_from_every_installation_and_their_use_is_kept(tmp_path: Path) -> None:
    other = tmp_path / "jvm" / "other"  # another installation, used two days ago
    other.mkdir(parents=True)
    (other / cds.ARCHIVE).write_bytes(b"x")
    cut_off, writing = other / "driver-1.jsa.part", other / "executor-2.jsa.part"
    for part, age in ((cut_off, 2 * cds._STALE_S), (writing, 10)):
        part.write_bytes(b"part")
        os.utime(part, (time.time() - age, time.time() - age))
    used = time.time() - 2 * 86400
    os.utime(other, (used, used))
    training = cds.driver_archive([], "", root=tmp_path)
    assert training is not None
    assert not cut_off.exists() and writing.exists() and (other / cds.ARCHIVE).exists()
    assert abs(other.stat().st_mtime - used) < 1  # still "used two days ago": pruned on time
    training.abandon()


def test_mapping_an_archive_marks_its_installation_used(tmp_path: Path) -> None:
    training = cds.driver_archive([], "", root=tmp_path)
    assert training is not None and training.part is not None
    training.part.write_bytes(b"archive")
    assert training.finish(_jvm_like("pass"), timeout_s=30)
    then = time.time() - 30 * 86400
    os.utime(training.folder, (then, then))
    assert cds.driver_archive([], "", root=tmp_path) is not None
    assert time.time() - training.folder.stat().st_mtime < 3600


@pytest.mark.parametrize("variable", ["THREES_CACHE_DIR", "XDG_CACHE_HOME"])
def test_the_cache_folder_comes_from_the_environment(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THREES_CACHE_DIR", raising=False)
    monkeypatch.setenv(variable, "/somewhere")
    expected = Path("/somewhere") if variable == "THREES_CACHE_DIR" else Path("/somewhere/threes")
    assert cds.cache_dir() == expected


@pytest.fixture
def no_exit_dump(monkeypatch: pytest.MonkeyPatch) -> list:
    """Training registrations are collected here instead of dumping at the test process's exit."""
    registered: list = []
    monkeypatch.setattr(ecds.atexit, "register", registered.append)
    monkeypatch.setattr(ecds, "_training_here", set())
    return registered


def test_executors_record_once_per_process_and_map_the_archive_after(tmp_path: Path, no_exit_dump: list) -> None:
    first = ecds.executor_archive("-XX:+UseParallelGC", root=tmp_path)
    assert first is not None and first.training
    (option,) = first.java_options
    assert option.startswith("-XX:DumpLoadedClassList=") and "{{APP_ID}}-{{EXECUTOR_ID}}" in option
    assert (first.folder / ecds.EXECUTOR_LOCK).read_text() == str(os.getpid())
    again = ecds.executor_archive("-XX:+UseParallelGC", root=tmp_path)  # a second application of this process
    assert again is not None and again.training and again.folder == first.folder
    assert ecds.executor_archive("", root=tmp_path) is not None  # other JVM options: another installation
    (first.folder / ecds.EXECUTOR_ARCHIVE).write_bytes(b"archive")
    mapped = ecds.executor_archive("-XX:+UseParallelGC", root=tmp_path)
    assert mapped is not None and mapped.training  # maps the archive and goes on recording
    assert mapped.java_options == (f"-XX:SharedArchiveFile={first.folder / ecds.EXECUTOR_ARCHIVE}", cds.QUIET, option)
    assert len(no_exit_dump) == 2  # one dump at exit per installation recorded, not one per application


def test_while_another_process_records_the_executors_only_map_the_archive(tmp_path: Path, no_exit_dump: list) -> None:
    first = ecds.executor_archive("", root=tmp_path)
    assert first is not None
    ecds._training_here.clear()  # as if another process held the lock
    assert ecds.executor_archive("", root=tmp_path) is None  # no archive yet: nothing to add
    (first.folder / ecds.EXECUTOR_ARCHIVE).write_bytes(b"archive")
    mapped = ecds.executor_archive("", root=tmp_path)
    assert mapped is not None and not mapped.training
    assert mapped.java_options == (f"-XX:SharedArchiveFile={first.folder / ecds.EXECUTOR_ARCHIVE}", cds.QUIET)


def test_the_merged_class_list_drops_a_line_cut_by_a_killed_executor(tmp_path: Path) -> None:
    (tmp_path / "executor-app-1-0.classlist").write_text("# header\njava/lang/Object\norg/apache/spark/A\n")
    (tmp_path / "executor-app-1-1.classlist").write_text("java/lang/Object\norg/apache/spark/B\norg/apa")
    out = tmp_path / "merged"
    assert ecds._merged_classlist(tmp_path, out) == 3
    assert out.read_text() == "java/lang/Object\norg/apache/spark/A\norg/apache/spark/B\n"


def _fake_java(tmp_path: Path, status: int) -> str:
    """A ``java`` that writes the file named by ``-XX:SharedArchiveFile=`` and exits with ``status``."""
    java = tmp_path / f"java-{status}"
    java.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "out = [a.split('=', 1)[1] for a in sys.argv if a.startswith('-XX:SharedArchiveFile=')][0]\n"
        f"open(out, 'wb').write(b'dumped')\nsys.exit({status})\n"
    )
    java.chmod(0o755)
    return str(java)


def _classes(folder: Path, name: str, first: int, count: int) -> None:
    (folder / name).write_text("".join(f"org/example/C{i}\n" for i in range(first, first + count)))


def test_a_dump_installs_the_archive_and_redumps_only_for_new_classes(tmp_path: Path) -> None:
    folder = tmp_path / "key"
    folder.mkdir()
    java = _fake_java(tmp_path, 0)
    (folder / ecds.EXECUTOR_LOCK).write_text("1")
    _classes(folder, "executor-app-1-0.classlist", 0, 300)
    assert ecds.dump_executor_archive(folder, java=java, classpath="cp", quiet_s=0)
    assert (folder / ecds.EXECUTOR_ARCHIVE).read_bytes() == b"dumped"
    assert len((folder / ecds.EXECUTOR_CLASSES).read_text().splitlines()) == 300
    assert sorted(p.name for p in folder.iterdir()) == sorted([ecds.EXECUTOR_ARCHIVE, ecds.EXECUTOR_CLASSES])

    (folder / ecds.EXECUTOR_ARCHIVE).write_bytes(b"first")
    _classes(folder, "executor-app-2-0.classlist", 100, 250)  # 50 classes the archive lacks: too few
    assert not ecds.dump_executor_archive(folder, java=java, classpath="cp", quiet_s=0)
    assert (folder / ecds.EXECUTOR_ARCHIVE).read_bytes() == b"first"
    assert sorted(p.name for p in folder.iterdir()) == sorted([ecds.EXECUTOR_ARCHIVE, ecds.EXECUTOR_CLASSES])

    _classes(folder, "executor-app-3-1.classlist", 200, 400)  # 300 new ones: dumped with the old ones
    assert ecds.dump_executor_archive(folder, java=java, classpath="cp", quiet_s=0)
    assert (folder / ecds.EXECUTOR_ARCHIVE).read_bytes() == b"dumped"
    assert len((folder / ecds.EXECUTOR_CLASSES).read_text().splitlines()) == 600


def test_a_failed_dump_installs_nothing_and_stops_recording_for_a_day(tmp_path: Path, no_exit_dump: list) -> None:
    folder = tmp_path / "key"
    folder.mkdir()
    _classes(folder, "executor-app-1-0.classlist", 0, 300)
    assert not ecds.dump_executor_archive(folder, java=_fake_java(tmp_path, 1), classpath="cp", quiet_s=0)
    assert not (folder / ecds.EXECUTOR_ARCHIVE).exists()
    assert sorted(p.name for p in folder.iterdir()) == [ecds.EXECUTOR_FAILED]
    assert not ecds.dump_executor_archive(folder, java=_fake_java(tmp_path, 0), classpath="cp", quiet_s=0)  # no lists


def test_the_executors_class_path_is_the_one_a_worker_gives_them(tmp_path: Path) -> None:
    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / "slf4j-api-2.0.16.jar").write_bytes(b"")
    (jars / "spark-core_2.13-4.0.0.jar").write_bytes(b"")
    home = jars.parent.resolve()
    assert ecds.executor_classpath(jars) == f"{home}/conf:{home}/jars/slf4j-api-2.0.16.jar:{home}/jars/*"
