"""Every stateful operator heapstate serves, run end to end on heapstate and on Spark's HDFS
provider, with a restart in the middle of the stream.

Each test asserts three things:

- heapstate's micro-batches equal the HDFS provider's, batch by batch (``run_on_both_providers``);
- the output is exactly what the operator's semantics give for the input, written out below;
- some row after the restart can only come from state restored from the checkpoint.

Event times are whole minutes after 2024-01-01 (column ``t``), watermarks are 10 minutes, and
the data keeps clear of ties with the watermark so that no result hangs on a ``<`` versus ``<=``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import (
    EPOCH_2024,
    Build,
    Rows,
    Source,
    event_time,
    minutes,
    offset_log_metadata,
    run_on_both_providers,
    session_confs,
)
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState

# The Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

WATERMARK = "10 minutes"


def with_event_time(df: DataFrame, column: str = "t", name: str = "ts") -> DataFrame:
    return df.withColumn(name, F.expr(event_time(column))).withWatermark(name, WATERMARK)


def rows_of(batches: Sequence[Sequence[tuple[Any, ...]]]) -> list[list[dict[str, Any]]]:
    return [[dict(zip(("k", "v", "t"), r, strict=False)) for r in b] for b in batches]


# --------------------------------------------------------------------------------------------
# Streaming aggregation


AGG_BATCHES = [
    [("a", 1), ("b", 2), ("a", 3)],
    [("a", 4), ("c", 5)],
    [("b", 6)],
    [("a", 7), ("c", 8)],  # first batch after the restart
    [("d", 9)],
    [("a", 10), ("b", 11)],
]


def aggregation_model(
    batches: Sequence[Sequence[tuple[str, int]]], complete: bool = False
) -> list[tuple[int, Rows]]:
    """Update mode: each batch emits the running count and sum of the keys it touched.

    Complete mode (``complete=True``): each batch emits those of every key seen so far."""
    count: dict[str, int] = {}
    total: dict[str, int] = {}
    out = []
    for batch_id, batch in enumerate(batches):
        for k, v in batch:
            count[k] = count.get(k, 0) + 1
            total[k] = total.get(k, 0) + v
        emitted = count.keys() if complete else {k for k, _ in batch}
        out.append((batch_id, sorted((k, count[k], total[k]) for k in emitted)))
    return out


def build_aggregation(s: Mapping[str, DataFrame]) -> DataFrame:
    return s["in"].groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))


def test_streaming_aggregation_update_mode(spark: SparkSession, tmp_path: Path) -> None:
    source = Source("k STRING, v INT", rows_of(AGG_BATCHES))
    run = run_on_both_providers(spark, tmp_path, {"in": source}, build_aggregation, "update")

    assert run.batches == aggregation_model(AGG_BATCHES)
    # Restored state: 'a' counts its three rows from before the restart.
    assert ("a", 4, 15) in run.rows_after_restart()


def test_streaming_aggregation_complete_mode(spark: SparkSession, tmp_path: Path) -> None:
    # Complete mode commits the batch's updates (heapstate writes them in place) and then emits
    # every key's row from the store's iterator: rows read after the commit, from its pages.
    source = Source("k STRING, v INT", rows_of(AGG_BATCHES))
    run = run_on_both_providers(spark, tmp_path, {"in": source}, build_aggregation, "complete")

    assert run.batches == aggregation_model(AGG_BATCHES, complete=True)
    # Restored state: 'b' is emitted after the restart from its rows before it alone.
    assert ("b", 2, 8) in run.rows_after_restart()


CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
LOCAL_COPY_DIR = "spark.sql.streaming.stateStore.heapstate.localCopyDir"
FILE_CONTEXT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)


@pytest.mark.parametrize("copy_dir", ["spark", "given"])
def test_streaming_aggregation_off_the_local_disk(
    spark: SparkSession, tmp_path: Path, copy_dir: str
) -> None:
    # A checkpoint manager named: heapstate takes the directory for one off the local disk (HDFS,
    # an object store), writes each snapshot's bytes to a local copy too, copies unchanged
    # buckets from that copy, and after the restart copies its snapshot to the local disk and
    # maps it there. Spark's FileContext-based manager is its default for HDFS and object stores.
    # The copies go under Spark's local directories, or under the roots localCopyDir names,
    # which the stores take in turn and the first store to need one makes. The first store to
    # make its directory under a root deletes the directories there that a killed JVM left:
    # those whose .owner no process holds a lock on.
    source = Source("k STRING, v INT", rows_of(AGG_BATCHES))
    copies, swept = tmp_path / "copies", tmp_path / "swept"
    confs = {CHECKPOINT_MANAGER: FILE_CONTEXT_MANAGER}
    killed, older = swept / "heapstate-op0-p0-killed", swept / "heapstate-op0-p1-older"
    if copy_dir == "given":
        confs[LOCAL_COPY_DIR] = f"{copies},{swept}"
        for d in (killed, older):
            d.mkdir(parents=True)
            (d / "3.hs-snapshot").write_bytes(b"a copy")
        (killed / ".owner").touch()  # older has none, as an earlier heapstate made
    with session_confs(spark, confs):
        run = run_on_both_providers(spark, tmp_path, {"in": source}, build_aggregation, "update")

    assert run.batches == aggregation_model(AGG_BATCHES)
    assert ("a", 4, 15) in run.rows_after_restart()
    snapshots = sorted(p.name for p in run.checkpoint.glob("state/0/*/*.hs-snapshot"))
    assert snapshots, "no snapshot was written: the restart read journals alone"
    assert copies.is_dir() == (copy_dir == "given"), "localCopyDir was not made, or made unasked"
    if copy_dir == "given":
        assert not killed.exists(), "the copies a killed JVM left stayed"
        assert (older / "3.hs-snapshot").is_file()


AGG_STATE_FORMAT = "spark.sql.streaming.aggregation.stateFormatVersion"


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_streaming_aggregation_state_format_1(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    # Spark's legacy state format 1 stores the whole output row as the value, and complete mode
    # emits the store's rows themselves (format 2 builds a new row from key and value).
    source = Source("k STRING, v INT", rows_of(AGG_BATCHES))
    with session_confs(spark, {AGG_STATE_FORMAT: "1"}):
        run = run_on_both_providers(spark, tmp_path, {"in": source}, build_aggregation, mode)

    assert offset_log_metadata(run.checkpoint, 0)["conf"][AGG_STATE_FORMAT] == "1"
    assert run.batches == aggregation_model(AGG_BATCHES, complete=mode == "complete")
    assert ("a", 4, 15) in run.rows_after_restart()


WINDOW_BATCHES = [
    [("a", 1, 0), ("a", 2, 3), ("b", 3, 5)],
    [("a", 4, 12), ("b", 5, 14)],
    [("a", 6, 25)],  # the watermark moves to 15: window [0, 10) closes
    [("a", 7, 18), ("c", 8, 27)],  # after the restart: 18 is not late, [10, 20) is still open
    [("a", 9, 41)],  # the watermark moves to 31: [10, 20) and [20, 30) close
    [("b", 10, 62)],  # the watermark moves to 52: [40, 50) closes
]


def build_windowed_aggregation(s: Mapping[str, DataFrame]) -> DataFrame:
    return (
        with_event_time(s["in"])
        .groupBy(F.window("ts", "10 minutes").alias("w"), "k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .select(
            "k",
            F.expr(minutes("w.start")).alias("start"),
            F.expr(minutes("w.end")).alias("end"),
            "n",
            "total",
        )
    )


def test_windowed_aggregation_append_mode(spark: SparkSession, tmp_path: Path) -> None:
    # Append mode emits a window's row from the store once the watermark passes its end, and
    # removes it, before the store commits.
    source = Source("k STRING, v INT, t INT", rows_of(WINDOW_BATCHES))
    run = run_on_both_providers(
        spark, tmp_path, {"in": source}, build_windowed_aggregation, "append"
    )

    # A batch evicts with the watermark of the batches before it (max event time - 10); each
    # run ends with a batch of no data that evicts with the watermark its last batch set.
    assert run.batches == [
        (0, []),
        (1, []),
        (2, []),
        (3, [("a", 0, 10, 2, 3), ("b", 0, 10, 1, 3)]),
        (4, []),
        (5, []),
        (6, [("a", 10, 20, 2, 11), ("a", 20, 30, 1, 6), ("b", 10, 20, 1, 5), ("c", 20, 30, 1, 8)]),
        (7, [("a", 40, 50, 1, 9)]),
    ]
    # Restored state: 'a' in [10, 20) counts its row from before the restart.
    assert ("a", 10, 20, 2, 11) in run.rows_after_restart()


# --------------------------------------------------------------------------------------------
# dropDuplicates


DEDUP_BATCHES = [
    [("a", 1), ("b", 2)],
    [("a", 3), ("c", 4)],
    [("d", 5)],
    [("a", 6), ("e", 7), ("b", 8)],  # after the restart: a and b were seen before it
    [("f", 9), ("c", 10)],
    [("g", 11), ("e", 12)],
]


def build_drop_duplicates(s: Mapping[str, DataFrame]) -> DataFrame:
    return s["in"].dropDuplicates(["k"]).select("k", "v")


def test_drop_duplicates(spark: SparkSession, tmp_path: Path) -> None:
    source = Source("k STRING, v INT", rows_of(DEDUP_BATCHES))
    run = run_on_both_providers(spark, tmp_path, {"in": source}, build_drop_duplicates, "append")

    assert run.batches == [
        (0, [("a", 1), ("b", 2)]),
        (1, [("c", 4)]),
        (2, [("d", 5)]),
        (3, [("e", 7)]),
        (4, [("f", 9)]),
        (5, [("g", 11)]),
    ]


# --------------------------------------------------------------------------------------------
# dropDuplicatesWithinWatermark


def test_drop_duplicates_within_watermark(spark: SparkSession, tmp_path: Path) -> None:
    batches = [
        [("x", 1, 0), ("y", 2, 1)],
        [("x", 3, 2), ("z", 4, 3)],
        [("y", 5, 5)],
        # After the restart. x (first seen at t=0, so kept until the watermark passes 10) is
        # still a duplicate here: the restored watermark is 5 - 10 = -5.
        [("x", 6, 30), ("w", 7, 31)],
        # The watermark is now 20: x's entry is expired but evicted only after this batch.
        [("x", 8, 45)],
        [("x", 9, 46), ("w", 10, 50)],
    ]
    source = Source("k STRING, v INT, t INT", rows_of(batches))

    def build(s: Mapping[str, DataFrame]) -> DataFrame:
        return with_event_time(s["in"]).dropDuplicatesWithinWatermark(["k"]).select("k", "v", "t")

    run = run_on_both_providers(spark, tmp_path, {"in": source}, build, "append")

    # Each run ends with a no-data batch (3 and 7) that moves the watermark and evicts.
    assert run.batches == [
        (0, [("x", 1, 0), ("y", 2, 1)]),
        (1, [("z", 4, 3)]),
        (2, []),
        (3, []),
        (4, [("w", 7, 31)]),
        (5, []),
        (6, [("x", 9, 46)]),
        (7, []),
    ]


# --------------------------------------------------------------------------------------------
# Session window


SESSION_BATCHES = [
    [("a", 1, 0), ("b", 1, 1)],
    [("a", 1, 3)],
    [("a", 1, 6), ("b", 1, 17)],  # the watermark moves to 7: b's session [1, 6) closes
    [("a", 1, 9)],  # after the restart: extends a's open session [0, 11) to [0, 14)
    [("a", 1, 40), ("b", 1, 41)],
    [("a", 1, 60)],
]


def build_session_window(s: Mapping[str, DataFrame]) -> DataFrame:
    return (
        with_event_time(s["in"])
        .groupBy(F.session_window("ts", "5 minutes").alias("w"), "k")
        .agg(F.count("*").alias("n"))
        .select(
            "k",
            F.expr(minutes("w.start")).alias("start"),
            F.expr(minutes("w.end")).alias("end"),
            "n",
        )
    )


def test_session_window_append_mode(spark: SparkSession, tmp_path: Path) -> None:
    source = Source("k STRING, v INT, t INT", rows_of(SESSION_BATCHES))
    run = run_on_both_providers(spark, tmp_path, {"in": source}, build_session_window, "append")

    # Sessions close once the watermark (max event time - 10) passes their end: b's first one
    # in the no-data batch 3 that ends the first run (watermark 7), a's [0, 14) after the
    # restart, at watermark 31.
    assert run.batches == [
        (0, []),
        (1, []),
        (2, []),
        (3, [("b", 1, 6, 1)]),
        (4, []),
        (5, []),
        (6, [("a", 0, 14, 4), ("b", 17, 22, 1)]),  # a: three events before the restart
        (7, [("a", 40, 45, 1), ("b", 41, 46, 1)]),
    ]


# --------------------------------------------------------------------------------------------
# Stream-stream joins


JOIN_LEFT = [[("a", 0), ("b", 1)], [("c", 2)], [("d", 4)], [("e", 20)], [("f", 30)], [("g", 50)]]
JOIN_RIGHT = [[("a", 2)], [("x", 3)], [("y", 6)], [("c", 5), ("e", 22)], [("f", 33)], [("z", 55)]]


def join_sources() -> dict[str, Source]:
    return {
        "left": Source("k STRING, lt INT", [[{"k": k, "lt": t} for k, t in b] for b in JOIN_LEFT]),
        "right": Source(
            "k STRING, rt INT", [[{"k": k, "rt": t} for k, t in b] for b in JOIN_RIGHT]
        ),
    }


def build_join(how: str) -> Build:
    def build(s: Mapping[str, DataFrame]) -> DataFrame:
        left = with_event_time(s["left"], "lt", "lts").alias("l")
        right = with_event_time(s["right"], "rt", "rts").alias("r")
        cond = F.expr("l.k = r.k AND r.rts BETWEEN l.lts AND l.lts + INTERVAL 5 MINUTES")
        return left.join(right, cond, how).select(F.col("l.k").alias("k"), "l.lt", "r.rt")

    return build


def test_stream_stream_inner_join(spark: SparkSession, tmp_path: Path) -> None:
    run = run_on_both_providers(
        spark, tmp_path, join_sources(), build_join("inner"), "append", stores_per_partition=4
    )

    # Batch 3 is the no-data batch that ends the first run; c's left row is from batch 1.
    assert run.batches == [
        (0, [("a", 0, 2)]),
        (1, []),
        (2, []),
        (3, []),
        (4, [("c", 2, 5), ("e", 20, 22)]),
        (5, [("f", 30, 33)]),
        (6, []),
        (7, []),
    ]


def test_stream_stream_left_outer_join(spark: SparkSession, tmp_path: Path) -> None:
    run = run_on_both_providers(
        spark, tmp_path, join_sources(), build_join("left_outer"), "append", stores_per_partition=4
    )

    # The unmatched left rows from before the restart (b at 1, d at 4) are null-padded only
    # after it, when the restored state meets a watermark (min over both sides of max - 10)
    # of 10, past lt + 5.
    assert run.batches == [
        (0, [("a", 0, 2)]),
        (1, []),
        (2, []),
        (3, []),
        (4, [("c", 2, 5), ("e", 20, 22)]),
        (5, [("b", 1, None), ("d", 4, None), ("f", 30, 33)]),
        (6, []),
        (7, []),
    ]


# --------------------------------------------------------------------------------------------
# applyInPandasWithState (PySpark's flatMapGroupsWithState)


def _epoch_ms(t_minutes: int) -> int:
    return (EPOCH_2024 + t_minutes * 60) * 1000


TIMEOUT_AFTER_MIN = 15


def count_until_timeout(
    key: tuple[str], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """Running count per key; emits it again with status 'timeout' when the key goes quiet for
    15 minutes of event time, and forgets the key."""
    if state.hasTimedOut:
        n, _ = state.get
        state.remove()
        yield pd.DataFrame({"k": [key[0]], "n": [n], "status": ["timeout"]})
        return
    n, latest = state.get if state.exists else (0, -(10**9))
    for pdf in pdfs:
        n += len(pdf)
        latest = max(latest, int(pdf["t"].max()))
    state.update((n, latest))
    state.setTimeoutTimestamp(_epoch_ms(latest + TIMEOUT_AFTER_MIN))
    yield pd.DataFrame({"k": [key[0]], "n": [n], "status": ["update"]})


TIMEOUT_BATCHES = [
    [("a", 1, 0), ("a", 1, 1), ("b", 1, 2)],
    [("a", 1, 3)],
    [("c", 1, 4)],
    [("a", 1, 20)],  # after the restart
    [("c", 1, 40)],
    [("d", 1, 50)],
]


# Timeouts fire once the watermark (max event time - 10) passes latest + 15: batch 6 runs at
# watermark 30 (b: 2 + 15 = 17), batch 7 at 40 (a: 20 + 15 = 35).
TIMEOUT_EXPECTED = [
    (0, [("a", 2, "update"), ("b", 1, "update")]),
    (1, [("a", 3, "update")]),
    (2, [("c", 1, "update")]),
    (3, []),  # the no-data batch that ends the first run: nothing is due yet
    (4, [("a", 4, "update")]),
    (5, [("c", 2, "update")]),
    (6, [("b", 1, "timeout"), ("d", 1, "update")]),
    (7, [("a", 4, "timeout")]),  # a's count includes its three rows from before the restart
]


def build_count_until_timeout(s: Mapping[str, DataFrame]) -> DataFrame:
    return (
        with_event_time(s["in"])
        .groupBy("k")
        .applyInPandasWithState(
            count_until_timeout,
            "k STRING, n LONG, status STRING",
            "n LONG, latest LONG",
            "Update",
            "EventTimeTimeout",
        )
    )


def test_apply_in_pandas_with_state_update_mode_event_time_timeout(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The flatMapGroupsWithState-style test: update mode with an event-time state timeout."""
    source = Source("k STRING, v INT, t INT", rows_of(TIMEOUT_BATCHES))
    run = run_on_both_providers(
        spark, tmp_path, {"in": source}, build_count_until_timeout, "update"
    )

    assert run.batches == TIMEOUT_EXPECTED


FMGWS_STATE_FORMAT = "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion"
# Spark's check of the value rows a provider loads. Format 1's value schema declares the timeout
# timestamp an integer while the rows hold a long, so with a timeout set the check fails every
# reload of a format-1 store, on the HDFS provider too ("Fixed-length field validation error:
# field: StructField(timeoutTimestamp,IntegerType,true)"). The format-1 run turns it off, on both
# providers alike.
FORMAT_VALIDATION = "spark.sql.streaming.stateStore.formatValidation.enabled"


def test_apply_in_pandas_with_state_state_format_1(spark: SparkSession, tmp_path: Path) -> None:
    """The event-time timeout query on Spark's legacy state format 1, which stores the state's
    fields and the timeout timestamp as the value row's own columns (format 2 nests the state in
    a ``groupState`` struct)."""
    source = Source("k STRING, v INT, t INT", rows_of(TIMEOUT_BATCHES))
    with session_confs(spark, {FMGWS_STATE_FORMAT: "1", FORMAT_VALIDATION: "false"}):
        run = run_on_both_providers(
            spark, tmp_path, {"in": source}, build_count_until_timeout, "update"
        )

    assert offset_log_metadata(run.checkpoint, 0)["conf"][FMGWS_STATE_FORMAT] == "1"
    schema = (run.checkpoint / "state" / "0" / "0" / "_metadata" / "schema").read_bytes()
    assert b'"groupState"' not in schema and b'"timeoutTimestamp"' in schema, schema
    assert run.batches == TIMEOUT_EXPECTED


MILESTONE = 3


def milestones(
    key: tuple[str], pdfs: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """Emits (k, m) once for each multiple m of 3 that the key's row count reaches."""
    before = state.get[0] if state.exists else 0
    n = before + sum(len(pdf) for pdf in pdfs)
    state.update((n,))
    hits = list(range((before // MILESTONE + 1) * MILESTONE, n + 1, MILESTONE))
    yield pd.DataFrame({"k": [key[0]] * len(hits), "milestone": hits})


def test_apply_in_pandas_with_state_append_mode(spark: SparkSession, tmp_path: Path) -> None:
    batches = [
        [("a", 1), ("a", 2), ("b", 3)],
        [("a", 4), ("b", 5)],
        [("c", 6)],
        [("a", 7), ("b", 8)],  # after the restart: b reaches 3 with its two earlier rows
        [("c", 9), ("c", 10)],
        [("a", 11), ("a", 12), ("a", 13)],
    ]
    source = Source("k STRING, v INT", rows_of(batches))

    def build(s: Mapping[str, DataFrame]) -> DataFrame:
        return (
            s["in"]
            .groupBy("k")
            .applyInPandasWithState(
                milestones, "k STRING, milestone LONG", "n LONG", "Append", "NoTimeout"
            )
        )

    run = run_on_both_providers(spark, tmp_path, {"in": source}, build, "append")

    assert run.batches == [
        (0, []),
        (1, [("a", 3)]),
        (2, []),
        (3, [("b", 3)]),
        (4, [("c", 3)]),
        (5, [("a", 6)]),
    ]
