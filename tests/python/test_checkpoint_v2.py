"""Checkpoint format version 2 (``spark.sql.streaming.stateStore.checkpointFormatVersion=2``).

Spark's HDFS provider refuses format 2, so the reference is the HDFS provider on format 1: the
same pipeline, with a restart mid-stream, must give exactly the same micro-batches on heapstate
with format 2. Beyond the output, the checkpoint must show format 2 at work:

- every commit log entry carries, per operator, partition and store, the checkpoint id Spark
  kept, and that id names a journal of that version in the store's directory
  (``<version>_<id>_<baseId>.hs-journal``), whose base id is the id kept for the version before;
- the state read back through ``spark.read.format("statestore")`` (which passes those ids to
  the provider) equals the reference's state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from conftest import (
    HDFS_PROVIDER,
    HEAPSTATE_PROVIDER,
    SHUFFLE_PARTITIONS,
    Build,
    Source,
    committed_batches,
    run_with_restart,
    sorted_rows,
    state_store_dirs,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from test_operators import AGG_BATCHES, build_join, join_sources, rows_of

FORMAT_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
V2_JOURNAL = re.compile(r"^(\d+)_([0-9a-f-]+)(?:_([0-9a-f-]+))?\.hs-journal$")


@pytest.fixture
def format_v2(spark: SparkSession) -> Iterator[None]:
    spark.conf.set(FORMAT_CONF, "2")
    try:
        yield
    finally:
        spark.conf.unset(FORMAT_CONF)


def commit_ids(checkpoint: Path, batch: int) -> dict[str, list[list[str]]]:
    """``stateUniqueIds`` of ``commits/<batch>``: operator -> partition -> store -> id."""
    lines = (checkpoint / "commits" / str(batch)).read_text().splitlines()
    meta = json.loads(lines[1])
    ids = meta.get("stateUniqueIds")
    assert ids, f"commits/{batch} of {checkpoint} has no checkpoint ids: {lines[1]}"
    return {str(op): parts for op, parts in ids.items()}


def assert_lineage_recorded(checkpoint: Path, stores_per_partition: int) -> None:
    """Every committed version's kept id names a journal whose base is the previous kept id."""
    batches = committed_batches(checkpoint)
    assert batches
    dirs = state_store_dirs(checkpoint)
    assert len(dirs) == SHUFFLE_PARTITIONS * stores_per_partition, dirs
    checked = 0
    previous: dict[Path, str | None] = {d: None for d in dirs}
    for batch in batches:
        version = batch + 1
        ids = commit_ids(checkpoint, batch)
        assert list(ids) == ["0"], f"one stateful operator expected: {list(ids)}"
        for d in dirs:
            partition = int(d.name) if d.name.isdigit() else int(d.parent.name)
            stores = ids["0"][partition]
            assert len(stores) == stores_per_partition, stores
            journals = {}
            for p in d.iterdir():
                m = V2_JOURNAL.match(p.name)
                if m and int(m.group(1)) == version:
                    journals[m.group(2)] = m.group(3)
            kept = [i for i in stores if i in journals]
            assert len(kept) == 1, (
                f"{d}: version {version} journals {journals}, commit ids {stores}"
            )
            assert journals[kept[0]] == previous[d], (
                f"{d}: version {version} ({kept[0]}) sits on {journals[kept[0]]}, "
                f"but the commit log kept {previous[d]} for version {version - 1}"
            )
            previous[d] = kept[0]
            checked += 1
    assert checked == len(batches) * len(dirs)


def read_state(spark: SparkSession, checkpoint: Path, store: str | None = None) -> list:
    reader = spark.read.format("statestore")
    if store:
        reader = reader.option("storeName", store)
    df = reader.load(str(checkpoint))
    return sorted_rows(df.select("key", "value", "partition_id").collect())


def run_both(
    spark: SparkSession,
    tmp_path: Path,
    sources: Mapping[str, Source],
    build: Build,
    output_mode: str,
    request: pytest.FixtureRequest,
    stores: tuple[str | None, ...] = (None,),
) -> tuple[dict[str | None, list], Path]:
    """Runs the HDFS reference on format 1, then heapstate on format 2; returns the reference's
    final state per store (read while the session is still on format 1, which the HDFS
    provider needs) and heapstate's checkpoint."""
    hdfs = run_with_restart(spark, tmp_path / "hdfs", HDFS_PROVIDER, sources, build, output_mode)
    reference = {store: read_state(spark, hdfs.checkpoint, store) for store in stores}
    assert all(reference.values()), f"a reference store is empty: {reference}"
    request.getfixturevalue("format_v2")
    heap = run_with_restart(
        spark, tmp_path / "heapstate", HEAPSTATE_PROVIDER, sources, build, output_mode
    )
    assert any(rows for _, rows in hdfs.second_run), "no output after the restart"
    assert heap.first_run == hdfs.first_run
    assert heap.second_run == hdfs.second_run
    return reference, heap.checkpoint


def test_format_v2_aggregation_with_restart(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    def build(s: Mapping[str, DataFrame]) -> DataFrame:
        return s["in"].groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))

    source = Source("k STRING, v INT", rows_of(AGG_BATCHES))
    reference, heap = run_both(spark, tmp_path, {"in": source}, build, "update", request)
    assert_lineage_recorded(heap, stores_per_partition=1)
    assert read_state(spark, heap) == reference[None]


def test_format_v2_stream_stream_join_with_restart(
    spark: SparkSession, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    stores = ("left-keyToNumValues", "right-keyWithIndexToValue")
    reference, heap = run_both(
        spark, tmp_path, join_sources(), build_join("inner"), "append", request, stores
    )
    assert_lineage_recorded(heap, stores_per_partition=4)
    for store in stores:
        assert read_state(spark, heap, store) == reference[store], store
