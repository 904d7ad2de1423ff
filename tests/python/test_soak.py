"""The 50-batch version of ``bench/soak.py`` on heapstate: files and bytes stay bounded by
retention, the retained heap does not grow, and the final state equals the model.

The soak runs in its own process (its own JVM, with its own confs: compaction every 5 versions,
``minBatchesToRetain`` 10, maintenance every second, and Spark's snapshot-lag detection made
strict: without heapstate's snapshot reports to Spark's coordinator, Spark would force a snapshot
on every commit and the snapshot bound would fail); the 300-batch run is ``bench/soak.py``'s
default and is left to ``bench/``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import bench_java_option_args

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "bench" / "soak.py"


def test_fifty_batches_stay_bounded_and_equal_the_model(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = ["--batches", "50", "--keys", "5000", "--updates", "500", "--retain", "10"]
    args += ["--compaction-interval", "5", "--heap-every", "5", "--out", str(out)]
    # Spark's coordinator forces a snapshot on every commit of a store it counts as lagging;
    # strict detection makes that happen within 50 batches unless heapstate reports snapshots.
    args += ["--strict-lag-detection"]
    # C1 only and the class archive, as the other jobs' drivers (job_jvm.SUBPROCESS_JAVA_OPTIONS):
    # what this test checks (files, retained heap, state) does not depend on the compiler.
    args += bench_java_option_args()
    run = subprocess.run(
        [sys.executable, str(SOAK), *args, "--work-dir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    failed = [c["check"] for c in report["checks"] if not c["pass"]]
    assert failed == [], (failed, report["over_bound"][:5], run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-3000:]
    assert report["state_matches_model"] and report["keys_wrong"] == 0
    assert len(report["batches"]) == 50
    assert {c["check"].split(":")[0] for c in report["checks"]} >= {
        "store files within the bound plus slack after every batch",
        "store files within the bound after the last batch",
        "final state equals the model (5,000 keys)",
    }
    # Retention bounds each store folder: 10 retained versions with compaction every 5.
    assert report["file_bound"] == {"journals": 14, "snapshots": 4}
    assert all(
        c["journals"] <= 14 and c["snapshots"] <= 4 for c in report["final_store_files"].values()
    )
