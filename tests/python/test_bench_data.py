"""The data W1, W5 and the soak benchmark run on (``bench/w1.py``): written with pyarrow since
stop 61, it must hold exactly what Spark's ``sha2`` expression, which wrote it before, gives, so
that the data sets cached under ``bench/results/data/`` and the new ones are the same."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import w1  # bench/ is a folder of scripts, put on the path above


def spark_payload(batch: int, width: int) -> Column:
    """The payload as Spark computed it until stop 61: sha2 of ``k:batch``, then of
    ``k:batch:j`` for j = 1, 2, ..., concatenated and cut to ``width`` characters."""
    k = F.col("k").cast("string")
    pieces = [F.sha2(F.concat(k, F.lit(f":{batch}")), 256)]
    pieces += [
        F.sha2(F.concat(k, F.lit(f":{batch}:{j}")), 256) for j in range(1, math.ceil(width / 64))
    ]
    return F.substring(F.concat(*pieces), 1, width)


@pytest.mark.parametrize("width", [1, 64, 65, 100, 256])
def test_payload_is_sparks_sha2_expression(spark: SparkSession, width: int) -> None:
    rows = spark.range(0, 2_000).withColumnRenamed("id", "k").select("k", spark_payload(3, width))
    expected = {r[0]: r[1] for r in rows.collect()}
    assert {k: w1.payload(k, 3, width) for k in range(2_000)} == expected


def test_generated_files_hold_the_keys_and_payloads(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(w1, "GENERATE_CHUNK", 256)  # batch 0 in three row groups
    spec = {"data_dir": str(tmp_path), "files": 3, "keys": 700, "payload": 100, "updates": 90}
    w1.worker_generate({**spec, "seed": 42})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"batch-{b:05d}.parquet" for b in range(3)
    ]
    for batch in range(3):
        frame = spark.read.schema("k long, v string").parquet(
            str(tmp_path / f"batch-{batch:05d}.parquet")
        )
        rows = frame.select("k", "v", spark_payload(batch, 100).alias("s")).collect()
        keys = list(range(700)) if batch == 0 else w1.update_keys(700, 90, 42, batch)
        assert [r["k"] for r in rows] == keys, f"batch {batch}"
        assert all(r["v"] == r["s"] for r in rows), f"batch {batch}"
