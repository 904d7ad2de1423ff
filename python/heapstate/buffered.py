"""Buffered output: emit each key's latest row (or a reduction of its rows) at most once per
flush interval, after Flink's FLIP-365 (``execution.flush.max-interval``) and the
"flink-memory-buffer" article (a per-key buffer, a ``processor`` that reduces it, a
``triggerInterval`` and a ``maxCount``).

:func:`buffered_output` turns a streaming DataFrame into one that holds back every key's rows
and emits them in one go, which cuts the rows sent downstream (a Delta MERGE, a database) from
one per input row to about one per key and flush interval. The buffer lives in Spark's
checkpointed state through ``applyInPandasWithState``, so it survives restarts and works on
heapstate and on Spark's built-in state store providers alike.

What a key emits
----------------
- By default only the latest row of a key is kept, and a flush emits that row unchanged.
- With ``reduce``, every buffered row is kept, and a flush emits ``reduce(rows)``: the key's
  buffered rows as one pandas DataFrame (the input columns, oldest first), reduced to any number
  of rows of ``output_schema``. This is the article's ``processor``.
- "Latest" and "oldest first" follow ``order_by`` when it is given, with ties (and rows of
  different micro-batches that compare equal) in arrival order and nulls first. Without
  ``order_by`` they follow arrival order, which Spark defines between micro-batches but not
  within one: its shuffle and sort may reorder a key's rows of one micro-batch. Give
  ``order_by`` (a sequence number or a timestamp) whenever a key can get several rows per
  micro-batch. In event-time mode it defaults to the ``event_time`` column.
- A key that received no row since its last flush emits nothing: it is only emitted if it
  changed, where any row received counts as a change (a row equal to the last one emitted
  too). After a flush the key's state is removed, so quiet keys cost no state.

When a key is flushed: the clock
--------------------------------
A key's buffer *opens* when it receives a row while empty. It is then due at
``deadline = opened + flush_interval`` and is flushed in the first micro-batch whose clock is
past the deadline (``clock > deadline``), whether or not the key has new rows in that batch.
The clock is one of two, chosen by ``event_time``:

- **Processing time** (``event_time=None``, the default; ``ProcessingTimeTimeout``). The clock
  is the micro-batch's timestamp, which Spark records in the offset log, so a re-run batch sees
  the same clock. ``opened`` is the timestamp of the batch that opened the buffer. "At most once
  per flush_interval" means: two timed flushes of one key happen in micro-batches whose
  timestamps are more than ``flush_interval`` apart. (One edge: a key that gets new rows in
  the very millisecond of its deadline is re-armed 1 ms late, as Spark's timeout durations must
  be positive.) The clock is only read when a micro-batch runs: Spark runs one at every trigger
  even without new data, and under ``Trigger.AvailableNow`` back to back, without ever stopping
  by itself. Use :func:`drain` to end such a query.
- **Event time** (``event_time="<column>"``; ``EventTimeTimeout``). The clock is the watermark,
  which the DataFrame must define on that column with ``withWatermark``. ``opened`` is the
  greater of the current watermark and the earliest event time among the rows that opened the
  buffer. "At most once per flush_interval" means: two timed flushes of one key happen in
  micro-batches whose watermarks are more than ``flush_interval`` apart. Everything here
  depends on the data alone, not on wall-clock time, which makes this mode deterministic and
  fit for tests. Spark drops rows older than the watermark before they reach the buffer.

**Early flush.** With ``max_buffered=n``, a key is flushed at the end of the micro-batch in
which it has received ``n`` rows since its last flush, whatever the clock says. A key is
flushed at most once per micro-batch, so a single micro-batch that brings more than ``n`` rows
of one key flushes them together: the state never holds more than ``n - 1`` rows of a key
between micro-batches, but ``reduce`` may see more than ``n`` rows at once. Early flushes are
the one exception to "at most once per flush_interval".

**End of input.** In processing-time mode, :func:`drain` waits until the input is consumed and
every buffered key has been flushed by its deadline, then stops the query: it takes up to one
flush interval after the last row. In event-time mode the watermark only moves with new data,
so keys whose deadline the final watermark has not passed stay buffered (in the checkpoint,
not lost) until a later run brings newer data; :func:`drain` reports them as an error.

**Restart.** The buffer, the count and the deadline are checkpointed state. A query stopped at
any point and restarted from its checkpoint emits every key's last value exactly once after
its last change (micro-batches that Spark re-runs after a failure see the same input, clock
and state, so an idempotent sink keyed on the batch id sees each emission once).

State layout (one row per key with an open buffer): ``buffer BINARY`` holds the buffered rows
as an Arrow IPC stream, so any column type Arrow carries round-trips and the layout does not
depend on the input schema; ``received LONG`` counts rows since the last flush; ``deadline_ms
LONG`` is the deadline in milliseconds on the mode's clock.

Example::

    from heapstate.buffered import buffered_output, drain

    views = spark.readStream.table("views")            # columns: page, user, seq, ts
    latest = buffered_output(views, "page", flush_interval="30 seconds", order_by="seq")
    query = (
        latest.writeStream.outputMode("update")
        .option("checkpointLocation", "/chk/views")
        .trigger(availableNow=True)
        .foreachBatch(lambda df, batch_id: df.write.mode("append").saveAsTable("pages"))
        .start()
    )
    drain(query)   # returns once everything read has been flushed, and stops the query
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.streaming.state import GroupState
    from pyspark.sql.types import StructType

__all__ = ["OPERATOR_NAME", "STATE_SCHEMA", "buffered_output", "drain"]

OPERATOR_NAME = "applyInPandasWithState"
"""The ``operatorName`` under which a buffered output reports its state in query progress."""

STATE_SCHEMA = "buffer BINARY, received LONG, deadline_ms LONG"
"""The state of one key with an open buffer (see the module docstring)."""

_EVENT_MS = "__heapstate_buffered_event_ms"
"""A column added in event-time mode: the event time in epoch milliseconds, computed by Spark,
so the Python side never converts pandas timestamps across time zones."""

_OUTPUT_MODES = {"update": "Update", "append": "Append"}

_UNIT_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1_000,
    "sec": 1_000,
    "second": 1_000,
    "seconds": 1_000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
}
_INTERVAL = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


# --------------------------------------------------------------------------------------------
# Arguments


def _interval_ms(value: Any) -> int:
    """``flush_interval`` in milliseconds: a timedelta, a number of seconds or "<n> <unit>"."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str, datetime.timedelta)):
        raise TypeError(
            f"buffered_output: flush_interval must be a timedelta, a number of seconds or a "
            f"string such as '30 seconds', got {value!r} ({type(value).__name__})"
        )
    if isinstance(value, datetime.timedelta):
        ms = value / datetime.timedelta(milliseconds=1)
    elif isinstance(value, str):
        m = _INTERVAL.match(value.lower())
        if not m or m.group(2) not in _UNIT_MS:
            raise ValueError(
                f"buffered_output: flush_interval {value!r} is not '<number> <unit>' with a "
                f"unit among {', '.join(sorted(set(_UNIT_MS)))}"
            )
        ms = float(m.group(1)) * _UNIT_MS[m.group(2)]
    else:
        ms = float(value) * 1_000
    if not ms >= 1:  # also rejects NaN
        raise ValueError(
            f"buffered_output: flush_interval must be positive (at least 1 millisecond), "
            f"got {value!r}"
        )
    return int(ms)


def _column_names(df: DataFrame, arg: str, value: str | Sequence[str]) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"buffered_output: {arg} must be a column name or a non-empty list of column "
            f"names, got {value!r}"
        )
    for name in names:
        if name not in df.columns:
            raise ValueError(
                f"buffered_output: {arg} column {name!r} is not a column of the DataFrame "
                f"(columns: {', '.join(df.columns)})"
            )
    return names


def _plain_schema(schema: StructType) -> StructType:
    """The schema without column metadata, so the output carries no watermark marker."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType, f.nullable) for f in schema.fields])


def _check_event_time(df: DataFrame, column: str) -> None:
    from pyspark.sql.types import TimestampType

    (field,) = [f for f in df.schema.fields if f.name == column]
    if not isinstance(field.dataType, TimestampType):
        raise TypeError(
            f"buffered_output: event_time column {column!r} has type "
            f"{field.dataType.simpleString()}, not timestamp"
        )
    if "spark.watermarkDelayMs" not in field.metadata:
        raise ValueError(
            f"buffered_output: event_time column {column!r} has no watermark: call "
            f"df.withWatermark({column!r}, '<delay>') before buffered_output"
        )


# --------------------------------------------------------------------------------------------
# The buffer as state


def _encode(rows: pd.DataFrame) -> bytes:
    import pyarrow as pa

    table = pa.Table.from_pandas(rows, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _decode(data: bytes | bytearray) -> pd.DataFrame:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(bytes(data))).read_pandas()


class _KeyBuffer:
    """The function ``applyInPandasWithState`` calls for each key: buffers, decides, flushes.

    It is a module-level class rather than a closure so that Spark's workers import it from the
    installed package instead of unpickling a copy of its code.
    """

    def __init__(
        self,
        *,
        interval_ms: int,
        max_buffered: int | None,
        reduce: Callable[[pd.DataFrame], pd.DataFrame] | None,
        event_time: bool,
        order_by: str | None,
        input_columns: list[str],
        output_columns: list[str],
    ) -> None:
        self.interval_ms = interval_ms
        self.max_buffered = max_buffered
        self.reduce = reduce
        self.event_time = event_time
        self.order_by = order_by
        self.input_columns = input_columns
        self.output_columns = output_columns

    def __call__(
        self, key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        now = (
            state.getCurrentWatermarkMs() if self.event_time else state.getCurrentProcessingTimeMs()
        )
        buffered: pd.DataFrame | None = None
        received = 0
        deadline: int | None = None
        if state.exists:
            _, received, deadline = state.get

        frames = [] if state.hasTimedOut else [p for p in pdfs if len(p)]
        if frames:
            new = pd.concat(frames, ignore_index=True)
            received += len(new)
            if deadline is None:
                opened = max(now, int(new[_EVENT_MS].min())) if self.event_time else now
                deadline = opened + self.interval_ms
            new = new[self.input_columns]
            if self.reduce is None and self.order_by is None:
                rows = new  # in arrival order, the newest row supersedes the buffered one
            elif state.exists:
                rows = pd.concat([_decode(state.get[0]), new], ignore_index=True)
            else:
                rows = new
            if self.order_by is not None:
                rows = rows.sort_values(
                    self.order_by, kind="stable", na_position="first", ignore_index=True
                )
            buffered = rows if self.reduce is not None else rows.iloc[-1:]

        if deadline is None:
            # Neither rows nor state: Spark never makes such a call, but it needs no answer.
            state.remove()
            return
        if buffered is None:
            buffered = _decode(state.get[0])

        due = (
            state.hasTimedOut
            or now > deadline
            or (self.max_buffered is not None and received >= self.max_buffered)
        )
        if not due:
            state.update((_encode(buffered), int(received), int(deadline)))
            # Spark clears a key's timeout on every call: arm it again, at the same deadline.
            if self.event_time:
                state.setTimeoutTimestamp(deadline)  # deadline >= watermark, since not due
            else:
                # Spark fires when the batch timestamp exceeds the timeout. A duration must be
                # positive, so when now == deadline the timeout lands 1 ms late.
                state.setTimeoutDuration(max(1, deadline - now))
            return

        state.remove()
        yield self._flush(key, buffered)

    def _flush(self, key: tuple[Any, ...], rows: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        if self.reduce is None:
            return rows.reset_index(drop=True)
        out = self.reduce(rows.reset_index(drop=True))
        if out is None:
            return pd.DataFrame({c: [] for c in self.output_columns})
        if not isinstance(out, pd.DataFrame):
            raise TypeError(
                f"buffered_output: reduce returned {type(out).__name__} for key {key!r}, "
                "not a pandas DataFrame"
            )
        missing = [c for c in self.output_columns if c not in out.columns]
        if missing:
            raise ValueError(
                f"buffered_output: reduce returned columns {list(out.columns)} for key "
                f"{key!r}, missing {missing} of the output schema {self.output_columns}"
            )
        return out[self.output_columns]


# --------------------------------------------------------------------------------------------
# The operator


def buffered_output(
    df: DataFrame,
    key: str | Sequence[str],
    *,
    flush_interval: datetime.timedelta | float | str,
    max_buffered: int | None = None,
    reduce: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
    output_schema: StructType | str | None = None,
    event_time: str | None = None,
    order_by: str | None = None,
    output_mode: str = "update",
) -> DataFrame:
    """Buffer a streaming DataFrame per key and emit each key at most once per flush interval.

    The semantics (latest row or ``reduce``, the two clocks, early flush, end of input and
    restart) are in the module docstring of :mod:`heapstate.buffered`.

    :param df: a streaming DataFrame.
    :param key: the key column, or a list of key columns.
    :param flush_interval: how long a key's buffer stays open: a ``timedelta``, a number of
        seconds, or a string such as ``"500 ms"``, ``"30 seconds"``, ``"5 minutes"``.
    :param max_buffered: flush a key early, at the end of the micro-batch in which it has
        received this many rows since its last flush. ``None``: no count bound.
    :param reduce: called with a key's buffered rows (one pandas DataFrame, oldest first) when
        the key is flushed; returns the rows to emit, with the columns of ``output_schema``.
        It must be picklable, as Spark runs it in its Python workers. ``None``: keep and emit
        only the latest row.
    :param output_schema: the schema of ``reduce``'s rows (a ``StructType`` or a DDL string).
        Default: the schema of ``df``. Only with ``reduce``.
    :param event_time: a timestamp column with a watermark: flush on event time (the watermark)
        instead of processing time.
    :param order_by: the column that orders a key's rows ("latest", "oldest first"); default:
        ``event_time`` in event-time mode, arrival order otherwise.
    :param output_mode: ``"update"`` (default) or ``"append"``: the ``applyInPandasWithState``
        output mode, which the query's output mode must match.
    :returns: a streaming DataFrame with the columns of ``output_schema``.
    :raises ValueError, TypeError: for a missing column or a bad argument, naming it.

    >>> from heapstate.buffered import buffered_output
    >>> events = (
    ...     spark.readStream.schema("page STRING, views LONG, ts TIMESTAMP")
    ...     .json("/data/views").withWatermark("ts", "1 minute")
    ... )
    >>> latest = buffered_output(events, "page", flush_interval="10 minutes", event_time="ts")
    >>> latest.isStreaming
    True
    >>> import pandas as pd
    >>> totals = buffered_output(
    ...     events, "page", flush_interval="10 minutes", event_time="ts", max_buffered=1000,
    ...     reduce=lambda rows: pd.DataFrame(
    ...         {"page": [rows["page"].iloc[0]], "views": [rows["views"].sum()]}),
    ...     output_schema="page STRING, views LONG",
    ... )
    >>> totals.columns
    ['page', 'views']
    """
    from pyspark.sql import DataFrame as SparkDataFrame  # the parent of classic and Connect
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    if not isinstance(df, SparkDataFrame):
        raise TypeError(f"buffered_output: df must be a pyspark DataFrame, got {type(df).__name__}")
    if not df.isStreaming:
        raise ValueError(
            "buffered_output: df must be a streaming DataFrame (df.isStreaming is False); "
            "read it with spark.readStream. A batch DataFrame has no state to buffer in."
        )
    keys = _column_names(df, "key", key)
    interval_ms = _interval_ms(flush_interval)
    if max_buffered is not None and (
        isinstance(max_buffered, bool) or not isinstance(max_buffered, int) or max_buffered < 1
    ):
        raise ValueError(
            f"buffered_output: max_buffered must be a positive int or None, got {max_buffered!r}"
        )
    if reduce is not None and not callable(reduce):
        raise TypeError(f"buffered_output: reduce must be callable, got {reduce!r}")
    if output_schema is not None and reduce is None:
        raise ValueError(
            "buffered_output: output_schema is only used with reduce; without reduce the "
            "output has the schema of df"
        )
    if output_mode not in _OUTPUT_MODES:
        raise ValueError(
            f"buffered_output: output_mode must be one of {sorted(_OUTPUT_MODES)}, "
            f"got {output_mode!r}"
        )
    if event_time is not None:
        _column_names(df, "event_time", event_time)
        _check_event_time(df, event_time)
    if order_by is not None:
        _column_names(df, "order_by", order_by)
    if _EVENT_MS in df.columns:
        raise ValueError(f"buffered_output: df must not have a column named {_EVENT_MS!r}")

    input_schema = _plain_schema(df.schema)
    if output_schema is None:
        out_schema = input_schema
    elif isinstance(output_schema, str):
        # An empty DataFrame parses the DDL, in classic Spark and in Spark Connect alike.
        out_schema = df.sparkSession.createDataFrame([], output_schema).schema
    elif isinstance(output_schema, StructType):
        out_schema = output_schema
    else:
        raise TypeError(
            f"buffered_output: output_schema must be a StructType or a DDL string, "
            f"got {type(output_schema).__name__}"
        )

    step = _KeyBuffer(
        interval_ms=interval_ms,
        max_buffered=max_buffered,
        reduce=reduce,
        event_time=event_time is not None,
        order_by=order_by if order_by is not None else event_time,
        input_columns=list(df.columns),
        output_columns=[f.name for f in out_schema.fields],
    )
    prepared = df
    if event_time is not None:
        prepared = df.withColumn(_EVENT_MS, F.unix_millis(F.col(event_time)))
    timeout = "EventTimeTimeout" if event_time is not None else "ProcessingTimeTimeout"
    return prepared.groupBy(*keys).applyInPandasWithState(
        step, out_schema, STATE_SCHEMA, _OUTPUT_MODES[output_mode], timeout
    )


# --------------------------------------------------------------------------------------------
# End of input


def _buffered_keys(progress: dict[str, Any]) -> int | None:
    """Keys with an open buffer after the batch of ``progress``; None if it reports none."""
    ops = [o for o in progress.get("stateOperators", []) if o.get("operatorName") == OPERATOR_NAME]
    if not ops:
        return None
    return sum(int(o.get("numRowsTotal", 0)) for o in ops)


def drain(
    query: StreamingQuery,
    *,
    timeout: float | None = None,
    poll_interval: float = 0.5,
) -> int | None:
    """Wait until everything the query has read is flushed, then stop the query.

    Meant for a query over :func:`buffered_output` in processing-time mode, which never ends by
    itself under ``Trigger.AvailableNow``. The query is drained after a completed micro-batch
    that read no input rows and after which no ``applyInPandasWithState`` operator of the query
    holds state, i.e. no key of any buffered output has an open buffer. That batch's output is
    committed, so stopping loses nothing. The first micro-batch this call observes never counts,
    as it may be a batch Spark re-runs from the checkpoint before it reads new input. Under a
    processing-time trigger with a live source the query is drained at a quiet moment; rows
    that arrive later are read by the next run.

    Draining takes up to one flush interval after the last row, plus a micro-batch or two.

    :param query: the running query.
    :param timeout: seconds to wait at most; ``None`` waits indefinitely. On expiry a
        ``TimeoutError`` is raised and the query keeps running.
    :param poll_interval: seconds between looks at the query's progress.
    :returns: the id of the micro-batch after which nothing was buffered, or None if the query
        had already ended without reporting one.
    :raises TimeoutError: if the query is not drained within ``timeout``.
    :raises RuntimeError: if the query ended by itself with keys still buffered (event-time
        mode: the final watermark has not passed their deadline).
    :raises pyspark.errors.StreamingQueryException: if the query failed.

    >>> from heapstate.buffered import drain
    >>> query = buffered.writeStream.trigger(availableNow=True).foreachBatch(sink).start()
    >>> drain(query, timeout=600)
    7
    """
    # Classic and Spark Connect queries share no base class: check for what is used here.
    if not all(hasattr(query, a) for a in ("awaitTermination", "lastProgress", "isActive", "stop")):
        raise TypeError(f"drain: query must be a StreamingQuery, got {type(query).__name__}")
    if poll_interval <= 0:
        raise ValueError(f"drain: poll_interval must be positive, got {poll_interval!r}")
    started = time.monotonic()
    first_batch: int | None = None
    while True:
        ended = query.awaitTermination(poll_interval)  # raises if the query failed
        progress = query.lastProgress
        if ended or not query.isActive:
            buffered = _buffered_keys(progress) if progress else None
            if buffered:
                raise RuntimeError(
                    f"drain: query {query.name or query.id} ended by itself after batch "
                    f"{progress['batchId']} with {buffered} keys still buffered; in event-time "
                    "mode they are flushed when a later run moves the watermark past their "
                    "deadline"
                )
            return progress["batchId"] if progress else None
        if progress:
            batch = int(progress["batchId"])
            if first_batch is None:
                first_batch = batch
            buffered = _buffered_keys(progress)
            if batch > first_batch and progress.get("numInputRows", 0) == 0 and buffered == 0:
                query.stop()
                return batch
        if timeout is not None and time.monotonic() - started > timeout:
            last = ""
            if progress:
                last = f"batch {progress['batchId']}: {_buffered_keys(progress)} keys buffered, "
            raise TimeoutError(
                f"drain: query {query.name or query.id} was not drained within {timeout}s "
                f"({last}still running)"
            )
