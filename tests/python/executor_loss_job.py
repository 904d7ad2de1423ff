"""A windowed count on heapstate into the file sink, for test_executor_loss.py.

The driver of one run, on the master given by ``--master``: a Spark standalone cluster, whose
executors the test SIGKILLs while the query runs. Reads the parquet files of ``--input`` (one per micro-batch) with
``Trigger.AvailableNow``, counts rows per key and 5-minute event-time window (2-minute
watermark, append mode) into a parquet file sink, which is exactly-once through its
``_spark_metadata`` log, over 4 shuffle partitions, and exits when the input is consumed.

On stderr it prints ``EXECLOSS-STARTED <app id>`` once the query runs and ``EXECLOSS-BATCH <id>``
after each micro-batch. With ``--result FILE`` it then writes as JSON the sink's rows, the state
(read with ``spark.read.format("statestore")``), what an uninterrupted run must leave
(``windowed_count.expected``), and what Spark's REST API says about the application's executors
and failed tasks, which the test uses to prove that executors were lost and tasks failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import heapstate
import windowed_count
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

SHUFFLE_PARTITIONS = 4


class BatchPrinter(StreamingQueryListener):
    """Prints each finished micro-batch, so that the test can time its kills."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        print(f"EXECLOSS-BATCH {event.progress.batchId}", file=sys.stderr, flush=True)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def rest(spark: SparkSession, path: str) -> Any:
    """GET ``/api/v1/applications/<app id>/<path>`` from this driver's UI."""
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/{path}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--sink", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--ui-port", type=int, required=True)
    parser.add_argument("--executor-java-options", default="")
    args = parser.parse_args()
    builder = (
        SparkSession.builder.master(args.master)
        .appName("heapstate-executor-loss")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.port", str(args.ui_port))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.executor.extraJavaOptions", args.executor_java_options)
        # Executor loss fails tasks, and lost shuffle output fails stages: allow plenty of both.
        .config("spark.task.maxFailures", "10")
        .config("spark.stage.maxConsecutiveAttempts", "10")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
    )
    spark = heapstate.configure(builder, compaction_interval=2).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        spark.streams.addListener(BatchPrinter())
        query = windowed_count.start(spark, args.input, args.checkpoint, args.sink)
        print(f"EXECLOSS-STARTED {spark.sparkContext.applicationId}", file=sys.stderr, flush=True)
        query.awaitTermination()

        stages = rest(spark, "stages")
        result = {
            **windowed_count.results(spark, args.input, args.checkpoint, args.sink),
            "executors": [
                {k: e.get(k) for k in ("id", "isActive", "removeReason", "failedTasks")}
                for e in rest(spark, "allexecutors")
                if e["id"] != "driver"
            ],
            "failed_tasks": sum(s.get("numFailedTasks", 0) for s in stages),
        }
        args.result.write_text(json.dumps(result))
        print("EXECLOSS-DONE", file=sys.stderr, flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
