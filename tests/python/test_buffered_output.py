"""``heapstate.buffered``: the buffered-output operator and its drain helper, end to end.

Every test asserts the exact rows emitted. Two kinds of runs keep that deterministic:

- **Event time.** The clock is the watermark, which depends on the data alone: one input file per
  micro-batch, a 5-minute watermark delay and a 10-minute flush interval. Each expected batch
  below is worked out by hand from the rules of the module docstring: a buffer opens at the
  earliest event time of its opening rows (or the watermark, if later), is due 10 minutes after
  that, and is flushed in the first batch whose watermark is *past* the deadline.
- **Processing time.** The clock is the wall clock, so which micro-batch flushes a key depends
  on timing. These runs give every key rows in one micro-batch only, so each key's single
  emission is the same whatever the timing, and assert the union of all emitted rows: each key
  exactly once, with its latest value. Emissions of a batch that Spark re-runs after a stop are
  counted once (by batch id), as an idempotent sink would.

Event times are whole minutes after 2024-01-01 (column ``t``); ``seq`` gives the order of a
key's rows where the test needs one that differs from the file order.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import (
    HEAPSTATE_PROVIDER,
    PROVIDER_CONF,
    PROVIDERS,
    QUERY_TIMEOUT_S,
    Rows,
    Source,
    assert_checkpoint_written_by,
    event_time,
    offset_log_metadata,
    read_stream,
    run_with_restart,
    sorted_rows,
    write_input_file,
)
from heapstate.buffered import buffered_output, drain
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

# The Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEMA = "k STRING, v INT, seq INT, t INT"
DELAY = "5 minutes"
INTERVAL = "10 minutes"

Batches = Sequence[Sequence[tuple[str, int, int, int]]]  # (k, v, seq, t)


def as_rows(batches: Batches) -> list[list[dict[str, Any]]]:
    return [[dict(zip(("k", "v", "seq", "t"), r, strict=True)) for r in b] for b in batches]


def with_watermark(df: DataFrame) -> DataFrame:
    return df.withColumn("ts", F.expr(event_time("t"))).withWatermark("ts", DELAY)


# --------------------------------------------------------------------------------------------
# Running a query and collecting its micro-batches


class Run:
    """A started query whose ``foreachBatch`` sink records each batch's sorted rows by batch id.

    A batch that Spark runs again (it was interrupted before its commit) replaces its earlier
    record, as in an idempotent sink; ``reruns`` keeps both versions, to check they agree.
    """

    def __init__(
        self,
        spark: SparkSession,
        provider: str,
        build: Callable[[DataFrame], DataFrame],
        input_dir: Path,
        checkpoint: Path,
    ) -> None:
        self.batches: dict[int, Rows] = {}
        self.reruns: list[tuple[int, Rows, Rows]] = []
        spark.conf.set(PROVIDER_CONF, provider)

        def collect(df: DataFrame, batch_id: int) -> None:
            rows = sorted_rows(df.collect())
            if batch_id in self.batches:
                self.reruns.append((batch_id, self.batches[batch_id], rows))
            self.batches[batch_id] = rows

        self.query: StreamingQuery = (
            build(read_stream(spark, input_dir, SCHEMA))
            .writeStream.outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .foreachBatch(collect)
            .start()
        )

    def wait_until_finished(self) -> None:
        try:
            finished = self.query.awaitTermination(QUERY_TIMEOUT_S)
        finally:
            if self.query.isActive:
                self.query.stop()
        assert finished, f"the query did not finish within {QUERY_TIMEOUT_S}s"

    def wait_for_batch(self, batch_id: int) -> dict[str, Any]:
        """Wait until ``batch_id`` has completed and return its progress."""
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while time.monotonic() < deadline:
            for p in self.query.recentProgress:
                if p["batchId"] == batch_id:
                    return p
            assert not self.query.awaitTermination(0.2), f"query ended before batch {batch_id}"
        raise AssertionError(f"batch {batch_id} did not complete within {QUERY_TIMEOUT_S}s")

    def drain(self) -> int | None:
        try:
            return drain(self.query, timeout=QUERY_TIMEOUT_S, poll_interval=0.2)
        finally:
            if self.query.isActive:
                self.query.stop()

    def in_order(self) -> list[tuple[int, Rows]]:
        return sorted(self.batches.items())

    def all_rows(self) -> Rows:
        return sorted_rows([r for _, rows in self.in_order() for r in rows])


def write_batches(directory: Path, batches: Batches, start: int = 0) -> None:
    for i, rows in enumerate(as_rows(batches), start=start):
        write_input_file(directory, i, rows)


def assert_pins_provider(checkpoint: Path, provider: str) -> None:
    """Every offset log entry pins ``provider`` (used where a stopped query leaves an uncommitted
    batch, so ``assert_checkpoint_written_by``'s one-journal-per-commit rule does not apply)."""
    entries = sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    assert entries
    for b in entries:
        pinned = offset_log_metadata(checkpoint, b)["conf"].get(PROVIDER_CONF)
        assert pinned == provider, f"offsets/{b} of {checkpoint} pins {pinned}, not {provider}"


# --------------------------------------------------------------------------------------------
# Default semantics: the latest row per key, on event time


LATEST_BATCHES: Batches = [
    # watermark: none yet. a opens at t=0 (due 10), b at t=2 (due 12).
    [("a", 1, 1, 0), ("a", 2, 2, 1), ("b", 3, 3, 2)],
    # watermark -3. a's latest by seq is v=40, which the file lists first. c opens (due 16).
    [("a", 40, 5, 5), ("a", 4, 4, 5), ("c", 5, 6, 6)],
    [("b", 6, 7, 12)],  # watermark 1
    [("d", 7, 8, 18)],  # watermark 7: nothing due. d opens (due 28).
    # watermark 13: a is due (10) and flushes with its new rows, the latest by seq being v=80,
    # listed first; b times out (12).
    [("a", 80, 10, 19), ("a", 8, 9, 19)],
    [("e", 9, 11, 30)],  # watermark 14: c (16) not yet. e opens (due 40).
]  # then a no-data batch at watermark 25 times out c; d and e stay buffered


def test_latest_row_per_key_at_most_once_per_interval(spark: SparkSession, tmp_path: Path) -> None:
    write_batches(tmp_path / "in", LATEST_BATCHES)

    def build(df: DataFrame) -> DataFrame:
        out = buffered_output(
            with_watermark(df), "k", flush_interval=INTERVAL, event_time="ts", order_by="seq"
        )
        return out.drop("ts")

    run = Run(spark, HEAPSTATE_PROVIDER, build, tmp_path / "in", tmp_path / "chk")
    run.wait_until_finished()

    # a changed in batches 0, 1 and 4 and is emitted once; b changed in 0 and 2, emitted once.
    assert run.in_order() == [
        (0, []),
        (1, []),
        (2, []),
        (3, []),
        (4, [("a", 80, 10, 19), ("b", 6, 7, 12)]),
        (5, []),
        (6, [("c", 5, 6, 6)]),
    ]
    assert run.reruns == []
    assert_checkpoint_written_by(tmp_path / "chk", HEAPSTATE_PROVIDER)

    # The query ended by itself (event time under AvailableNow) with d and e buffered: drain
    # says so instead of pretending everything was flushed.
    with pytest.raises(RuntimeError, match=r"after batch 6 with 2 keys still buffered"):
        drain(run.query, timeout=10)


# --------------------------------------------------------------------------------------------
# reduce


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """A key's buffered rows as one row: count, sum of v and the seqs in buffer order."""
    return pd.DataFrame(
        {
            "k": [rows["k"].iloc[0]],
            "n": [len(rows)],
            "total": [int(rows["v"].sum())],
            "seqs": [",".join(str(s) for s in rows["seq"])],
        }
    )


REDUCE_BATCHES: Batches = [
    # a opens at its earliest event time t=0 (due 10) although the file lists t=1 first.
    [("a", 1, 1, 1), ("a", 2, 2, 0), ("b", 3, 3, 2)],  # b due 12
    [("a", 4, 4, 5), ("c", 5, 5, 6)],  # watermark -3; c due 16
    [("b", 6, 6, 12)],  # watermark 1
    [("a", 7, 7, 17)],  # watermark 7: a (10) not due, its buffer grows to four rows
    # watermark 12: a times out (10 < 12). b's deadline equals the watermark: not past it yet,
    # so b keeps buffering, with or without new rows. f due 30.
    [("b", 10, 10, 13), ("f", 8, 8, 20)],
    [("g", 9, 9, 40)],  # watermark 15: b times out (12); g due 50
]  # then a no-data batch at watermark 35 times out c (16) and f (30); g stays buffered


def test_reduce_gets_every_buffered_row_in_event_time_order(
    spark: SparkSession, tmp_path: Path
) -> None:
    write_batches(tmp_path / "in", REDUCE_BATCHES)

    def build(df: DataFrame) -> DataFrame:
        return buffered_output(
            with_watermark(df),
            "k",
            flush_interval=datetime.timedelta(minutes=10),
            event_time="ts",
            reduce=summarize,
            output_schema="k STRING, n LONG, total LONG, seqs STRING",
        )

    run = Run(spark, HEAPSTATE_PROVIDER, build, tmp_path / "in", tmp_path / "chk")
    run.wait_until_finished()

    assert run.in_order() == [
        (0, []),
        (1, []),
        (2, []),
        (3, []),
        (4, [("a", 4, 14, "2,1,4,7")]),
        (5, [("b", 3, 19, "3,6,10")]),
        (6, [("c", 1, 5, "5"), ("f", 1, 8, "8")]),
    ]
    assert_checkpoint_written_by(tmp_path / "chk", HEAPSTATE_PROVIDER)


# --------------------------------------------------------------------------------------------
# max_buffered


EARLY_BATCHES: Batches = [
    [("a", 1, 1, 0), ("a", 2, 2, 1), ("b", 3, 3, 2)],  # a: 2 rows (due 10), b: 1 (due 12)
    # a reaches 3 rows, and 6: one flush at the end of the batch, of the latest row.
    [("a", 4, 4, 3), ("a", 5, 5, 4), ("a", 6, 6, 5), ("a", 7, 7, 6)],
    # a opens again (due 17); b reaches 3 rows, long before its deadline.
    [("a", 8, 8, 7), ("b", 9, 9, 8), ("b", 10, 10, 9)],
    [("a", 11, 11, 10), ("a", 12, 12, 11)],  # a reaches 3 again
    [("c", 13, 13, 12)],  # watermark 6; c due 22
    [("d", 14, 14, 30)],  # watermark 7; d due 40
]  # then a no-data batch at watermark 25 times out c; d stays buffered


def test_max_buffered_flushes_a_key_early(spark: SparkSession, tmp_path: Path) -> None:
    write_batches(tmp_path / "in", EARLY_BATCHES)

    def build(df: DataFrame) -> DataFrame:
        out = buffered_output(
            with_watermark(df), "k", flush_interval=INTERVAL, event_time="ts", max_buffered=3
        )
        return out.select("k", "v", "t")

    run = Run(spark, HEAPSTATE_PROVIDER, build, tmp_path / "in", tmp_path / "chk")
    run.wait_until_finished()

    assert run.in_order() == [
        (0, []),
        (1, [("a", 7, 6)]),
        (2, [("b", 10, 9)]),
        (3, [("a", 12, 11)]),
        (4, []),
        (5, []),
        (6, [("c", 13, 12)]),
    ]
    assert_checkpoint_written_by(tmp_path / "chk", HEAPSTATE_PROVIDER)


# --------------------------------------------------------------------------------------------
# End of input: drain, on processing time


def processing_time_build(interval: str) -> Callable[[DataFrame], DataFrame]:
    def build(df: DataFrame) -> DataFrame:
        return buffered_output(df, "k", flush_interval=interval, order_by="seq")

    return build


def test_drain_flushes_every_key_and_stops_the_query(spark: SparkSession, tmp_path: Path) -> None:
    batches: Batches = [
        [("a", 1, 1, 0), ("a", 2, 3, 0), ("a", 3, 2, 0), ("b", 4, 4, 0)],
        [("c", 5, 5, 0), ("d", 6, 6, 0), ("d", 7, 7, 0)],
        [("e", 8, 8, 0)],
    ]
    write_batches(tmp_path / "in", batches)
    run = Run(
        spark,
        HEAPSTATE_PROVIDER,
        processing_time_build("2 seconds"),
        tmp_path / "in",
        tmp_path / "chk",
    )
    drained_at = run.drain()

    assert not run.query.isActive
    assert drained_at is not None and drained_at >= 3  # three data batches, then no-data ones
    assert run.all_rows() == [
        ("a", 2, 3, 0),
        ("b", 4, 4, 0),
        ("c", 5, 5, 0),
        ("d", 7, 7, 0),
        ("e", 8, 8, 0),
    ]
    assert run.reruns == []
    assert_pins_provider(tmp_path / "chk", HEAPSTATE_PROVIDER)


# --------------------------------------------------------------------------------------------
# Restart


RESTART_BATCHES: Batches = [
    [("a", 1, 1, 0), ("a", 2, 2, 1), ("b", 3, 3, 2)],  # a due 10, b due 12
    [("a", 40, 5, 5), ("a", 4, 4, 5), ("c", 5, 6, 6)],  # c due 16
    [("b", 6, 7, 12)],
    # a no-data batch at watermark 7 ends the first run with a, b and c buffered
    [("d", 7, 8, 18)],  # watermark 7 (from the checkpoint); d due 28
    [("a", 8, 9, 19)],  # watermark 13: a flushes with its new row, b from restored state
    [("e", 9, 10, 30)],  # watermark 14; e due 40
    [("f", 10, 11, 60)],  # watermark 25: c (16), restored, times out; f due 70
]  # then a no-data batch at watermark 55 times out d and e; f stays buffered


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_restart_on_event_time_loses_and_duplicates_nothing(
    spark: SparkSession, tmp_path: Path, provider: str
) -> None:
    def build(streams: Any) -> DataFrame:
        out = buffered_output(
            with_watermark(streams["in"]),
            "k",
            flush_interval=INTERVAL,
            event_time="ts",
            order_by="seq",
        )
        return out.drop("ts")

    source = Source(SCHEMA, as_rows(RESTART_BATCHES))
    run = run_with_restart(
        spark, tmp_path, PROVIDERS[provider], {"in": source}, build, "update", first_batches=3
    )

    assert run.first_run == [(0, []), (1, []), (2, []), (3, [])]
    assert run.second_run == [
        (4, []),
        (5, [("a", 8, 9, 19), ("b", 6, 7, 12)]),
        (6, []),
        (7, [("c", 5, 6, 6)]),
        (8, [("d", 7, 8, 18), ("e", 9, 10, 30)]),
    ]
    assert_checkpoint_written_by(run.checkpoint, PROVIDERS[provider])


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_restart_on_processing_time_loses_and_duplicates_nothing(
    spark: SparkSession, tmp_path: Path, provider: str
) -> None:
    """Stop the query while keys are buffered, restart it on more input, drain it.

    The stop falls wherever the engine happens to be, possibly inside a no-data batch that
    Spark then runs again on restart; the union of the emitted rows may not depend on it.
    """
    first: Batches = [
        [("a", 1, 1, 0), ("a", 2, 2, 0), ("b", 3, 3, 0)],
        [("c", 4, 4, 0)],
        [("d", 5, 6, 0), ("d", 6, 5, 0), ("e", 7, 7, 0)],
    ]
    second: Batches = [
        [("f", 8, 8, 0), ("f", 9, 9, 0)],
        [("g", 10, 10, 0)],
    ]
    build = processing_time_build("4 seconds")
    input_dir, checkpoint = tmp_path / "in", tmp_path / "chk"

    write_batches(input_dir, first)
    run1 = Run(spark, PROVIDERS[provider], build, input_dir, checkpoint)
    try:
        after_last_input = run1.wait_for_batch(len(first) - 1)
    finally:
        run1.query.stop()
    # d and e opened in that batch, so they cannot have been due in it. Whether a, b and c were
    # still buffered too depends on the wall clock, hence no exact figure.
    (op,) = after_last_input["stateOperators"]
    assert op["numRowsTotal"] >= 2, after_last_input

    write_batches(input_dir, second, start=len(first))
    run2 = Run(spark, PROVIDERS[provider], build, input_dir, checkpoint)
    run2.drain()

    for batch_id, before, after in run1.reruns + run2.reruns:
        assert before == after, f"batch {batch_id} emitted differently when run again"
    for batch_id in run1.batches.keys() & run2.batches.keys():
        assert run1.batches[batch_id] == run2.batches[batch_id], f"batch {batch_id} re-run"
    merged = {**run1.batches, **run2.batches}
    emitted = sorted_rows([r for _, rows in sorted(merged.items()) for r in rows])
    assert emitted == [
        ("a", 2, 2, 0),
        ("b", 3, 3, 0),
        ("c", 4, 4, 0),
        ("d", 5, 6, 0),
        ("e", 7, 7, 0),
        ("f", 9, 9, 0),
        ("g", 10, 10, 0),
    ]
    assert_pins_provider(checkpoint, PROVIDERS[provider])


# --------------------------------------------------------------------------------------------
# Bad arguments


def test_bad_arguments_name_what_is_wrong(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    stream = read_stream(spark, tmp_path / "in", SCHEMA)

    with pytest.raises(ValueError, match=r"key column 'user' is not a column .*k, v, seq, t"):
        buffered_output(stream, "user", flush_interval=10)
    with pytest.raises(ValueError, match=r"key column 'x' is not a column"):
        buffered_output(stream, ["k", "x"], flush_interval=10)

    for bad, shown in [
        (0, "0"),
        (-5, "-5"),
        (0.0, "0.0"),
        ("0 seconds", "'0 seconds'"),
        ("-1 minutes", "'-1 minutes'"),
        (datetime.timedelta(0), "datetime.timedelta(0)"),
    ]:
        with pytest.raises(ValueError, match=r"flush_interval must be positive") as err:
            buffered_output(stream, "k", flush_interval=bad)
        assert str(err.value).endswith(f"got {shown}"), err.value
    with pytest.raises(ValueError, match=r"flush_interval 'soon' is not '<number> <unit>'"):
        buffered_output(stream, "k", flush_interval="soon")
    with pytest.raises(TypeError, match=r"flush_interval must be .* got None"):
        buffered_output(stream, "k", flush_interval=None)  # type: ignore[arg-type]

    batch_df = spark.createDataFrame([("a", 1, 1, 0)], SCHEMA)
    with pytest.raises(ValueError, match=r"df must be a streaming DataFrame \(df.isStreaming"):
        buffered_output(batch_df, "k", flush_interval=10)
    with pytest.raises(TypeError, match=r"df must be a pyspark DataFrame, got list"):
        buffered_output([], "k", flush_interval=10)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=r"max_buffered must be a positive int or None, got 0"):
        buffered_output(stream, "k", flush_interval=10, max_buffered=0)
    with pytest.raises(ValueError, match=r"event_time column 'ts' is not a column"):
        buffered_output(stream, "k", flush_interval=10, event_time="ts")
    no_watermark = stream.withColumn("ts", F.expr(event_time("t")))
    with pytest.raises(ValueError, match=r"event_time column 'ts' has no watermark"):
        buffered_output(no_watermark, "k", flush_interval=10, event_time="ts")
    with pytest.raises(TypeError, match=r"event_time column 't' has type int, not timestamp"):
        buffered_output(stream, "k", flush_interval=10, event_time="t")
    with pytest.raises(ValueError, match=r"order_by column 'when' is not a column"):
        buffered_output(stream, "k", flush_interval=10, order_by="when")
    with pytest.raises(ValueError, match=r"output_schema is only used with reduce"):
        buffered_output(stream, "k", flush_interval=10, output_schema="k STRING")
    with pytest.raises(ValueError, match=r"output_mode must be one of \['append', 'update'\]"):
        buffered_output(stream, "k", flush_interval=10, output_mode="complete")

    with pytest.raises(TypeError, match=r"drain: query must be a StreamingQuery, got DataFrame"):
        drain(stream)  # type: ignore[arg-type]


def test_buffered_output_keeps_the_input_schema(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    stream = with_watermark(read_stream(spark, tmp_path / "in", SCHEMA))
    out = buffered_output(stream, ["k", "seq"], flush_interval=1.5, event_time="ts")
    assert out.isStreaming
    assert [(f.name, f.dataType.simpleString()) for f in out.schema.fields] == [
        ("k", "string"),
        ("v", "int"),
        ("seq", "int"),
        ("t", "int"),
        ("ts", "timestamp"),
    ]
    # The output carries no watermark marker of its own.
    assert all(not f.metadata for f in out.schema.fields)
