"""The windowed count that the fault tests kill: its input, its query and how to read back what
it produced. ``kill_job.py`` (driver kills, test_kill.py) and ``executor_loss_job.py`` (executor
kills on a standalone cluster, test_executor_loss.py) run this same query, and their tests
compare the results of a faulted run with what an uninterrupted one leaves (:func:`expected`).

The query reads parquet files, one per micro-batch (``maxFilesPerTrigger=1``), counts rows per
key and 5-minute event-time window (2-minute watermark, append mode) into a parquet file sink,
which is exactly-once through its ``_spark_metadata`` log, with ``Trigger.AvailableNow``.
"""

from __future__ import annotations

import os
import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import heapstate
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

SCHEMA = "k LONG, t TIMESTAMP"


def write_inputs(directory: Path, files: int, seed: int) -> None:
    """``files`` parquet files of 40 rows each: 12 keys, event times moving 40 s per file."""
    directory.mkdir(parents=True)
    rng = random.Random(seed)
    base = datetime(2024, 1, 1)
    schema = pa.schema([("k", pa.int64()), ("t", pa.timestamp("us"))])
    for i in range(files):
        ks = [rng.randrange(12) for _ in range(40)]
        ts = [base + timedelta(seconds=40 * i + rng.uniform(0, 40)) for _ in range(40)]
        hidden = directory / f".part-{i:04d}.parquet"
        pq.write_table(pa.table({"k": ks, "t": ts}, schema=schema), hidden)
        os.replace(hidden, directory / f"part-{i:04d}.parquet")
        # The file source orders files by modification time: keep it strictly increasing.
        os.utime(directory / f"part-{i:04d}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))


def start(spark: SparkSession, source: Path, checkpoint: Path, sink: Path) -> StreamingQuery:
    """Starts the windowed count of the files in ``source`` into the file sink ``sink``."""
    counts = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .withWatermark("t", "2 minutes")
        .groupBy(F.window("t", "5 minutes"), "k")
        .agg(F.count("*").alias("n"))
    )
    return (
        counts.writeStream.format("parquet")
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(sink))
    )


def results(spark: SparkSession, source: Path, checkpoint: Path, sink: Path) -> dict[str, Any]:
    """The sink's rows and the final state (``statestore``), as sorted JSON strings, the session's
    provider, and under ``expected`` the sink and state :func:`expected` makes of ``source``."""
    rows = spark.read.parquet(str(sink)).select(F.to_json(F.struct("*")).alias("j"))
    state = spark.read.format("statestore").load(str(checkpoint))
    state_rows = state.select(F.to_json(F.struct("key", "value", "partition_id")).alias("j"))
    return {
        "sink": sorted(r["j"] for r in rows.collect()),
        "state": sorted(r["j"] for r in state_rows.collect()),
        "provider": spark.conf.get(heapstate.PROVIDER_CONF),
        "expected": expected(spark, source),
    }


def expected(spark: SparkSession, source: Path) -> dict[str, list[str]]:
    """The sink rows and final state that the streaming query must leave after consuming every
    file of ``source``, computed by a batch query over the same files, as :func:`results` gives
    them.

    - No row is ever late: the rows of file i have event times in [40 i, 40 i + 40) s
      (:func:`write_inputs`), and the watermark a batch uses trails the newest row of the files
      before it by 2 minutes. So every window's count is the count over all the files.
    - After the last file, ``Trigger.AvailableNow`` runs one batch without data at the final
      watermark, the newest event time less 2 minutes. Append mode has by then written every
      window that ends at or before it to the sink and evicted it from state.
    - The other windows stay in state, each key in the shuffle partition that Spark's hash
      partitioning of the grouping keys gives it: ``pmod(hash(window, k), partitions)``.
    """
    rows = spark.read.schema(SCHEMA).parquet(str(source))
    watermark = rows.agg((F.max("t") - F.expr("INTERVAL 2 MINUTES")).alias("watermark"))
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))  # type: ignore[arg-type]
    counts = rows.groupBy(F.window("t", "5 minutes"), "k").agg(F.count("*").alias("n"))
    counts = counts.crossJoin(watermark)
    emitted = F.col("window.end") <= F.col("watermark")
    sink = counts.where(emitted).select(F.to_json(F.struct("window", "k", "n")).alias("j"))
    state = counts.where(~emitted).select(
        F.to_json(
            F.struct(
                F.struct("window", "k").alias("key"),
                F.struct(F.col("n").alias("count")).alias("value"),
                F.expr(f"pmod(hash(window, k), {partitions})").alias("partition_id"),
            )
        ).alias("j")
    )
    return {
        "sink": sorted(r["j"] for r in sink.collect()),
        "state": sorted(r["j"] for r in state.collect()),
    }
