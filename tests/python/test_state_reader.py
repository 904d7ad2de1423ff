"""Spark's state data source (``spark.read.format("statestore")``) reading a heapstate checkpoint.

A windowed streaming aggregation (update mode, 5-minute watermark) runs over six files, one
micro-batch each; closed windows are evicted, so the state sees both updates and deletes. A model
in this file replays the same input and gives the state after every batch and the changes of
every batch. The data source must return exactly those, in each of its modes:

- the state at the last batch and at every earlier ``batchId``;
- the change feed (``readChangeFeed``, ``changeStartBatchId``, ``changeEndBatchId``);
- the state rebuilt from a snapshot (``snapshotStartBatchId`` with ``snapshotPartitionId``).
  ``snapshotStartBatchId`` names the batch whose committed version (batch id + 1) has a
  snapshot file; the reader starts there and replays journals up to ``batchId``.

The same test runs on the HDFS provider, which proves the model and the expectations right.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    HDFS_PROVIDER,
    PROVIDER_CONF,
    PROVIDERS,
    SHUFFLE_PARTITIONS,
    assert_checkpoint_written_by,
    committed_batches,
    copy_checkpoint,
    event_time,
    minutes,
    plain,
    read_stream,
    sorted_rows,
    store_files,
    write_input_file,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

WINDOW_MIN = 10
DELAY_MIN = 5
WAIT_S = 120

# (k, t): key and event time in minutes after 2024-01-01. No row is late, and no window end
# ever equals a watermark, so eviction never hangs on a tie.
BATCHES: list[list[tuple[str, int]]] = [
    [("a", 1), ("b", 2), ("a", 4), ("c", 12)],
    [("a", 8), ("b", 15), ("c", 13)],
    [("d", 21), ("a", 24)],
    [("b", 26), ("c", 33)],  # watermark 19: windows [0, 10) go
    [("a", 41)],  # watermark 28: windows [10, 20) go
    [("b", 44), ("e", 52)],  # watermark 36: windows [20, 30) go
]  # then a no-data batch at watermark 47 evicts [30, 40)

Key = tuple[str, int, int]  # k, window start, window end (minutes)


@dataclass
class Model:
    states: list[dict[Key, int]]
    """The state after each batch, no-data batches included."""
    changes: list[tuple[int, str, Key, int | None]]
    """(batch id, 'update' or 'delete', key, new count or None)."""


def aggregation_model(batches: Sequence[Sequence[tuple[str, int]]]) -> Model:
    """Replay Spark's windowed update-mode aggregation with watermark eviction.

    Batch b evicts, after its updates, the windows whose end is at or below the watermark that
    the batches before b set (max event time - delay). When the last data batch leaves the
    watermark ahead of the one it ran with, Spark runs one more batch, without data, to evict.
    """
    state: dict[Key, int] = {}
    model = Model([], [])
    max_t: int | None = None

    def watermark() -> float:
        return float("-inf") if max_t is None else max_t - DELAY_MIN

    def run_batch(batch_id: int, rows: Sequence[tuple[str, int]]) -> None:
        wm = watermark()
        touched: set[Key] = set()
        for k, t in rows:
            assert t > wm, f"test data error: row {(k, t)} of batch {batch_id} is late"
            start = t // WINDOW_MIN * WINDOW_MIN
            key = (k, start, start + WINDOW_MIN)
            state[key] = state.get(key, 0) + 1
            touched.add(key)
        model.changes.extend((batch_id, "update", key, state[key]) for key in touched)
        for key in [key for key in state if key[2] <= wm]:
            del state[key]
            model.changes.append((batch_id, "delete", key, None))
        model.states.append(dict(state))

    used_wm = watermark()
    for batch_id, rows in enumerate(batches):
        used_wm = watermark()
        run_batch(batch_id, rows)
        max_t = max([t for _, t in rows] + ([] if max_t is None else [max_t]))
    if watermark() > used_wm:
        run_batch(len(batches), [])
    return model


def build_query(spark: SparkSession, source: Path) -> DataFrame:
    events = read_stream(spark, source, "k STRING, t INT")
    return (
        events.withColumn("ts", F.expr(event_time("t")))
        .withWatermark("ts", f"{DELAY_MIN} minutes")
        .groupBy(F.window("ts", f"{WINDOW_MIN} minutes"), "k")
        .count()
    )


def snapshot_versions(checkpoint: Path, provider: str, partition: int = 0) -> list[int]:
    kind = "snapshot" if provider == HDFS_PROVIDER else "hs-snapshot"
    return sorted(store_files(checkpoint / "state" / "0" / str(partition)).of(kind))


def run_until_snapshot(
    spark: SparkSession, provider: str, source: Path, checkpoint: Path, batches: int
) -> None:
    """Run the query until it has committed ``batches`` batches and the maintenance thread has
    written a snapshot for partition 0, then stop it.

    The query keeps running (processing-time trigger) while waiting, because the maintenance
    thread only snapshots stores that are loaded. Waiting ends on the condition, not a clock;
    the deadline only turns a provider that never snapshots into a failure.
    """
    spark.conf.set(PROVIDER_CONF, provider)
    query = (
        build_query(spark, source)
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            committed = committed_batches(checkpoint)
            if len(committed) >= batches and snapshot_versions(checkpoint, provider):
                return
            assert time.monotonic() < deadline, (
                f"after {WAIT_S}s, {provider} has committed batches {committed} "
                f"(expected {batches}) and partition 0 snapshots "
                f"{snapshot_versions(checkpoint, provider)}"
            )
            query.awaitTermination(0.5)  # raises at once if the query failed
    finally:
        query.stop()


def partitions_of(spark: SparkSession, keys: Iterable[Key]) -> dict[Key, int]:
    """The shuffle partition of each aggregation key, by Spark's own hash partitioning formula
    (``pmod(murmur3(window, k), n)``), evaluated by Spark."""
    df = spark.createDataFrame(sorted(set(keys)), "k STRING, s INT, e INT")
    part = (
        f"pmod(hash(named_struct('start', {event_time('s')}, 'end', {event_time('e')}), k), "
        f"{SHUFFLE_PARTITIONS})"
    )
    rows = df.select("k", "s", "e", F.expr(part).alias("p")).collect()
    return {(r.k, r.s, r.e): r.p for r in rows}


def key_columns() -> list[Any]:
    return [
        F.col("key.k").alias("k"),
        F.expr(minutes("key.window.start")).alias("start"),
        F.expr(minutes("key.window.end")).alias("end"),
    ]


def read_state(spark: SparkSession, checkpoint: Path, **options: Any) -> list[tuple[Any, ...]]:
    """(k, start, end, count, partition_id) rows of the state the data source returns."""
    reader = spark.read.format("statestore")
    for name, value in options.items():
        reader = reader.option(name, value)
    df = reader.load(str(checkpoint))
    rows = df.select(*key_columns(), "value", "partition_id").collect()
    return sorted_rows((r.k, r.start, r.end, plain(r.value)[0], r.partition_id) for r in rows)


def read_changes(spark: SparkSession, checkpoint: Path, **options: Any) -> list[tuple[Any, ...]]:
    """(batch_id, change_type, k, start, end, count or None, partition_id) rows of the feed."""
    reader = spark.read.format("statestore").option("readChangeFeed", True)
    for name, value in options.items():
        reader = reader.option(name, value)
    df = reader.load(str(checkpoint))
    rows = df.select("batch_id", "change_type", *key_columns(), "value", "partition_id").collect()
    return sorted_rows(
        (
            r.batch_id,
            r.change_type,
            r.k,
            r.start,
            r.end,
            None if r.value is None else plain(r.value)[0],
            r.partition_id,
        )
        for r in rows
    )


def expected_state(
    state: Mapping[Key, int], parts: Mapping[Key, int], partition: int | None = None
) -> list[tuple[Any, ...]]:
    return sorted_rows(
        (*key, count, parts[key])
        for key, count in state.items()
        if partition is None or parts[key] == partition
    )


@pytest.mark.parametrize("provider_name", ["heapstate", "hdfs"])
def test_state_data_source_reads_checkpoint(
    spark: SparkSession, tmp_path: Path, provider_name: str
) -> None:
    provider = PROVIDERS[provider_name]
    model = aggregation_model(BATCHES)
    source = tmp_path / "input"
    checkpoint = tmp_path / "checkpoint"
    for i, rows in enumerate(BATCHES):
        write_input_file(source, i, [{"k": k, "t": t} for k, t in rows])

    run_until_snapshot(spark, provider, source, checkpoint, len(model.states))
    last = len(model.states) - 1
    assert committed_batches(checkpoint) == list(range(last + 1))
    assert_checkpoint_written_by(checkpoint, provider)
    parts = partitions_of(spark, (key for s in model.states for key in s))
    assert set(parts.values()) == set(range(SHUFFLE_PARTITIONS)), "test data covers 1 partition"

    # The model's own sanity: deletes happen, and the final state is what the comments say.
    assert {ct for _, ct, _, _ in model.changes} == {"update", "delete"}
    assert model.states[-1] == {("a", 40, 50): 1, ("b", 40, 50): 1, ("e", 50, 60): 1}

    # State at the last batch, and at every earlier one.
    assert read_state(spark, checkpoint) == expected_state(model.states[last], parts)
    for batch_id, state in enumerate(model.states):
        assert read_state(spark, checkpoint, batchId=batch_id) == expected_state(state, parts), (
            f"state at batch {batch_id}"
        )

    # The change feed, whole and over a range.
    changes = [(b, ct, *key, value, parts[key]) for b, ct, key, value in model.changes]
    assert read_changes(spark, checkpoint, changeStartBatchId=0) == sorted_rows(changes)
    assert read_changes(spark, checkpoint, changeStartBatchId=3, changeEndBatchId=4) == sorted_rows(
        c for c in changes if 3 <= c[0] <= 4
    )

    # Partition 0's state rebuilt from each of its snapshots: at the snapshot's own batch, and
    # at the last batch (snapshot plus the journals after it).
    versions = snapshot_versions(checkpoint, provider)
    assert versions and all(1 <= v <= last + 1 for v in versions), versions
    for version in versions:
        snapshot_batch = version - 1
        for batch_id in sorted({snapshot_batch, last}):
            got = read_state(
                spark,
                checkpoint,
                snapshotStartBatchId=snapshot_batch,
                snapshotPartitionId=0,
                batchId=batch_id,
            )
            assert got == expected_state(model.states[batch_id], parts, partition=0), (
                f"partition 0 from the snapshot of version {version} up to batch {batch_id}"
            )

    # The snapshot really is the starting point: with partition 0's journals up to the first
    # snapshot gone (as retention would delete them), the read from that snapshot still works.
    pruned = copy_checkpoint(checkpoint, tmp_path / "pruned-checkpoint")
    first = versions[0]
    journal = "delta" if provider == HDFS_PROVIDER else "hs-journal"
    store = pruned / "state" / "0" / "0"
    for v in store_files(store).of(journal):
        if v <= first:
            (store / f"{v}.{journal}").unlink()
            (store / f".{v}.{journal}.crc").unlink(missing_ok=True)
    got = read_state(
        spark, pruned, snapshotStartBatchId=first - 1, snapshotPartitionId=0, batchId=last
    )
    assert got == expected_state(model.states[last], parts, partition=0)
