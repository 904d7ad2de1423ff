"""A windowed count on heapstate into the file sink, for test_kill.py, which SIGKILLs it.

Reads the parquet files of ``--input`` (one per micro-batch) with ``Trigger.AvailableNow``,
counts rows per key and 5-minute event-time window (2-minute watermark, append mode) into a
parquet file sink, which is exactly-once through its ``_spark_metadata`` log, and exits when the
input is consumed. Compaction every 2 versions and maintenance every second make snapshots
frequent. Prints ``KILLJOB-STARTED`` on stderr once the query runs. With ``--result FILE`` it
then writes the sink's rows and the state (read with ``spark.read.format("statestore")``) as
JSON. heapstate's pause points come from ``-Dheapstate.faultInjection.pause`` in
``PYSPARK_SUBMIT_ARGS`` (see ``FaultInjection.scala``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import heapstate
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

SCHEMA = "k LONG, t TIMESTAMP"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--sink", type=Path, required=True)
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("heapstate-kill-job")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
    )
    spark = heapstate.configure(builder, compaction_interval=2).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        counts = (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(args.input))
            .withWatermark("t", "2 minutes")
            .groupBy(F.window("t", "5 minutes"), "k")
            .agg(F.count("*").alias("n"))
        )
        query = (
            counts.writeStream.format("parquet")
            .outputMode("append")
            .option("checkpointLocation", str(args.checkpoint))
            .trigger(availableNow=True)
            .start(str(args.sink))
        )
        print("KILLJOB-STARTED", file=sys.stderr, flush=True)
        query.awaitTermination()
        if args.result:
            sink = spark.read.parquet(str(args.sink)).select(F.to_json(F.struct("*")).alias("j"))
            state = spark.read.format("statestore").load(str(args.checkpoint))
            state_rows = state.select(
                F.to_json(F.struct("key", "value", "partition_id")).alias("j")
            )
            result = {
                "sink": sorted(r["j"] for r in sink.collect()),
                "state": sorted(r["j"] for r in state_rows.collect()),
                "provider": spark.conf.get(heapstate.PROVIDER_CONF),
            }
            args.result.write_text(json.dumps(result))
        print("KILLJOB-DONE", file=sys.stderr, flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
