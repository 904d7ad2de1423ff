"""A streaming count per key whose tasks fail on purpose, for test_task_failure.py.

One SparkSession in ``local[2, 4]`` (two cores, four attempts per task) runs the same query once
per scenario and provider, each with its own checkpoint, over the JSON files of ``--input``: one
per micro-batch (``Trigger.AvailableNow``), whose column ``b`` holds the file's batch index.

The query: Python UDF ``gate`` on the input, a count per ``k`` in update mode over 2 shuffle
partitions, and a ``foreachBatch`` sink. The sink sorts each state partition's output and passes
it through Python UDF ``after_commit``, in the same task as the state commit: the sort consumes
all of the partition's rows, so the store has committed before the UDF sees the first row. It
then writes the batch's rows to ``sink/<batch id>.json``, overwriting: an idempotent write keyed
by batch id. The scenarios, at batch ``FAIL_BATCH`` and state partition ``FAIL_PARTITION``:

- ``clean``: no failure, the reference.
- ``upstream``: ``gate`` raises in the first attempt of the batch's input task; Spark retries it.
- ``in-state-function``: the count runs in ``applyInPandasWithState``, whose function raises at
  the partition's second key in the first attempt: the task fails with the store open and the
  first key's state updated.
- ``after-commit``: ``after_commit`` raises in the first attempt of the partition's task, after
  the store committed the batch's version; the retried task commits the same version again in
  the same executor.
- ``after-commit-no-undo``: the same with heapstate's ``undoVersions=0``, so the retry cannot
  step back in memory and rebuilds the version before from files.
- ``run-twice``: the sink collects every batch twice; each run executes the stateful tasks and
  commits the batch's version again.
- ``restart``: the sink raises once after the batch's state was committed; the query stops with
  that error and is started again from its checkpoint in the same session, which re-runs the
  batch and commits its version again (through a new provider instance: Spark keys providers by
  the query's run id).

Each failure happens once: the failing attempt creates a marker file (exclusively) that records
what the test needs to know it really happened, e.g. that the version's state file was already
in place. ``--result FILE`` gets, per run, the sink's batches, the final state (read with
``spark.read.format("statestore")``) and the markers, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import heapstate
from pyspark.errors import StreamingQueryException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.taskcontext import TaskContext

SCENARIOS = (
    "clean",
    "upstream",
    "in-state-function",
    "after-commit",
    "after-commit-no-undo",
    "run-twice",
    "restart",
)
FAIL_BATCH = 3
FAIL_PARTITION = 1
SHUFFLE_PARTITIONS = 2
STATE_FILE_SUFFIX = {"heapstate": "hs-journal", "hdfs": "delta"}


def mark(markers: Path, name: str, evidence: dict[str, Any]) -> bool:
    """Creates marker ``name`` with ``evidence``; False when it exists (the fault already ran)."""
    try:
        fd = os.open(markers / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(evidence, f)
    return True


def state_file(checkpoint: Path, provider: str, partition: int, version: int) -> Path:
    return checkpoint / "state" / "0" / str(partition) / f"{version}.{STATE_FILE_SUFFIX[provider]}"


def file_id(path: Path) -> list[int] | None:
    """Inode and modification time: both change when an atomic write replaces the file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_ino, st.st_mtime_ns]


class Run:
    """One scenario on one provider: its checkpoint, sink, markers and UDFs."""

    def __init__(self, root: Path, scenario: str, provider: str) -> None:
        self.scenario, self.provider = scenario, provider
        self.dir = root / f"{scenario}-{provider}"
        self.checkpoint, self.sink, self.markers = (
            self.dir / "checkpoint",
            self.dir / "sink",
            self.dir / "markers",
        )
        self.sink.mkdir(parents=True)
        self.markers.mkdir()
        self.reruns: list[dict[str, Any]] = []

    def gate(self) -> Callable[[Column], Column]:
        scenario, markers = self.scenario, self.markers

        @F.udf("string")
        def gate(k: str, batch: int) -> str:
            tc = TaskContext.get()
            if scenario == "upstream" and batch == FAIL_BATCH and tc.attemptNumber() == 0:
                evidence = {"stage": tc.stageId(), "partition": tc.partitionId(), "attempt": 0}
                if mark(markers, "upstream", evidence):
                    raise RuntimeError(f"injected failure in batch {batch}, before the state")
            return k

        return gate

    def after_commit(self, batch: int) -> Callable[[Column], Column]:
        scenario, markers = self.scenario, self.markers
        path = state_file(self.checkpoint, self.provider, FAIL_PARTITION, batch + 1)
        commits = self.checkpoint / "commits" / str(batch)

        @F.udf("string")
        def after_commit(k: str) -> str:
            tc = TaskContext.get()
            if (
                scenario.startswith("after-commit")
                and batch == FAIL_BATCH
                and tc.partitionId() == FAIL_PARTITION
                and tc.attemptNumber() == 0
            ):
                evidence = {
                    "state_file": str(path),
                    "state_file_id": file_id(path),
                    "batch_committed": commits.exists(),
                    "attempt": 0,
                }
                if mark(markers, "after-commit", evidence):
                    raise RuntimeError(f"injected failure in batch {batch}, after the commit")
            return k

        return after_commit

    def write_batch(self, df: DataFrame, batch: int) -> None:
        out = df.sortWithinPartitions("k").withColumn("k", self.after_commit(batch)("k"))
        rows = sorted([r["k"], r["n"]] for r in out.collect())
        if self.scenario == "run-twice":
            # Every run of the batch's plan runs its state tasks and commits its version.
            files = [state_file(self.checkpoint, self.provider, p, batch + 1) for p in (0, 1)]
            before = [file_id(f) for f in files]
            again = sorted([r["k"], r["n"]] for r in out.collect())
            after = [file_id(f) for f in files]
            self.reruns.append({"batch": batch, "before": before, "after": after})
            if again != rows:
                raise AssertionError(f"batch {batch} gave {rows}, then {again}")
        (self.sink / f"{batch}.json").write_text(json.dumps(rows))
        if self.scenario == "restart" and batch == FAIL_BATCH:
            path = state_file(self.checkpoint, self.provider, FAIL_PARTITION, batch + 1)
            evidence = {
                "state_file": str(path),
                "state_file_id": file_id(path),
                "batch_committed": (self.checkpoint / "commits" / str(batch)).exists(),
            }
            if mark(self.markers, "restart", evidence):
                raise RuntimeError(f"injected failure in batch {batch}, after the commit")

    def count_in_pandas(self) -> Callable[..., Iterator[Any]]:
        """A running count per key for ``applyInPandasWithState``, which raises in scenario
        ``in-state-function`` at the second key of the chosen partition and batch: the state
        task fails with the store open and the first key's state already updated."""
        scenario, markers = self.scenario, self.markers
        keys_seen: dict[tuple[int, int, int], int] = {}

        def count(key: tuple[str], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
            import pandas as pd

            n = state.get[0] if state.exists else 0
            batch = -1
            for pdf in pdfs:
                n += len(pdf)
                batch = int(pdf["b"].iloc[0])
            state.update((n,))
            tc = TaskContext.get()
            task = (tc.stageId(), tc.partitionId(), tc.attemptNumber())
            keys_seen[task] = keys_seen.get(task, 0) + 1
            if (
                scenario == "in-state-function"
                and batch == FAIL_BATCH
                and tc.partitionId() == FAIL_PARTITION
                and tc.attemptNumber() == 0
                and keys_seen[task] == 2
            ):
                evidence = {"keys_before": keys_seen[task] - 1, "attempt": 0}
                if mark(markers, "in-state-function", evidence):
                    raise RuntimeError(f"injected failure in batch {batch}, in the state function")
            yield pd.DataFrame({"k": [key[0]], "n": [n]})

        return count


def run_query(spark: SparkSession, run: Run, input_dir: Path) -> None:
    gate = run.gate()
    rows = (
        spark.readStream.schema("k STRING, b INT")
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .withColumn("k", gate("k", "b"))
        .groupBy("k")
    )
    if run.scenario == "in-state-function":
        counts = rows.applyInPandasWithState(
            run.count_in_pandas(), "k STRING, n LONG", "n LONG", "Update", "NoTimeout"
        )
    else:
        counts = rows.agg(F.count("*").alias("n"))
    query = (
        counts.writeStream.outputMode("update")
        .option("checkpointLocation", str(run.checkpoint))
        .trigger(availableNow=True)
        .foreachBatch(run.write_batch)
        .start()
    )
    query.awaitTermination()


def run_scenario(spark: SparkSession, run: Run, input_dir: Path) -> dict[str, Any]:
    spark.conf.set(heapstate.PROVIDER_CONF, heapstate.PROVIDER_CLASS)
    if run.provider == "hdfs":
        spark.conf.set(heapstate.PROVIDER_CONF, heapstate.SPARK_DEFAULT_PROVIDER)
    undo_key = heapstate.CONF_PREFIX + "undoVersions"
    spark.conf.set(undo_key, "0" if run.scenario == "after-commit-no-undo" else "2")
    starts = 0
    while True:
        starts += 1
        try:
            run_query(spark, run, input_dir)
            break
        except StreamingQueryException as e:
            # Only the restart scenario's own failure, once, may stop the query.
            if run.scenario != "restart" or starts > 1 or "injected failure" not in str(e):
                raise
    markers = {p.name: json.loads(p.read_text()) for p in sorted(run.markers.iterdir())}
    for evidence in markers.values():
        if "state_file" in evidence:  # the same file after the retry or the restart
            evidence["final_state_file_id"] = file_id(Path(evidence["state_file"]))
    state = spark.read.format("statestore").load(str(run.checkpoint))
    state_rows = state.select(F.to_json(F.struct("key", "value", "partition_id")).alias("j"))
    return {
        "scenario": run.scenario,
        "provider": run.provider,
        "starts": starts,
        "batches": {p.stem: json.loads(p.read_text()) for p in sorted(run.sink.glob("*.json"))},
        "state": sorted(r["j"] for r in state_rows.collect()),
        "markers": markers,
        "reruns": run.reruns,
        "checkpoint": str(run.checkpoint),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--providers", default="heapstate,hdfs")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2, 4]")
        .appName("heapstate-task-failure")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
        .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
    )
    spark = heapstate.configure(builder, compaction_interval=2).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        results = []
        for provider in args.providers.split(","):
            for scenario in SCENARIOS:
                if scenario == "after-commit-no-undo" and provider != "heapstate":
                    continue  # undoVersions is heapstate's
                run = Run(args.work, scenario, provider)
                results.append(run_scenario(spark, run, args.input))
                print(f"TASKFAIL-DONE {scenario} {provider}", file=sys.stderr, flush=True)
        args.result.write_text(json.dumps(results))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
