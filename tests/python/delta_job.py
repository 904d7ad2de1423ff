"""A streaming count from a Delta table to a Delta table on heapstate, for test_delta.py.

Runs in its own process, since pyspark has one JVM per process and the suite's session has no
Delta. The session is built with heapstate's ``configure`` and Delta's
``configure_spark_with_delta_pip`` in the order given by ``--order``. Prints one JSON object:
the builder's jar confs, and the sink's rows after the first run and after a restart.

  python delta_job.py --order heapstate-first|delta-first --workdir DIR --partitions N
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import heapstate
from delta import configure_spark_with_delta_pip
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

START = time.monotonic()

FIRST_RUN = [[("a", 1), ("b", 2)], [("a", 3), ("c", 4)]]
SECOND_RUN = [[("b", 5), ("d", 7)]]
"""(k, v) rows of each commit to the source table; one file, so one micro-batch, each."""


def maven_mirror() -> str | None:
    """The mirror URL named in ``~/.m2/settings.xml``, if any, as bin/sbt finds it."""
    settings = Path.home() / ".m2" / "settings.xml"
    if not settings.is_file():
        return None
    try:
        root = ET.parse(settings).getroot()
    except ET.ParseError:
        return None
    for el in root.iter():
        if el.tag.split("}")[-1] == "mirror":
            for child in el:
                if child.tag.split("}")[-1] == "url" and child.text:
                    return child.text.strip()
    return None


def build_session(order: str, partitions: int) -> tuple[SparkSession, dict[str, str]]:
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"heapstate-delta-{order}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "WARN")
        .config("spark.sql.shuffle.partitions", str(partitions))
        # Delta rebuilds its table state with 50 tasks by default: far too many for a test.
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.databricks.delta.stats.collect", "false")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
    )
    mirror = maven_mirror()
    if mirror:
        builder = builder.config("spark.jars.repositories", mirror)
    if order == "heapstate-first":
        builder = configure_spark_with_delta_pip(
            heapstate.configure(builder, compaction_interval=2)
        )
    elif order == "delta-first":
        builder = heapstate.configure(
            configure_spark_with_delta_pip(builder), compaction_interval=2
        )
    else:
        raise SystemExit(f"--order must be heapstate-first or delta-first, not {order!r}")
    options = dict(builder._options)  # type: ignore[attr-defined]
    jar_confs = {k: options[k] for k in ("spark.jars", "spark.jars.packages") if k in options}
    # Delta's helper asks for the Delta jar of the installed delta-spark version. Where Maven
    # Central lacks that one, HEAPSTATE_DELTA_JAR_VERSION names a published one to use instead.
    override = os.environ.get("HEAPSTATE_DELTA_JAR_VERSION")
    if override:
        coordinate = options["spark.jars.packages"]
        group_artifact = coordinate.rsplit(":", 1)[0]
        builder = builder.config("spark.jars.packages", f"{group_artifact}:{override}")
    return builder.getOrCreate(), jar_confs


def append(spark: SparkSession, table: Path, rows: list[tuple[str, int]]) -> None:
    spark.createDataFrame(rows, "k STRING, v INT").coalesce(1).write.format("delta").mode(
        "append"
    ).save(str(table))


def run_query(spark: SparkSession, source: Path, sink: Path, checkpoint: Path) -> None:
    query = (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", 1)
        .load(str(source))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .writeStream.format("delta")
        .outputMode("complete")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(sink))
    )
    try:
        if not query.awaitTermination(300):
            raise SystemExit("the Delta query did not finish within 300 s")
    finally:
        if query.isActive:
            query.stop()


def sink_rows(spark: SparkSession, sink: Path) -> list[list[Any]]:
    return [list(r) for r in spark.read.format("delta").load(str(sink)).orderBy("k").collect()]


def log(message: str) -> None:
    print(f"[delta_job {time.monotonic() - START:6.1f}s] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--order", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--partitions", required=True, type=int)
    args = parser.parse_args()
    spark, jar_confs = build_session(args.order, args.partitions)
    spark.sparkContext.setLogLevel("ERROR")
    log("session started")
    source, sink, checkpoint = (args.workdir / n for n in ("source", "sink", "checkpoint"))
    try:
        for rows in FIRST_RUN:
            append(spark, source, rows)
        log("source written")
        run_query(spark, source, sink, checkpoint)
        first = sink_rows(spark, sink)
        log("first run done")
        for rows in SECOND_RUN:
            append(spark, source, rows)
        run_query(spark, source, sink, checkpoint)
        second = sink_rows(spark, sink)
        log("second run done")
        result = {
            "jarConfs": jar_confs,
            "provider": spark.conf.get(heapstate.PROVIDER_CONF),
            "first": first,
            "second": second,
        }
    finally:
        spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
