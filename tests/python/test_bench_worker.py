"""``bench/_common.run_worker``: a worker's output reaches its log, a failure names the log, and a
JVM that outlives its worker (as a RocksDB restart worker's did in stop 44, hung in its shutdown
while holding the worker's stderr) is killed after the grace period instead of stalling the
benchmark. Real processes, no Spark."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common  # bench/ is a folder of scripts, put on the path above

# A worker that prints a progress line, starts a child that keeps its stderr open and sleeps (the
# JVM that will not exit), writes the child's pid to a file, and exits.
LINGERING = """
import subprocess, sys
print("[bench] working", file=sys.stderr, flush=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1], "w").write(str(child.pid))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has exited all the same.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_that_outlives_its_worker_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script, pid_file, log = tmp_path / "worker.py", tmp_path / "child.pid", tmp_path / "w.log"
    script.write_text(LINGERING)
    monkeypatch.setattr(_common, "JVM_EXIT_GRACE_S", 1.0)
    started = time.monotonic()
    _common.run_worker(sys.executable, script, [str(pid_file)], log)
    assert time.monotonic() - started < 30, "run_worker waited for the child's sleep"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the lingering child still runs"
    text = log.read_text()
    assert "[bench] working" in text
    assert "[bench] the worker exited (0) but its JVM still ran 1 s later: killed" in text
    assert capsys.readouterr().err == "working\n"  # the progress line, echoed without its tag


def test_a_failing_worker_names_its_log(tmp_path: Path) -> None:
    script, log = tmp_path / "worker.py", tmp_path / "w.log"
    script.write_text("import sys\nprint('it broke', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"failed with exit code 3; full log in .*w\.log") as e:
        _common.run_worker(sys.executable, script, ["--worker", "run"], log)
    assert "it broke" in str(e.value)
    assert "killed" not in log.read_text()  # it left nothing behind to kill
