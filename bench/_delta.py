"""A local Spark session with Delta Lake, for the benchmarks' results table and the notebooks.

The session is built as ``tests/python/delta_job.py`` builds its own: ``local[2]``, no UI, few
shuffle partitions, Delta's extension and catalog, and the Delta jar that delta-spark's
``configure_spark_with_delta_pip`` asks for, fetched by Spark from Maven Central or from the
mirror named in ``~/.m2/settings.xml``::

    from _delta import delta_session

    spark = delta_session("heapstate-results")
    spark.read.format("delta").load("bench/results/table").show()

The Delta jar's version: delta-spark 4.4.1 (pip) asks for a 4.4.1 jar that Maven Central does
not carry for Spark 4.2, so the version is taken from ``HEAPSTATE_DELTA_JAR_VERSION`` instead,
``4.4.0`` (the newest published one) when it is unset.
"""

from __future__ import annotations

import contextlib
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

DELTA_JAR_ENV = "HEAPSTATE_DELTA_JAR_VERSION"
DEFAULT_DELTA_JAR_VERSION = "4.4.0"

DELTA_CONFS: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta rebuilds a table's state with 50 tasks by default: far too many for 2 cores.
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.databricks.delta.stats.collect": "false",
}


def maven_mirror(settings: Path | None = None) -> str | None:
    """The first mirror URL named in ``settings`` (default ``~/.m2/settings.xml``), if any: the
    repository bin/sbt and Spark's package resolution use instead of Maven Central."""
    path = settings if settings is not None else Path.home() / ".m2" / "settings.xml"
    if not path.is_file():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    for el in root.iter():
        if el.tag.split("}")[-1] == "mirror":
            for child in el:
                if child.tag.split("}")[-1] == "url" and child.text:
                    return child.text.strip()
    return None


def delta_jar_version() -> str:
    """The Delta jar version to fetch: ``HEAPSTATE_DELTA_JAR_VERSION``, else 4.4.0."""
    return os.environ.get(DELTA_JAR_ENV) or DEFAULT_DELTA_JAR_VERSION


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Point this process's stdout and stderr file descriptors at ``log`` for a while: a JVM
    launched meanwhile keeps writing there (Ivy's resolution report, Spark's log)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with log.open("ab") as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def delta_session(
    app_name: str = "heapstate-bench-delta",
    shuffle_partitions: int = 2,
    confs: Mapping[str, str] | None = None,
    jvm_log: Path | None = None,
) -> Any:
    """Get or create a ``local[2]`` SparkSession with Delta Lake, its log level at WARN.

    ``confs`` are set last, so they override the defaults here. With ``jvm_log``, the JVM's own
    output (Ivy's report of the Delta jars, Spark's warnings) goes to that file rather than to
    this process's output, which keeps a notebook's outputs readable. As with any
    ``getOrCreate``, a session already running in this process is returned as it is (static
    confs and jars can only be set by the first one)."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "WARN")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    )
    for key, value in DELTA_CONFS.items():
        builder = builder.config(key, value)
    mirror = maven_mirror()
    if mirror:
        builder = builder.config("spark.jars.repositories", mirror)
    builder = configure_spark_with_delta_pip(builder)
    coordinate = builder._options["spark.jars.packages"]  # type: ignore[attr-defined]
    group_artifact = coordinate.rsplit(":", 1)[0]
    builder = builder.config("spark.jars.packages", f"{group_artifact}:{delta_jar_version()}")
    for key, value in (confs or {}).items():
        builder = builder.config(key, value)
    with _output_to(jvm_log) if jvm_log is not None else contextlib.nullcontext():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
