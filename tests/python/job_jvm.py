"""The driver JVM options of the tests' job processes: C1 only, and a class archive (Java's class
data sharing) that the jobs start from once it is written. ``conftest`` re-exports what the tests
use. Run as a script, this writes the archive and waits for it: ``bin/test`` does so beside the
Scala tests, and starts pytest once it is written, so that every Python test finds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pyspark
from windowed_count import write_inputs

SUBPROCESS_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""The driver JVM option of the tests' jobs (``test_kill.py``, ``test_task_failure.py``,
``test_delta.py``, ``test_soak.py``, and the driver and standalone daemons of
``test_executor_loss.py``), of the notebook test's W1, W5 and W4 bench workers and of the
notebooks' own Spark sessions: C1 compiles, C2 does not. On batches of a few dozen rows C2's
compiler threads cost more CPU than they save, and on two cores shared by two pytest workers that
CPU is the suite's time. Measured alone (stop 45): a start-and-kill of ``kill_job.py`` 20 s of
CPU against 14, an uninterrupted run 105 s against 77, the task-failure job 146 s against 108, the
checkpoint-size notebook 286 s against 239. What these tests check does not depend on the
compiler; the in-process tests, the executor-loss test's cluster executors and the Scala suites
run heapstate under C2."""


def job_submit_args(*java_options: str) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a test's job: its driver JVM gets
    :func:`subprocess_java_options` and then ``java_options``, as one quoted argument."""
    return _submit_args([*subprocess_java_options(), *java_options])


def bench_java_option_args() -> list[str]:
    """The ``--java-option`` arguments that give a ``bench/`` script's worker JVMs
    :func:`subprocess_java_options` (``soak.py``, ``w1.py``, ``w5.py``, ``w4.py``)."""
    return [f"--java-option={o}" for o in subprocess_java_options()]


def _submit_args(java_options: list[str]) -> str:
    """``PYSPARK_SUBMIT_ARGS`` that give the driver JVM ``java_options``, as one quoted argument."""
    java = " ".join(java_options)
    return f'--driver-java-options "{java}" pyspark-shell'


def subprocess_java_options() -> list[str]:
    """The driver JVM options of the tests' job and bench-worker processes:
    :data:`SUBPROCESS_JAVA_OPTIONS`, and the class archive once it is written
    (:func:`class_archive`)."""
    archive = class_archive()
    share = [f"-XX:SharedArchiveFile={archive}"] if archive else []
    return [SUBPROCESS_JAVA_OPTIONS, *share]


CLASS_ARCHIVE_DIR = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "heapstate-tests"
)
_archive_build: list[threading.Thread] = []


def class_archive() -> Path | None:
    """A CDS archive (Java's class data sharing) of the classes a heapstate job's driver JVM
    loads, or None until it is written. The jobs start from it: a driver JVM that maps its classes
    from the archive, rather than loading and verifying them from Spark's jars, reaches its first
    batch in about half the time (stop 58, alone on 2 cores: the session 5.2 s against 9.4, the
    first job 2.1 s against 4.3), and the suite starts such JVMs dozens of times.

    ``bin/test`` writes it (this module, run as a script) beside the Scala tests. Otherwise the
    first call in a test run without one starts writing it in the background, and of the pytest
    workers the one that takes the lock writes it; the others, and that one's calls until it is
    done, run without. To write it, ``kill_job.py`` runs a windowed count on 3 files with
    ``-XX:ArchiveClassesAtExit``, whose JVM writes the archive as it exits, about a minute later
    (alone on 2 cores). It is kept in :data:`CLASS_ARCHIVE_DIR` (:func:`class_archive_path`) for
    later runs (one per key: it deletes none). A pytest process whose thread is writing it waits
    for it at exit. A JVM whose class path or jars differ from the archive's loads those classes
    as usual: only speed depends on it. A truncated archive, though, crashes the JVM that maps
    it, so the archive is written under another name and renamed into place once the JVM that
    wrote it has exited."""

    path = class_archive_path()
    if path.is_file():
        return path
    if not _archive_build:
        thread = threading.Thread(target=_write_class_archive, args=(path,), name="class-archive")
        _archive_build.append(thread)
        thread.start()
    return None


def class_archive_path() -> Path:
    """Where :func:`class_archive` is kept: named by a hash of ``SPARK_HOME`` or else pyspark's
    folder (whose jars are the class path), pyspark's version and the ``java`` that pyspark
    starts. Not by ``sys.executable``, which can name one venv's Python in more than one way."""
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")
    java = java.resolve()
    stamp = java.stat().st_mtime_ns if java.exists() else 0
    spark_home = os.environ.get("SPARK_HOME") or Path(pyspark.__file__).resolve().parent
    key = f"{spark_home}|{pyspark.__version__}|{java}|{stamp}"
    return CLASS_ARCHIVE_DIR / f"driver-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def _write_class_archive(path: Path, wait: bool = False) -> None:
    """Writes :func:`class_archive`'s ``path``. Unless ``wait``, it returns at once when another
    process holds the lock (that one writes it). A failure is not raised, since the tests run as
    well without the archive: it is printed and kept in ``last-error.log`` beside the archive."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another worker writes it
            if path.is_file():
                return
            written = path.with_suffix(".jsa.part")
            written.unlink(missing_ok=True)  # an attempt that was killed may have left one
            with tempfile.TemporaryDirectory(prefix="heapstate-class-archive-") as work:
                write_inputs(Path(work, "input"), 3, seed=1)
                job = Path(__file__).with_name("kill_job.py")
                cmd = [sys.executable, str(job), "--input", f"{work}/input", "--exit-jvm"]
                cmd += ["--checkpoint", f"{work}/checkpoint", "--sink", f"{work}/sink"]
                cmd += ["--result", f"{work}/result.json"]
                env = {
                    **os.environ,
                    "PYSPARK_SUBMIT_ARGS": _submit_args(
                        [SUBPROCESS_JAVA_OPTIONS, f"-XX:ArchiveClassesAtExit={written}"]
                    ),
                }
                run = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, timeout=600, check=False
                )
            if run.returncode != 0 or not written.is_file():
                written.unlink(missing_ok=True)
                raise OSError(f"the job exited {run.returncode}: {run.stderr[-2000:]}")
            os.replace(written, path)
    except (OSError, subprocess.SubprocessError) as e:
        message = f"no class archive at {path}: {e}"
        print(message)
        with contextlib.suppress(OSError):
            (path.parent / "last-error.log").write_text(message + "\n")


if __name__ == "__main__":
    written = class_archive_path()
    if not written.is_file():
        _write_class_archive(written, wait=True)
    print(f"class archive: {written if written.is_file() else 'none'}")
    sys.exit(0 if written.is_file() else 1)
