"""`make jvm`: the Java lookup component of stream.mode realtime is built by the project's own files.

The build runs Maven offline against the local stack's repository (``.threes/m2``, filled by an
earlier build), on a copy of ``stream_app/jvm`` and the Makefile: the repository is never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
M2 = ROOT / ".threes" / "m2"

pytestmark = pytest.mark.skipif(
    shutil.which("mvn") is None or not (M2 / "org" / "apache" / "avro").is_dir(),
    reason="needs Maven and a repository filled by `make jvm` (.threes/m2)",
)


def _copy(tmp_path: Path) -> Path:
    shutil.copy2(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copytree(ROOT / "stream_app" / "jvm", tmp_path / "stream_app" / "jvm",
                    ignore=shutil.ignore_patterns("target"))
    return tmp_path


def _make(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "jvm", f"M2={M2}", "MVN_FLAGS=-o", f"JVM_LOG={cwd / 'maven.log'}"],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )


def test_make_builds_the_lookup_jar_with_its_classes_and_runs_the_java_tests(tmp_path):
    done = _make(_copy(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    with zipfile.ZipFile(tmp_path / "stream_app" / "jars" / "threes-lookup.jar") as jar:
        names = set(jar.namelist())
    assert {"threes/lookup/LookupUdf.class", "threes/store/SnapshotStore.class", "threes/store/RocksState.class",
            "threes/store/QueryServer.class"} <= names
    assert not any(n.startswith(("org/apache/", "org/rocksdb/", "scala/")) for n in names)  # provided
    assert "Tests run: 16, Failures: 0, Errors: 0" in (tmp_path / "maven.log").read_text()


def test_a_broken_java_build_fails_make_with_a_clear_message(tmp_path):
    cwd = _copy(tmp_path)
    source = cwd / "stream_app" / "jvm" / "src" / "main" / "java" / "threes" / "store" / "SnapshotTable.java"
    source.write_text(source.read_text().replace("public byte[] get(byte[] key) {", "public byte[] get(byte[] key) {\n    undefinedCall();"))
    done = _make(cwd)
    assert done.returncode != 0
    assert "make jvm: FAILED to build the Java lookup component" in done.stderr
    assert "SnapshotTable.java" in done.stderr and "undefinedCall" in done.stderr  # the compiler's own line
    assert not (cwd / "stream_app" / "jars" / "threes-lookup.jar").exists()
