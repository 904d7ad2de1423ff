"""A windowed count on heapstate into the file sink, for test_kill.py, which SIGKILLs it.

Reads the parquet files of ``--input`` (one per micro-batch) with ``Trigger.AvailableNow``,
counts rows per key and 5-minute event-time window (2-minute watermark, append mode) into a
parquet file sink, which is exactly-once through its ``_spark_metadata`` log, and exits when the
input is consumed. Compaction every 2 versions and maintenance every second make snapshots
frequent. Prints ``KILLJOB-STARTED`` on stderr once the query runs. With ``--result FILE`` it
then writes as JSON the sink's rows, the state (read with ``spark.read.format("statestore")``)
and what an uninterrupted run must leave (``windowed_count.expected``). heapstate's pause points
come from ``-Dheapstate.faultInjection.pause`` in ``PYSPARK_SUBMIT_ARGS`` (see
``FaultInjection.scala``). With ``--exit-jvm`` it ends the driver JVM
and waits for it before exiting itself, so that what the JVM writes as it exits (the class archive
of ``job_jvm.class_archive``) is complete when this process ends, and exits with its code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import heapstate
import windowed_count
from pyspark import SparkContext
from pyspark.sql import SparkSession


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--sink", type=Path, required=True)
    parser.add_argument("--result", type=Path)
    parser.add_argument("--exit-jvm", action="store_true")
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
        query = windowed_count.start(spark, args.input, args.checkpoint, args.sink)
        print("KILLJOB-STARTED", file=sys.stderr, flush=True)
        query.awaitTermination()
        if args.result:
            result = windowed_count.results(spark, args.input, args.checkpoint, args.sink)
            args.result.write_text(json.dumps(result))
        print("KILLJOB-DONE", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    if args.exit_jvm:
        # The gateway JVM exits when its standard input ends (pyspark's PythonGatewayServer).
        jvm = SparkContext._gateway.proc  # type: ignore[union-attr]
        jvm.stdin.close()
        sys.exit(jvm.wait(timeout=300))


if __name__ == "__main__":
    main()
