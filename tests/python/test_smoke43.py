"""The smoke run bin/test repeats under pyspark 4.3.0 (``.venv-spark43``, no Delta there).

The jar is compiled against Spark 4.3.0 and must serve 4.3 as well as 4.2: one streaming
aggregation with a restart, equal to the HDFS provider's output and to the expected counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from conftest import Source, run_on_both_providers
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

BATCHES = [
    [{"k": "a"}, {"k": "b"}],
    [{"k": "a"}],
    [{"k": "c"}],
    [{"k": "a"}, {"k": "c"}],  # after the restart
]


@pytest.mark.smoke43
def test_aggregation_with_restart(spark: SparkSession, tmp_path: Path) -> None:
    def build(s: Mapping[str, DataFrame]) -> DataFrame:
        return s["in"].groupBy("k").agg(F.count("*").alias("n"))

    run = run_on_both_providers(
        spark, tmp_path, {"in": Source("k STRING", BATCHES)}, build, "update"
    )

    assert run.batches == [
        (0, [("a", 1), ("b", 1)]),
        (1, [("a", 2)]),
        (2, [("c", 1)]),
        (3, [("a", 3), ("c", 2)]),  # counts restored from the checkpoint
    ], f"on Spark {spark.version}"
