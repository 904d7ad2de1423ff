"""Failed and re-run tasks give exactly the state and output of a run without failures.

``task_failure_job.py`` runs a streaming count per key in ``local[2, 4]``, where Spark retries a
failed task up to three times, once per scenario, on heapstate and on the HDFS provider (the
oracle), over the same six input files. In batch 3 (version 4) it makes one thing go wrong:

- ``upstream``: a Python UDF on the input raises in the first attempt of its task;
- ``in-state-function``: the count runs in ``applyInPandasWithState`` instead, and the function
  raises at the second key of state partition 1, while the store has the first key's update;
- ``after-commit``: a Python UDF in the same task as the state commit, after it, raises in the
  first attempt of state partition 1. The retry commits version 4 of that store a second time in
  the same executor, stepping back through heapstate's undo log; ``after-commit-no-undo`` does
  the same with ``undoVersions=0``, so the retry rebuilds version 3 from files;
- ``run-twice``: the ``foreachBatch`` sink runs every batch's plan twice, so every version of
  every store is committed twice by the same store provider;
- ``restart``: the sink raises once after version 4 was committed, which stops the query; it is
  started again in the same session and re-runs batch 3 over the committed version. Spark keys
  store providers by the query's run id, so here a new provider in the same JVM (where the old
  one may still be loaded) finds version 4 on disk and commits it again.

Every micro-batch's output and the final state (``spark.read.format("statestore")``) must equal
the clean run's. Each scenario must also prove that its fault happened: the failing attempt
leaves a marker file, and for the re-commits the marker shows the state file of version 4 in
place while batch 3 was not committed yet, and a different file there at the end (the version
was written again); ``run-twice`` shows every version's file replaced by the second run.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    HDFS_PROVIDER,
    HEAPSTATE_PROVIDER,
    PROVIDERS,
    assert_checkpoint_written_by,
    committed_batches,
    job_submit_args,
    write_input_file,
)

JOB = Path(__file__).with_name("task_failure_job.py")
BATCHES = 6
FAIL_BATCH = 3
FAULTS = {
    "upstream": ("heapstate", "hdfs"),
    "in-state-function": ("heapstate", "hdfs"),
    "after-commit": ("heapstate", "hdfs"),
    "after-commit-no-undo": ("heapstate",),  # undoVersions is heapstate's
    "run-twice": ("heapstate", "hdfs"),
    "restart": ("heapstate", "hdfs"),
}

Run = dict[str, Any]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Run]:
    """Every scenario on both providers, from one run of the job: (scenario, provider) -> run."""
    work = tmp_path_factory.mktemp("task-failure")
    rng = random.Random(5)
    for i in range(BATCHES):
        rows = [{"k": f"k{rng.randrange(9)}", "b": i} for _ in range(12)]
        write_input_file(work / "input", i, rows)
    env = dict(os.environ)
    env["PYSPARK_SUBMIT_ARGS"] = job_submit_args()
    cmd = [sys.executable, str(JOB), "--input", str(work / "input"), "--work", str(work)]
    cmd += ["--result", str(work / "result.json")]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return {
        (r["scenario"], r["provider"]): r for r in json.loads((work / "result.json").read_text())
    }


def counts(state: list[str]) -> dict[tuple[str, int], int]:
    """The state as (key, partition) -> count, whatever the operator calls its value columns
    (``count`` for the aggregation, ``n`` inside ``applyInPandasWithState``'s group state)."""

    def count_of(value: Any) -> int | None:
        if isinstance(value, dict):
            for name in ("count", "n", "groupState"):
                if name in value:
                    return count_of(value[name])
            return None
        return value if isinstance(value, int) else None

    out = {}
    for line in state:
        row = json.loads(line)
        n = count_of(row["value"])
        assert n is not None, f"no count in state row {row}"
        out[(row["key"]["k"], row["partition_id"])] = n
    return out


def assert_same_results(run: Run, reference: Run) -> None:
    assert sorted(run["batches"], key=int) == [str(b) for b in range(BATCHES)], run["batches"]
    assert run["batches"] == reference["batches"]
    assert counts(run["state"]) == counts(reference["state"])
    if run["scenario"] != "in-state-function":
        assert run["state"] == reference["state"]
    provider = PROVIDERS[run["provider"]]
    checkpoint = Path(run["checkpoint"])
    assert committed_batches(checkpoint) == list(range(BATCHES))
    assert_checkpoint_written_by(checkpoint, provider)


def test_clean_runs_agree(runs: dict[tuple[str, str], Run]) -> None:
    heap, hdfs = runs["clean", "heapstate"], runs["clean", "hdfs"]
    assert all(rows for rows in heap["batches"].values()), heap["batches"]
    assert len(counts(heap["state"])) >= 5
    assert heap["markers"] == hdfs["markers"] == {}
    assert_same_results(heap, hdfs)
    assert_checkpoint_written_by(Path(heap["checkpoint"]), HEAPSTATE_PROVIDER)
    assert_checkpoint_written_by(Path(hdfs["checkpoint"]), HDFS_PROVIDER)


def assert_recommitted(evidence: dict[str, Any]) -> None:
    """Version 4's state file was in place before batch 3 was committed, and was written again."""
    assert Path(evidence["state_file"]).name.startswith(f"{FAIL_BATCH + 1}."), evidence
    assert evidence["state_file_id"] is not None, f"no state file before the re-run: {evidence}"
    assert evidence["batch_committed"] is False, evidence
    assert evidence["final_state_file_id"] is not None, evidence
    assert evidence["final_state_file_id"] != evidence["state_file_id"], (
        f"{evidence['state_file']} was not written again"
    )


@pytest.mark.parametrize(
    ("scenario", "provider"), [(s, p) for s, providers in FAULTS.items() for p in providers]
)
def test_failed_task_gives_exact_results(
    runs: dict[tuple[str, str], Run], scenario: str, provider: str
) -> None:
    run = runs[scenario, provider]
    assert_same_results(run, runs["clean", "heapstate"])
    markers = run["markers"]

    if scenario == "upstream":
        assert set(markers) == {"upstream"}
        assert markers["upstream"]["attempt"] == 0
    elif scenario == "in-state-function":
        assert set(markers) == {"in-state-function"}
        assert markers["in-state-function"]["keys_before"] == 1
        assert run["state"] == runs["in-state-function", "hdfs"]["state"]
    elif scenario.startswith("after-commit"):
        assert set(markers) == {"after-commit"}
        assert_recommitted(markers["after-commit"])
    elif scenario == "restart":
        assert set(markers) == {"restart"}
        assert run["starts"] == 2
        assert_recommitted(markers["restart"])
    elif scenario == "run-twice":
        assert markers == {}
        assert [r["batch"] for r in run["reruns"]] == list(range(BATCHES))
        for r in run["reruns"]:
            for before, after in zip(r["before"], r["after"]):
                assert before is not None and after is not None, r
                assert before != after, f"batch {r['batch']}: the second run wrote nothing: {r}"
    else:
        raise AssertionError(f"no checks for scenario {scenario}")
