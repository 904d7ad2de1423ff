"""heapstate together with Delta Lake: ``configure`` and ``configure_spark_with_delta_pip`` in
either order, then a streaming query from a Delta table to a Delta table on heapstate.

pyspark has one JVM per process and the suite's session has no Delta jars, so each order runs
``delta_job.py`` in its own process. Spark fetches the Delta jars from Maven Central (or the
mirror named in ``~/.m2/settings.xml``) when that session starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import heapstate
import pytest
from conftest import (
    HEAPSTATE_PROVIDER,
    SHUFFLE_PARTITIONS,
    assert_checkpoint_written_by,
    committed_batches,
    job_submit_args,
)
from pyspark.sql import SparkSession

JOB = Path(__file__).with_name("delta_job.py")


def test_both_orders_give_the_same_jar_confs() -> None:
    # Imported here: .venv-spark43, which collects this file for its smoke run, has no Delta.
    from delta import configure_spark_with_delta_pip

    heap_first = configure_spark_with_delta_pip(heapstate.configure(SparkSession.builder))
    delta_first = heapstate.configure(configure_spark_with_delta_pip(SparkSession.builder))
    delta_only = configure_spark_with_delta_pip(SparkSession.builder)
    packages = delta_only._options["spark.jars.packages"]
    assert packages.startswith("io.delta:delta-spark_"), packages
    for builder in (heap_first, delta_first):
        assert {k: v for k, v in builder._options.items() if k.startswith("spark.jars")} == {
            "spark.jars": heapstate.jar_path(),
            "spark.jars.packages": packages,
        }


@pytest.mark.parametrize("order", ["heapstate-first", "delta-first"])
def test_delta_source_to_delta_sink_on_heapstate(order: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(JOB),
            "--order",
            order,
            "--workdir",
            str(tmp_path),
            "--partitions",
            str(SHUFFLE_PARTITIONS),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            # C1 only and the class archive: alone on 2 cores, the job took 40 s against 60.
            "PYSPARK_SUBMIT_ARGS": job_submit_args(),
            # delta-spark 4.4.1 (the pip package this suite pins) asks Spark for the 4.4.1 Delta
            # jar, which Maven Central does not carry; 4.4.0 is the newest one published there.
            "HEAPSTATE_DELTA_JAR_VERSION": os.environ.get("HEAPSTATE_DELTA_JAR_VERSION", "4.4.0"),
        },
    )
    if done.returncode != 0 and "unresolved dependency: io.delta#" in done.stderr:
        unresolved = done.stderr.split("unresolved dependency: ", 1)[1].split("]")[0]
        pytest.fail(
            f"Spark could not fetch the Delta jar that configure_spark_with_delta_pip asks for "
            f"({unresolved}): Maven Central (or the mirror) does not have it. Install a "
            "delta-spark version whose jar is published, or set HEAPSTATE_DELTA_JAR_VERSION to "
            "one."
        )
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert result["jarConfs"]["spark.jars"] == heapstate.jar_path()
    assert result["jarConfs"]["spark.jars.packages"].startswith("io.delta:delta-spark_")
    assert result["provider"] == HEAPSTATE_PROVIDER
    # k, count, sum(v) over FIRST_RUN, then with SECOND_RUN after the restart.
    assert result["first"] == [["a", 2, 4], ["b", 1, 2], ["c", 1, 4]]
    assert result["second"] == [["a", 2, 4], ["b", 2, 7], ["c", 1, 4], ["d", 1, 7]]

    checkpoint = tmp_path / "checkpoint"
    assert committed_batches(checkpoint) == [0, 1, 2]  # one batch per source commit
    assert heapstate.checkpoint_provider(checkpoint) == HEAPSTATE_PROVIDER
    stores = assert_checkpoint_written_by(checkpoint, HEAPSTATE_PROVIDER)
    assert len(stores) == SHUFFLE_PARTITIONS
    assert all(s.of("hs-journal") == {1, 2, 3} for s in stores)
