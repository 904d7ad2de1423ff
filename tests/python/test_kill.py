"""SIGKILL at 20 points of a heapstate query, then restart: nothing is lost or doubled.

``kill_job.py`` runs a windowed count on heapstate into the exactly-once file sink, in its own
process, over 50 input files (one micro-batch each). This test kills it with SIGKILL 20 times,
five at each of four kinds of point, restarting it from its checkpoint after each kill:

- ``mid-batch``: at a random moment 0.2 to 2.5 s after the query started;
- ``journal``: while a commit's journal is written, before it is renamed into place;
- ``published``: after the journal is in place, before the live state changes and before Spark
  records the batch as committed;
- ``snapshot``: while maintenance writes a snapshot, before it is renamed into place.

The last three are hit exactly through heapstate's fault injection (``FaultInjection.scala``):
the JVM pauses at the n-th time it reaches the point (n drawn at random, so the query makes
progress between kills) and prints a marker, and the test kills it during the pause. Then a last
run without faults finishes the input, and its sink rows and final state (read with
``spark.read.format("statestore")``) must equal what an uninterrupted run leaves: the counts of a
batch query over the same input, split at the final watermark (``windowed_count.expected``).
Until stop 61 an uninterrupted streaming run of its own gave them (a JVM start and every file
again), and the batch query's equal them.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

from conftest import job_submit_args
from windowed_count import write_inputs

JOB = Path(__file__).with_name("kill_job.py")
FILES = 50
"""The 20 kills used up 16 of these on stop 58's slow machine: a restart commits a batch or two
before the next kill. The kills at a journal, a commit or a snapshot wait for a given one of
them, but the mid-batch kills are timed, and use more batches on a faster machine; 50 leaves room
for that (the test fails loudly if the input runs out first). The rest of the files are the
test's longest part after the JVM starts: 100 files cost about 85 s more than 40, alone on two
cores (measured when an uninterrupted run read them all too), and tested nothing more."""
POINTS = ("mid-batch", "journal", "published", "snapshot")
KILLS_PER_POINT = 5
WAIT_S = 180


def start(work: Path, name: str, pause: str | None, result: Path | None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    pause_option = [f"-Dheapstate.faultInjection.pause={pause}"] if pause else []
    env["PYSPARK_SUBMIT_ARGS"] = job_submit_args(*pause_option)
    cmd = [sys.executable, str(JOB), "--input", str(work / "input")]
    cmd += ["--checkpoint", str(work / name / "checkpoint"), "--sink", str(work / name / "sink")]
    if result:
        cmd += ["--result", str(result)]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, bufsize=1
    )


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The process's stderr lines, read on a thread; ``None`` marks its end."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def wait_for(q: queue.Queue[str | None], marker: str, tail: list[str]) -> str | None:
    """The first line starting with ``marker``, or None if the process ended first."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            return None
        tail.append(line)
        del tail[:-30]
        if line.startswith(marker):
            return line
    raise TimeoutError(f"no {marker!r} within {WAIT_S} s; stderr ends with:\n" + "\n".join(tail))


def run_to_end(work: Path, name: str) -> dict[str, object]:
    result = work / f"{name}.json"
    proc = start(work, name, None, result)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(result.read_text())


def test_twenty_kills_lose_nothing(tmp_path: Path) -> None:
    rng = random.Random(20261121)
    write_inputs(tmp_path / "input", FILES, seed=7)
    kills: list[dict[str, object]] = []
    plan = [p for _ in range(KILLS_PER_POINT) for p in POINTS]
    for point in plan:
        nth = {"journal": rng.randint(1, 6), "published": rng.randint(1, 6)}.get(point)
        nth = rng.randint(1, 2) if point == "snapshot" else nth
        pause = f"{point}:{nth}:20000" if nth else None
        proc = start(tmp_path, "killed", pause, None)
        q, tail = lines_of(proc), []
        try:
            marker = wait_for(q, "KILLJOB-STARTED", tail)
            if marker and point != "mid-batch":
                marker = wait_for(q, "HEAPSTATE-PAUSE", tail)
            if marker:
                time.sleep(rng.uniform(0.2, 2.5) if point == "mid-batch" else rng.uniform(0, 0.2))
        finally:
            alive = proc.poll() is None
            if alive:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert alive and marker, (
            f"kill {len(kills) + 1} ({point}): the job ended before it could be killed "
            f"(exit {proc.returncode}); the input ran out too early or it failed:\n"
            + "\n".join(tail)
        )
        assert proc.returncode == -signal.SIGKILL
        kills.append({"point": point, "marker": marker})
    assert len(kills) == len(POINTS) * KILLS_PER_POINT == 20
    for point in POINTS[1:]:
        hit = [k for k in kills if k["point"] == point]
        assert len(hit) == KILLS_PER_POINT
        assert all(str(k["marker"]).startswith(f"HEAPSTATE-PAUSE {point} ") for k in hit)

    recovered = run_to_end(tmp_path, "killed")
    expected = cast(dict[str, list[str]], recovered["expected"])
    assert recovered["provider"] == "heapstate.HeapStateStoreProvider"
    assert expected["sink"] and expected["state"]
    assert recovered["sink"] == expected["sink"]
    assert recovered["state"] == expected["state"]
