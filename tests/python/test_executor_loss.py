"""Executor loss on a real Spark standalone cluster: the query recovers, and nothing is lost or
doubled.

The test starts a master and two workers (one core each) on loopback with pyspark's own
``bin/spark-class``, and runs ``executor_loss_job.py`` on them as the driver: a windowed count on
heapstate over 16 parquet files, one micro-batch each, into the exactly-once file sink, over 4
shuffle partitions. While it runs, the test SIGKILLs two executor JVMs:

- ``published``: an executor pauses inside a state commit, once its journal for the batch's
  version is in place but before the batch is committed (heapstate's fault injection,
  ``-Dheapstate.faultInjection.pause`` in ``spark.executor.extraJavaOptions``), and is killed
  there. Another executor must redo that version over the journal left behind.
- ``random``: the other original executor, which holds state stores loaded in memory, is killed
  at a random moment a few batches later.

Spark retries the lost tasks (and the map stages whose shuffle output died with the executor) on
the surviving and the replacement executors, which load the state from the checkpoint. The query
must end by itself, commit every batch, and its sink rows and final state
(``spark.read.format("statestore")``) must equal what an uninterrupted run leaves: the counts of
a batch query over the same input, split at the final watermark (``windowed_count.expected``).
Until stop 61 an uninterrupted streaming run in local mode gave them, and the batch query's
equalled them. The kills are proven by the process ids vanishing, by the journal of an
uncommitted batch existing at the first kill, and by Spark's REST API listing both executors as
removed and at least one failed task.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyspark
import pytest
from conftest import (
    HEAPSTATE_PROVIDER,
    assert_checkpoint_written_by,
    committed_batches,
    job_submit_args,
    subprocess_java_options,
)
from windowed_count import write_inputs

JOB = Path(__file__).with_name("executor_loss_job.py")
SPARK_HOME = Path(pyspark.__file__).resolve().parent
FILES = 16
PAUSE_AT_COMMIT = 5
"""An executor pauses at its 5th state commit: in the third batch or so, with state loaded."""
PAUSE_MS = 8_000
"""Time the test has to see the pause and kill; every executor that reaches its 5th commit
and is not killed there waits this long too."""
WAIT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------
# The cluster


def spark_env() -> dict[str, str]:
    """The environment of every process of the test: loopback only, and no Spark conf but the
    test's own (``SPARK_CONF_DIR`` unset: pyspark's ``conf`` folder, which a pip install does
    not have).

    The drivers and the daemons (master and workers) compile with C1 only and start from the
    tests' class archive once it is written (``job_jvm.subprocess_java_options``), whose class
    path starts with that same ``conf`` folder: another folder there would leave the archive
    unused. The cluster's executors, where the killed run's stores live, keep the JVM's default
    compilers.
    """
    env = dict(os.environ)
    env.pop("SPARK_CONF_DIR", None)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="384m",
        SPARK_DAEMON_JAVA_OPTS=" ".join(subprocess_java_options()),
        PYSPARK_SUBMIT_ARGS=job_submit_args(),
        PYSPARK_PYTHON=sys.executable,
    )
    return env


@dataclass
class Cluster:
    """A standalone master and two workers; each worker's executors run under its work dir."""

    root: Path
    master_url: str
    master_ui: str
    work_dirs: list[Path]
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def status(self) -> dict[str, Any] | None:
        """The master's state, or None while its web UI is still starting.

        Spark starts the UI's port before it adds the pages, one by one, the master's page
        at ``/`` before ``/json``. In between, ``/json/`` answers 200 with the master's HTML
        page, so only a JSON reply counts.
        """
        with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=5) as response:
            if "json" not in response.headers.get("Content-Type", ""):
                return None
            return json.load(response)

    def executor_dirs(self, app_id: str) -> list[Path]:
        return sorted(p for w in self.work_dirs for p in (w / app_id).glob("*") if p.is_dir())

    def logs(self) -> str:
        """The tail of each daemon's log, for failure messages."""
        out = []
        for log in sorted(self.root.glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:]))
        return "\n".join(out)


def start_daemon(cluster: Cluster, name: str, args: list[str]) -> None:
    log = (cluster.root / f"{name}.log").open("wb")
    cmd = [str(SPARK_HOME / "bin" / "spark-class"), *args]
    cluster.daemons.append(
        subprocess.Popen(
            cmd,
            env=spark_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, with the executors it launches
        )
    )


def executor_pids(root: Path) -> dict[int, Path]:
    """The executor JVMs running in a work dir under ``root``: pid -> executor dir.

    Matching the working directory (the worker starts each executor in ``<work
    dir>/<app id>/<executor id>``) keeps the test off executors that are not its own. A
    process an executor forks (Hadoop runs commands so) carries the executor's command
    line and directory until it execs; one whose parent is a matched process is that
    child, not an executor.
    """
    found: dict[int, tuple[Path, int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            cwd = Path(os.readlink(proc / "cwd"))
            # /proc/<pid>/stat: "pid (comm) state ppid ...", comm in parentheses.
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"CoarseGrainedExecutorBackend" in cmdline and cwd.is_relative_to(root):
            found[int(proc.name)] = (cwd, ppid)
    return {pid: cwd for pid, (cwd, ppid) in found.items() if ppid not in found}


def stop_cluster(cluster: Cluster) -> None:
    """Kills the daemons' process groups (their executors included), then any executor left."""
    for proc in cluster.daemons:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for pid in executor_pids(cluster.root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    root = tmp_path / "cluster"
    root.mkdir()
    port, ui = free_port(), free_port()
    c = Cluster(
        root,
        f"spark://127.0.0.1:{port}",
        f"http://127.0.0.1:{ui}",
        [root / "worker-1", root / "worker-2"],
    )
    try:
        start_daemon(c, "master", [
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui),
        ])  # fmt: skip
        for i, work in enumerate(c.work_dirs, start=1):
            work.mkdir()
            start_daemon(c, f"worker-{i}", [
                "org.apache.spark.deploy.worker.Worker", c.master_url,
                "--host", "127.0.0.1", "--webui-port", str(free_port()),
                "--cores", "1", "--memory", "1g", "--work-dir", str(work),
            ])  # fmt: skip
        deadline = time.monotonic() + 90
        alive = 0
        while alive < 2:
            assert time.monotonic() < deadline, "the cluster did not come up:\n" + c.logs()
            for d in c.daemons:
                assert d.poll() is None, f"a daemon exited with {d.returncode}:\n" + c.logs()
            time.sleep(0.5)
            try:
                status = c.status()
            except OSError:
                continue
            if status is None:
                continue
            alive = sum(1 for w in status["workers"] if w["state"] == "ALIVE")
        yield c
    finally:
        stop_cluster(c)


# --------------------------------------------------------------------------------------------
# The driver


@dataclass
class Driver:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None]
    tail: list[str] = field(default_factory=list)

    def wait_for(self, prefix: str, timeout: float = WAIT_S) -> str:
        """The next stderr line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            assert line is not None, f"the driver ended before {prefix!r}:\n" + self.stderr()
            self.tail.append(line)
            del self.tail[:-40]
            if line.startswith(prefix):
                return line
        raise TimeoutError(f"no {prefix!r} within {timeout} s:\n" + self.stderr())

    def drain(self) -> None:
        """Reads the lines that have arrived so far without waiting."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if line is None:
                return
            self.tail.append(line)
            del self.tail[:-40]

    def stderr(self) -> str:
        return "\n".join(self.tail)


def start_driver(work: Path, name: str, master: str, java_options: str = "") -> Driver:
    cmd = [sys.executable, str(JOB), "--master", master, "--input", str(work / "input")]
    cmd += ["--checkpoint", str(work / name / "checkpoint"), "--sink", str(work / name / "sink")]
    cmd += ["--result", str(work / f"{name}.json"), "--ui-port", str(free_port())]
    cmd += [f"--executor-java-options={java_options}"]  # "=": the value starts with "-"
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1,
        env=spark_env(), start_new_session=True,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return Driver(proc, lines)


def finish(driver: Driver, work: Path, name: str) -> dict[str, object]:
    deadline = time.monotonic() + WAIT_S
    while driver.proc.poll() is None and time.monotonic() < deadline:
        driver.drain()
        time.sleep(0.2)
    driver.drain()
    assert driver.proc.poll() == 0, (
        f"the {name} driver did not end cleanly (exit {driver.proc.returncode}):\n"
        + driver.stderr()
    )
    return json.loads((work / f"{name}.json").read_text())


def stop_driver(driver: Driver) -> None:
    if driver.proc.poll() is None:
        os.killpg(driver.proc.pid, signal.SIGKILL)
    driver.proc.wait()


def kill(pid: int) -> None:
    """SIGKILLs ``pid`` and waits until its worker has reaped it."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"executor {pid} is still there 30 s after SIGKILL"
        time.sleep(0.1)


def pause_marker(dirs: list[Path]) -> tuple[Path, str] | None:
    """The executor dir whose stderr shows heapstate's pause, and the journal it names."""
    for d in dirs:
        stderr = d / "stderr"
        if stderr.exists():
            for line in stderr.read_text(errors="replace").splitlines():
                if line.startswith("HEAPSTATE-PAUSE published "):
                    return d, line.split(" ", 2)[2]
    return None


# --------------------------------------------------------------------------------------------
# The test


def test_executor_loss_on_standalone_cluster(cluster: Cluster, tmp_path: Path) -> None:
    rng = random.Random(20261121)
    write_inputs(tmp_path / "input", FILES, seed=11)
    pause = f"-Dheapstate.faultInjection.pause=published:{PAUSE_AT_COMMIT}:{PAUSE_MS}"
    driver = start_driver(tmp_path, "killed", cluster.master_url, pause)
    checkpoint = tmp_path / "killed" / "checkpoint"
    try:
        app_id = driver.wait_for("EXECLOSS-STARTED").split()[1]

        # Kill 1: the first executor to pause inside a commit, its journal already published.
        deadline = time.monotonic() + WAIT_S
        while (marker := pause_marker(cluster.executor_dirs(app_id))) is None:
            assert time.monotonic() < deadline, (
                f"no executor paused in a commit:\n{driver.stderr()}\n{cluster.logs()}"
            )
            driver.drain()
            time.sleep(0.1)
        paused_dir, journal_uri = marker
        pids = executor_pids(cluster.root)
        assert len(pids) == 2, f"expected the 2 original executors, found {pids}"
        (first_pid,) = [p for p, d in pids.items() if d == paused_dir]
        journal = Path(journal_uri.removeprefix("file:"))
        version = int(journal.name.split(".")[0])
        # The journal of the batch is in place, and the batch is not committed: mid-batch.
        assert journal.is_file(), f"{journal} is not there while its commit pauses"
        assert version - 1 not in committed_batches(checkpoint)
        kill(first_pid)

        # Kill 2: the other original executor, at a random moment a few batches later.
        (second_pid,) = [p for p in pids if p != first_pid]
        driver.wait_for(f"EXECLOSS-BATCH {version + 2}")
        time.sleep(rng.uniform(0.1, 1.0))
        assert Path(f"/proc/{second_pid}").exists(), "the second executor died by itself"
        kill(second_pid)
        killed = {paused_dir.name, pids[second_pid].name}  # executor ids

        recovered = finish(driver, tmp_path, "killed")
    finally:
        stop_driver(driver)

    # Spark saw both executors go, and failed tasks over them.
    executors = {e["id"]: e for e in recovered["executors"]}  # type: ignore[attr-defined]
    assert killed <= set(executors), f"killed {killed}, Spark knows {executors}"
    for e in killed:
        assert executors[e]["isActive"] is False, executors[e]
        assert "137" in str(executors[e]["removeReason"]), executors[e]
    assert len([e for e in executors.values() if e["isActive"]]) >= 1
    assert recovered["failed_tasks"] >= 1, recovered["failed_tasks"]

    # Recovered on heapstate, through every batch (one a file, then the one without data that
    # moves the watermark past the last file), to exactly the uninterrupted results.
    expected = cast(dict[str, list[str]], recovered["expected"])
    assert recovered["provider"] == HEAPSTATE_PROVIDER
    assert_checkpoint_written_by(checkpoint, HEAPSTATE_PROVIDER)
    assert committed_batches(checkpoint) == list(range(FILES + 1))
    assert expected["sink"] and expected["state"]
    assert recovered["sink"] == expected["sink"]
    assert recovered["state"] == expected["state"]
