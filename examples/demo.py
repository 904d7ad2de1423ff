"""heapstate in one minute: a streaming aggregation with a restart, and what it checkpointed.

Run it with ``bin/demo`` (or ``.venv/bin/python examples/demo.py``). It:

1. starts local Spark with heapstate as the state store (``heapstate.configure``);
2. counts purchases per user over six generated micro-batches, stopping after the third and
   restarting from the checkpoint, so the last three batches build on restored state;
3. lists, per operator and partition, the journal (one per committed version) and snapshot
   files heapstate wrote, with their sizes;
4. reads the final state back through Spark's state data source,
   ``spark.read.format("statestore")``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import heapstate
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

USERS = [f"user-{i:02d}" for i in range(24)]
BATCHES = 6
FIRST_RUN = 3
ROWS_PER_BATCH = 10
SNAPSHOT_WAIT_S = 15


def generate_batch(directory: Path, index: int) -> None:
    """One JSON-lines file of purchases by a few users, so that each batch's journal holds only
    the users it touched while a snapshot holds them all. Its modification time orders it among
    the other files."""
    rng = random.Random(index)
    rows = [
        {"user": rng.choice(USERS), "amount": rng.randint(1, 50)} for _ in range(ROWS_PER_BATCH)
    ]
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".batch-{index:03d}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mtime = 1_704_067_200 + index
    os.utime(tmp, (mtime, mtime))
    tmp.rename(directory / f"batch-{index:03d}.json")


def purchases_per_user(spark: SparkSession, source: Path) -> DataFrame:
    events = (
        spark.readStream.schema("user STRING, amount INT")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
    )
    return events.groupBy("user").agg(
        F.count("*").alias("purchases"), F.sum("amount").alias("spent")
    )


def print_batch(df: DataFrame, batch_id: int) -> None:
    rows = sorted(df.collect())
    summary = ", ".join(f"{r.user}={r.purchases}/{r.spent}" for r in rows)
    print(f"  batch {batch_id}, {len(rows)} users updated (purchases/spent): {summary}")


def run(spark: SparkSession, source: Path, checkpoint: Path, wait_for_snapshot: bool) -> None:
    """Run until the source is drained. With ``wait_for_snapshot``, keep the query (and so its
    state stores) alive a little longer, until Spark's maintenance thread has written a
    snapshot, so that the listing below shows one."""
    writer = (
        purchases_per_user(spark, source)
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(print_batch)
    )
    if not wait_for_snapshot:
        writer.trigger(availableNow=True).start().awaitTermination()
        return
    query = writer.trigger(processingTime="500 milliseconds").start()
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    try:
        while time.monotonic() < deadline:
            commits = checkpoint / "commits"
            drained = (
                commits.is_dir()
                and len([p for p in commits.iterdir() if p.name.isdigit()]) >= BATCHES
            )
            if drained and any((checkpoint / "state").rglob("*.hs-snapshot")):
                break
            query.awaitTermination(0.5)
    finally:
        query.stop()


def provider_of(checkpoint: Path) -> str:
    """The state store provider Spark pinned in the checkpoint's first offset log entry."""
    for line in (checkpoint / "offsets" / "0").read_text().splitlines():
        if line.startswith("{") and '"conf"' in line:
            return json.loads(line)["conf"].get(heapstate.PROVIDER_CONF, "?")
    return "?"


def print_state_files(checkpoint: Path) -> None:
    state = checkpoint / "state"
    for op in sorted(p for p in state.iterdir() if p.name.isdigit()):
        for part in sorted(
            (p for p in op.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        ):
            files = sorted(
                (f for f in part.iterdir() if f.suffix in (".hs-journal", ".hs-snapshot")),
                key=lambda f: (int(f.stem), f.suffix),
            )
            total = sum(f.stat().st_size for f in files)
            print(f"  operator {op.name}, partition {part.name}: {len(files)} files, {total} bytes")
            for f in files:
                kind = "snapshot" if f.suffix == ".hs-snapshot" else "journal "
                print(f"    {kind} version {int(f.stem):>2}  {f.stat().st_size:>6} bytes  {f.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where to put input and checkpoint")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="heapstate-demo-"))
    source, checkpoint = workdir / "input", workdir / "checkpoint"
    if checkpoint.exists():
        shutil.rmtree(checkpoint)
    if source.exists():
        shutil.rmtree(source)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("heapstate-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Frequent maintenance and a short compaction interval, so that a snapshot shows up.
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
    )
    spark = heapstate.configure(builder, compaction_interval=2).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(f"Spark {spark.version}, state store: {spark.conf.get(heapstate.PROVIDER_CONF)}")
        print(f"working in {workdir}\n")

        for i in range(FIRST_RUN):
            generate_batch(source, i)
        print(f"run 1: batches 0-{FIRST_RUN - 1}")
        run(spark, source, checkpoint, wait_for_snapshot=False)

        for i in range(FIRST_RUN, BATCHES):
            generate_batch(source, i)
        print(f"run 2 (restarted from the checkpoint): batches {FIRST_RUN}-{BATCHES - 1}")
        run(spark, source, checkpoint, wait_for_snapshot=True)

        print(f"\ncheckpoint written by {provider_of(checkpoint)}:")
        print_state_files(checkpoint)

        print('\nfinal state, read back with spark.read.format("statestore"):')
        state = spark.read.format("statestore").load(str(checkpoint))
        state.select(
            F.col("key.user").alias("user"),
            F.col("value.*"),
            "partition_id",
        ).orderBy("user").show(len(USERS), truncate=False)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
