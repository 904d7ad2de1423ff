"""W4, buffered output: rows sent to a Delta MERGE sink, throughput and added latency, with and
without :func:`heapstate.buffered.buffered_output`, on each state store provider.

As W4 in the project's BENCHMARKS.md describes::

    .venv/bin/python bench/w4.py --size small
    .venv/bin/python bench/w4.py --size full
    .venv/bin/python bench/w4.py --size full --cardinalities 20 --providers hdfs,heapstate
    .venv/bin/python bench/w4.py --cardinalities 1,20 --events 1000 --batches 12 --flush 5

The data: a stream of view events ``page STRING, user BIGINT, seq BIGINT, ts TIMESTAMP``. The
key is ``page``, one of C values (the cardinality), drawn uniformly with Python's
``random.Random`` seeded with ``--seed``, C and the batch; ``seq`` numbers the events from 0;
``ts`` starts at 2026-01-01T00:00:00Z and spaces the events evenly, so each batch file spans T
seconds of event time. One parquet file per micro-batch, E events each, N data batches, written
with pyarrow and cached under ``bench/results/data/``. After them come two end-of-input files of
one event each, with the sentinel key ``~end-of-input`` (see "End of input").

Both runs read the folder with ``maxFilesPerTrigger=1``; the script drops one file at a time and
waits for its micro-batch, so batches run back to back and the throughput is the sustainable
rate, not one bounded by a wall-clock trigger. ``spark.sql.streaming.noDataMicroBatches.enabled``
is false, so every micro-batch is exactly one file (a source that always has data behaves so).

- **unbuffered**: ``foreachBatch`` reduces each micro-batch to the latest row per page (by
  ``seq``: MERGE takes at most one source row per target row) and MERGEs it into a Delta table
  keyed on ``page``. It has no state, so it runs once per cardinality.
- **buffered**, once per provider: ``buffered_output(events.withWatermark("ts", "0 seconds"),
  "page", flush_interval=F, order_by="seq", event_time="ts")`` in event-time mode, then the same
  MERGE into its own Delta table, skipped when the batch flushed nothing. The watermark moves T
  per batch, so T plays the trigger interval and the run is deterministic. A key opened in batch
  j is flushed in batch j + F/T + 1: its deadline is F after its first event, which lies just
  after batch j's start, and the watermark of a batch is the last event time of the batch
  before (F a multiple of T). A key with rows in every batch is so sent every F/T + 1 batches:
  the rows-downstream ratio of such a key is T/(F + T), not quite the T/F that BENCHMARKS.md
  expects (0.09 rather than 0.10 for F = 10 T).

Each MERGE source is persisted, its ``page`` and ``seq`` collected (one action, for the checks
below), then MERGEd; both modes do exactly this, so both pay the collection.

End of input: in event-time mode the watermark only moves with data. Two trailing files hold one
event each of a sentinel key, the first dated F + 2T after the data's last batch ends: in the
batch of the second, the watermark is past every deadline and every data key is flushed. The
sentinel key's own rows never reach the sink (``foreachBatch`` filters them out) and it stays
buffered. The unbuffered run does not read these files. The buffered run's wall time includes
their two batches: the last flush is part of delivering the data. It also caps the delay of the
last updates: those of the last data batch are sent 2 batches later, not F/T + 1.

Checks, per run; any failure is printed loudly and makes the exit code 1:

- the final Delta table equals the latest row per page of the input (``matches_expected``) and,
  for a buffered run, the unbuffered run's table (``matches_unbuffered``);
- every row sent downstream is its page's latest row so far, and a page is sent only when it
  received rows since it was last sent (``emission_errors`` counts violations);
- a buffered run ends with only the sentinel key in state (``buffered_keys_at_end`` == 1).

Added latency: for every (page, data batch) that got rows, the unbuffered run sends the page's
latest row in that same batch (checked above). The buffered run sends it in the first batch at or
after it in which it sends that page; the difference in batches, times T, is the added latency
in event-time seconds, averaged and maximised over all of them. It is not given in wall-clock
time: batches run back to back, so a batch's wall time is its processing time, not the trigger
interval a deployment would wait between batches (the delay there is the same number of
triggers, times T).

Providers: every buffered run of a cardinality runs on each provider of ``--providers``.
``--isolation shared`` (the default) runs everything in one Python process and JVM, one query
after another, and sets the provider with ``spark.conf.set`` before each query starts (the
provider is read when a query starts): no two runs compete for the cores, and each extra JVM
would cost 30 to 50 s, mostly Delta's first table and MERGEs and the first pandas UDF.
``--isolation per-provider`` runs the unbuffered runs in one process and each provider's runs in
its own, as W1 does, so no provider profits from code another one warmed up. Each process first
warms up (unless ``--no-warmup``, the default of ``--size small``), on scratch tables over
the smallest cardinality's files: an
unbuffered run over two batches, then a buffered run over one batch and the two end files for
each provider it will run, so class loading, code generation, Delta's first MERGEs and the
Python workers' start do not land in the first measured run.

Output: a table per cardinality, one column per run, with ratios to the unbuffered run and each
provider's throughput against the buffered HDFS run; then one line per cardinality with the
rows and throughput ratios of buffered to unbuffered. JSON goes to
``bench/results/w4-<timestamp>.json``; each worker's Spark log goes to ``w4-<timestamp>.logs/``.

JSON fields (``results`` is a flat list, one record per run):

- ``benchmark`` "W4", ``timestamp``, ``size``, ``git`` {commit, dirty}, ``host`` {machine,
  cpus}, ``environment`` {spark_version, python, java_version, delta_jar}, ``heapstate_jar``
  {path, sha256} or null, ``failures`` {process: error}, ``warmup`` [{process, run, wall_ms}].
- ``params``: cardinalities, events_per_batch (E), batches (N, data batches), trigger_s (T),
  flush_s (F), expected_rows_ratio (T/F), seed, shuffle_partitions, isolation, warmup,
  driver_memory, delta_jar_version, providers, spark_confs (extra ``--conf``).
- ``results[]``:
  - ``name`` (e.g. "c20-heapstate"), ``cardinality``, ``mode`` ("unbuffered" or "buffered"),
    ``provider`` (a ``--providers`` name, null when unbuffered), ``provider_label``;
  - ``events`` (N × E), ``input_batches`` (N, or N + 2 when buffered);
  - ``rows_downstream``: rows MERGEd in all, ``merges``: MERGE commits, ``rows_ratio`` and
    ``merges_ratio``: against the unbuffered run, ``expected_rows_ratio``: T/F;
  - ``wall_ms``: from the first file's drop to the last batch's end (the sum of the batches'
    ``wall_ms``), ``throughput_eps``: events / wall, ``wall_ratio`` and ``throughput_ratio``:
    against unbuffered, ``wall_ratio_vs_hdfs`` and ``throughput_ratio_vs_hdfs``: against the
    buffered HDFS run of the same cardinality (null for unbuffered);
  - ``merge_ms``: the MERGEs' time in all, ``wall_ms_outside_merge``: ``wall_ms`` minus it (the
    state operator, Python, Spark's batch overhead), ``trigger_ms_median``;
  - ``added_latency_s_mean``, ``added_latency_s_max``, ``latency_updates`` (the (page, batch)
    pairs they are taken over; 0 and 0 when unbuffered);
  - ``matches_expected``, ``matches_unbuffered`` (null when unbuffered or when the unbuffered
    run failed), ``mismatches`` (up to 5 examples), ``emission_errors`` (count) and
    ``emission_error_examples``, ``buffered_keys_at_end`` (null when unbuffered),
    ``checks_passed`` (all of these hold), ``setup_ms`` (table creation and query start, not
    in ``wall_ms``);
  - ``batches[]``: per micro-batch ``batch``, ``trigger_ms`` (``durationMs.triggerExecution``),
    ``wall_ms``, ``input_rows``, ``rows_merged``, ``merged`` (bool), ``collect_ms``,
    ``merge_ms``, and when buffered ``state_rows_total`` (keys buffered after the batch),
    ``state_commit_ms``, ``state_memory_used_bytes``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    BASELINE,
    DEFAULT_PYTHON,
    PROVIDERS,
    REPO_DIR,
    RESULTS_DIR,
    Provider,
    add_java_option,
    drop_file,
    host_info,
    parse_confs,
    parse_providers,
    progress,
    pyspark_submit_args,
    resolve_jar,
    run_worker,
    timestamp,
    wait_for_batch,
    write_json,
)
from _delta import delta_jar_version, delta_session

SCRIPT = Path(__file__).resolve()
UNBUFFERED = "unbuffered"
BUFFERED = "buffered"
SENTINEL = "~end-of-input"
"""The page of the two end-of-input events; it never reaches the sink."""
SCHEMA = "page STRING, user BIGINT, seq BIGINT, ts TIMESTAMP"
START_US = 1_767_225_600_000_000
"""Event time of the first event: 2026-01-01T00:00:00Z, in microseconds."""
USERS = 1_000_000
WARMUP_BATCHES = {"unbuffered": 2, "buffered": 1}
"""Data batches of each warm-up run: Delta's first MERGEs are the slowest to warm up; a buffered
warm-up adds the two end files, so it also flushes and MERGEs."""


@dataclass(frozen=True)
class Size:
    cardinalities: tuple[int, ...]
    events: int
    batches: int
    trigger_s: float
    flush_s: float
    warmup: bool = True


SIZES: dict[str, Size] = {
    # A quick check that everything runs, in about a minute: no warm-up, so its timings include
    # the JVM's JIT and Delta's first MERGE.
    "small": Size((20,), events=500, batches=4, trigger_s=1, flush_s=2, warmup=False),
    "full": Size((1, 20, 1_000, 20_000), events=500, batches=22, trigger_s=1, flush_s=10),
}
"""``full`` has F = 10 T and N = 22 batches: two flush cycles of a key with rows in every batch.
E is small because a buffered batch costs a few ms per key it holds rows of (a pandas call per
key): at C = 20,000, E = 1,000 takes about twice as long as E = 500 and shows the same."""


# --------------------------------------------------------------------------------------------
# The data: one parquet file per micro-batch, then two end-of-input files.


def _data_name(card: int, p: dict[str, Any]) -> str:
    return (
        f"w4-c{card}-e{p['events']}-n{p['batches']}-t{p['trigger_ms']}ms-f{p['flush_ms']}ms"
        f"-s{p['seed']}"
    )


def _batch_file(data_dir: Path, index: int) -> Path:
    return data_dir / f"batch-{index:05d}.parquet"


def _page(i: int) -> str:
    return f"page-{i:05d}"


def generate(data_dir: Path, card: int, p: dict[str, Any]) -> None:
    """Write the missing files of one cardinality: N data batches of E events, then two
    end-of-input files. Each file is written under a hidden name and renamed, so a file that
    exists is complete."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    events, batches, trigger_us = p["events"], p["batches"], p["trigger_ms"] * 1000
    data_dir.mkdir(parents=True, exist_ok=True)
    for index in range(batches + 2):
        target = _batch_file(data_dir, index)
        if target.exists():
            continue
        if index < batches:
            rng = random.Random(f"{p['seed']}:{card}:{index}")
            seqs = list(range(index * events, (index + 1) * events))
            pages = [_page(rng.randrange(card)) for _ in seqs]
            users = [rng.randrange(USERS) for _ in seqs]
            ts = [START_US + s * trigger_us // events for s in seqs]
        else:
            # Past every deadline (at most the last event time + F) once it is the watermark.
            end = index - batches
            seqs = [batches * events + end]
            pages, users = [SENTINEL], [0]
            ts = [START_US + (batches + 2 + end) * trigger_us + p["flush_ms"] * 1000]
        table = pa.table(
            {
                "page": pa.array(pages, pa.string()),
                "user": pa.array(users, pa.int64()),
                "seq": pa.array(seqs, pa.int64()),
                "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
            }
        )
        hidden = data_dir / f".{target.name}.tmp"
        pq.write_table(table, hidden)
        os.replace(hidden, target)
    progress(f"data: cardinality {card:,} ready in {data_dir}")


def batch_updates(data_dir: Path, batches: int) -> list[dict[str, int]]:
    """For each data batch, the latest ``seq`` of each page it holds."""
    import pyarrow.parquet as pq

    updates: list[dict[str, int]] = []
    for index in range(batches):
        cols = pq.read_table(_batch_file(data_dir, index), columns=["page", "seq"]).to_pydict()
        latest: dict[str, int] = {}
        for page, seq in zip(cols["page"], cols["seq"], strict=True):
            if seq > latest.get(page, -1):
                latest[page] = seq
        updates.append(latest)
    return updates


def expected_table(data_dir: Path, batches: int) -> dict[str, tuple[Any, ...]]:
    """The latest (page, user, seq, ts) row of every page in the data batches."""
    import pyarrow.parquet as pq

    rows: dict[str, tuple[Any, ...]] = {}
    for index in range(batches):
        for row in pq.read_table(_batch_file(data_dir, index)).to_pylist():
            seen = rows.get(row["page"])
            if seen is None or row["seq"] > seen[2]:
                rows[row["page"]] = (row["page"], row["user"], row["seq"], row["ts"])
    return rows


# --------------------------------------------------------------------------------------------
# Worker side: one Spark session runs a list of runs, one query after another.


def _session(spec: dict[str, Any]) -> Any:
    """The worker's Delta session (``_delta.delta_session``: the jar, the mirror, Delta's confs),
    with one micro-batch per file and the run's extra confs."""
    return delta_session(
        f"heapstate-bench-w4-{spec['process']}",
        shuffle_partitions=spec["shuffle_partitions"],
        confs={
            "spark.sql.session.timeZone": "UTC",
            # One micro-batch per file: no extra batch only because the watermark moved.
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            **spec["spark_confs"],
        },
    )


def _use_provider(spark: Any, provider: Provider) -> None:
    """Make ``provider`` the one of the next query started; the confs any other provider sets
    are unset first, so nothing carries over from the previous run."""
    for key in {k for p in PROVIDERS.values() for k in p.spark_confs()}:
        spark.conf.unset(key)
    for key, value in provider.spark_confs().items():
        spark.conf.set(key, value)


def _latest_per_page(df: Any) -> Any:
    from pyspark.sql import functions as F

    latest = F.max_by(F.struct("user", "seq", "ts"), "seq").alias("latest")
    return df.groupBy("page").agg(latest).select("page", "latest.*")


def _merge(spark: Any, sink: Path, source: Any) -> None:
    from delta.tables import DeltaTable

    (
        DeltaTable.forPath(spark, str(sink))
        .alias("t")
        .merge(source.alias("s"), "t.page = s.page")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )


def _table_rows(spark: Any, sink: Path) -> dict[str, tuple[Any, ...]]:
    rows = spark.read.format("delta").load(str(sink)).toArrow().to_pylist()
    return {r["page"]: (r["page"], r["user"], r["seq"], r["ts"]) for r in rows}


def _compare(actual: dict[str, tuple[Any, ...]], expected: dict[str, tuple[Any, ...]]) -> list[str]:
    """Differences between two tables keyed by page: up to 5 examples, then a count."""
    wrong = [p for p in sorted(set(actual) | set(expected)) if actual.get(p) != expected.get(p)]
    examples = [f"{p}: got {actual.get(p)}, expected {expected.get(p)}" for p in wrong[:5]]
    if len(wrong) > 5:
        examples.append(f"... {len(wrong) - 5} more pages differ")
    return examples


def _check_emissions(
    emitted: dict[int, dict[str, int]], updates: list[dict[str, int]], trigger_s: float
) -> dict[str, Any]:
    """Check every row sent downstream against the input and measure each update's delay.

    ``emitted[b]`` maps each page sent in batch ``b`` to its ``seq``; ``updates[b]`` maps each
    page with rows in data batch ``b`` to its latest ``seq`` there. A page may only be sent with
    its latest ``seq`` so far, and only after new rows; each update is delivered by the first
    send of its page at or after its batch.
    """
    errors: list[str] = []
    latest: dict[str, int] = {}
    pending: dict[str, int] = {}  # page -> first batch of its rows not yet sent
    delays: list[int] = []
    waiting: dict[str, list[int]] = {}  # page -> data batches of updates not yet sent
    last = max(len(updates) - 1, max(emitted, default=-1))
    for batch in range(last + 1):
        for page, seq in (updates[batch] if batch < len(updates) else {}).items():
            latest[page] = seq
            pending.setdefault(page, batch)
            waiting.setdefault(page, []).append(batch)
        for page, seq in sorted(emitted.get(batch, {}).items()):
            if page not in pending:
                errors.append(f"batch {batch}: {page} sent without new rows since last sent")
            elif seq != latest[page]:
                errors.append(f"batch {batch}: {page} sent seq {seq}, latest is {latest[page]}")
            pending.pop(page, None)
            delays.extend(batch - b for b in waiting.pop(page, []))
    for page, first in sorted(pending.items()):
        errors.append(f"{page}: rows from batch {first} on never sent")
    return {
        "added_latency_s_mean": statistics.fmean(delays) * trigger_s if delays else None,
        "added_latency_s_max": max(delays) * trigger_s if delays else None,
        "latency_updates": len(delays),
        "emission_errors": len(errors),
        "emission_error_examples": errors[:5],
    }


def _batch_record(p: dict[str, Any], wall_ms: float, sink: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "batch": p["batchId"],
        "trigger_ms": p["durationMs"].get("triggerExecution"),
        "wall_ms": round(wall_ms, 1),
        "input_rows": p.get("numInputRows"),
        "rows_merged": sink.get("rows_merged", 0),
        "merged": sink.get("merged", False),
        "collect_ms": sink.get("collect_ms"),
        "merge_ms": sink.get("merge_ms", 0.0),
    }
    ops = p.get("stateOperators") or []
    if ops:
        rec["state_rows_total"] = ops[0].get("numRowsTotal")
        rec["state_commit_ms"] = ops[0].get("commitTimeMs")
        rec["state_memory_used_bytes"] = ops[0].get("memoryUsedBytes")
    return rec


def run_query(
    spark: Any, run: dict[str, Any], files: Sequence[Path], flush_ms: int
) -> dict[str, Any]:
    """Run one query over ``files``, one micro-batch each, into a new Delta table under
    ``run["work_dir"]``; return its per-batch records and what it sent downstream."""
    from heapstate.buffered import buffered_output
    from pyspark.sql import functions as F

    work = Path(run["work_dir"])
    shutil.rmtree(work, ignore_errors=True)
    (work / "input").mkdir(parents=True)
    sink = work / "sink"
    buffered = run["mode"] == BUFFERED
    setup_started = time.monotonic()
    spark.createDataFrame([], SCHEMA).write.format("delta").save(str(sink))
    if buffered:
        _use_provider(spark, PROVIDERS[run["provider"]])

    sent: dict[int, dict[str, Any]] = {}
    emitted: dict[int, dict[str, int]] = {}

    def write_batch(df: Any, batch_id: int) -> None:
        started = time.monotonic()
        out = df.filter(F.col("page") != SENTINEL) if buffered else _latest_per_page(df)
        # One action computes the batch (and its state) once; the MERGE reads the cached rows.
        out = out.persist()
        try:
            keys = out.select("page", "seq").toArrow().to_pydict()
            collected = time.monotonic()
            merged = bool(keys["page"])
            if merged:  # an empty MERGE would still commit a table version
                _merge(df.sparkSession, sink, out)
        finally:
            out.unpersist()
        sent[batch_id] = {
            "rows_merged": len(keys["page"]),
            "merged": merged,
            "collect_ms": round((collected - started) * 1000, 1),
            "merge_ms": round((time.monotonic() - collected) * 1000, 1) if merged else 0.0,
        }
        emitted[batch_id] = dict(zip(keys["page"], keys["seq"], strict=True))

    events = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(work / "input"))
    )
    if buffered:
        stream = buffered_output(
            events.withWatermark("ts", "0 seconds"),
            "page",
            flush_interval=datetime.timedelta(milliseconds=flush_ms),
            order_by="seq",
            event_time="ts",
        )
        writer = stream.writeStream.outputMode("update")
    else:
        writer = events.writeStream.outputMode("append")
    query = (
        writer.foreachBatch(write_batch)
        .option("checkpointLocation", str(work / "checkpoint"))
        .queryName(f"w4-{run['name']}")
        .start()
    )
    setup_ms = (time.monotonic() - setup_started) * 1000
    batches: list[dict[str, Any]] = []
    try:
        for batch, source in enumerate(files):
            started = time.monotonic()
            drop_file(source, work / "input")
            p = wait_for_batch(query, batch, poll_s=0.02)
            rec = _batch_record(p, (time.monotonic() - started) * 1000, sent.get(batch, {}))
            batches.append(rec)
            if run.get("verbose") and (batch % 10 == 9 or batch == len(files) - 1):
                progress(
                    f"  {run['name']}: batch {batch + 1}/{len(files)}, "
                    f"{sum(b['wall_ms'] for b in batches) / 1000:.1f} s"
                )
    finally:
        query.stop()
    return {
        "batches": batches,
        "emitted": emitted,
        "setup_ms": round(setup_ms, 1),
        "wall_ms": round(sum(b["wall_ms"] for b in batches), 1),
    }


def measure(spark: Any, spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One measured run: the query over all files, then every check."""
    p = spec["params"]
    card = run["cardinality"]
    data_dir = Path(spec["data_dirs"][str(card)])
    buffered = run["mode"] == BUFFERED
    indices = range(p["batches"] + 2) if buffered else range(p["batches"])
    out = run_query(spark, run, [_batch_file(data_dir, i) for i in indices], p["flush_ms"])
    batches = out["batches"]
    table = _table_rows(spark, Path(run["work_dir"]) / "sink")
    against_input = _compare(table, expected_table(data_dir, p["batches"]))
    against_unbuffered: list[str] | None = None  # None: no unbuffered table to compare with
    reference = Path(spec["unbuffered_sinks"][str(card)])
    if buffered and (reference / "_delta_log").is_dir():
        against_unbuffered = _compare(table, _table_rows(spark, reference))
    matches_expected = not against_input
    matches_unbuffered = None if against_unbuffered is None else not against_unbuffered
    mismatches = against_input + [f"vs unbuffered: {m}" for m in against_unbuffered or []]
    checks = _check_emissions(out["emitted"], batch_updates(data_dir, p["batches"]), p["trigger_s"])
    merge_ms = sum(b["merge_ms"] for b in batches)
    events = p["events"] * p["batches"]
    keys_at_end = batches[-1].get("state_rows_total") if buffered else None
    return {
        "name": run["name"],
        "cardinality": card,
        "mode": run["mode"],
        "provider": run.get("provider"),
        "provider_label": PROVIDERS[run["provider"]].label if buffered else UNBUFFERED,
        "events": events,
        "input_batches": len(batches),
        "rows_downstream": sum(b["rows_merged"] for b in batches),
        "merges": sum(1 for b in batches if b["merged"]),
        "wall_ms": out["wall_ms"],
        "throughput_eps": events / (out["wall_ms"] / 1000) if out["wall_ms"] else None,
        "merge_ms": round(merge_ms, 1),
        "wall_ms_outside_merge": round(out["wall_ms"] - merge_ms, 1),
        "trigger_ms_median": statistics.median(
            b["trigger_ms"] for b in batches if b["trigger_ms"] is not None
        ),
        **checks,
        "matches_expected": matches_expected,
        "matches_unbuffered": matches_unbuffered,
        "mismatches": mismatches[:5],
        "buffered_keys_at_end": keys_at_end,
        "checks_passed": (
            matches_expected
            and matches_unbuffered is not False
            and not checks["emission_errors"]
            and keys_at_end in (None, 1)  # only the sentinel key is left buffered
        ),
        "setup_ms": out["setup_ms"],
        "batches": batches,
    }


def warm_up(spark: Any, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Warm the JVM up on scratch tables: an unbuffered run, then a buffered one per provider of
    this process (``WARMUP_BATCHES``), over the smallest cardinality's files."""
    p = spec["params"]
    card = min(int(c) for c in spec["data_dirs"])
    data_dir = Path(spec["data_dirs"][str(card)])
    head = {
        mode: [_batch_file(data_dir, i) for i in range(min(n, p["batches"]))]
        for mode, n in WARMUP_BATCHES.items()
    }
    ends = [_batch_file(data_dir, p["batches"] + i) for i in range(2)]
    plan = [{"mode": UNBUFFERED, "name": "warmup-unbuffered"}] + [
        {"mode": BUFFERED, "provider": name, "name": f"warmup-{name}"}
        for name in spec["warmup_providers"]
    ]
    done = []
    for run in plan:
        run["work_dir"] = str(Path(spec["work_root"]) / "warmup" / run["name"])
        files = head[run["mode"]] + (ends if run["mode"] == BUFFERED else [])
        started = time.monotonic()
        run_query(spark, run, files, p["flush_ms"])
        wall_ms = round((time.monotonic() - started) * 1000, 1)
        done.append({"process": spec["process"], "run": run["name"], "wall_ms": wall_ms})
        progress(f"{spec['process']}: warm-up {run['name']}: {wall_ms / 1000:.1f} s")
    shutil.rmtree(Path(spec["work_root"]) / "warmup", ignore_errors=True)
    return done


def _environment(spark: Any) -> dict[str, Any]:
    jvm = spark.sparkContext._jvm
    return {
        "spark_version": spark.version,
        "python": platform.python_version(),
        "java_version": jvm.java.lang.System.getProperty("java.version"),
        "delta_jar": spark.conf.get("spark.jars.packages"),
    }


def worker(spec: dict[str, Any]) -> None:
    """Generate any missing data, then warm up and run ``spec["runs"]`` in one session, writing
    the results so far to ``spec["out"]`` after each run."""
    p = spec["params"]
    for card, data_dir in spec["data_dirs"].items():
        generate(Path(data_dir), int(card), p)
    # The pandas UDF's Python workers need this Python's pyarrow and heapstate, not python3's.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = _session(spec)
    result: dict[str, Any] = {"environment": _environment(spark), "runs": []}
    try:
        result["warmup"] = warm_up(spark, spec) if spec["warmup"] else []
        for run in spec["runs"]:
            rec = measure(spark, spec, run)
            result["runs"].append(rec)
            Path(spec["out"]).write_text(json.dumps(result, indent=1, default=str) + "\n")
            progress(_describe(rec))
    finally:
        spark.stop()
    Path(spec["out"]).write_text(json.dumps(result, indent=1, default=str) + "\n")


def _describe(rec: dict[str, Any]) -> str:
    ok = rec["checks_passed"]
    latency = rec["added_latency_s_mean"]
    return (
        f"c={rec['cardinality']:<6,} {rec['provider_label']:<20} "
        f"{rec['rows_downstream']:>8,} rows in {rec['merges']:>3} MERGEs, "
        f"{rec['wall_ms'] / 1000:6.1f} s, {rec['throughput_eps'] or 0:8,.0f} events/s, "
        f"latency +{latency or 0:.2f} s mean" + ("" if ok else "  ** MISMATCH **")
    )


# --------------------------------------------------------------------------------------------
# Parent side: plans the runs and the processes, launches them, reports.


def add_ratios(results: list[dict[str, Any]], expected_rows_ratio: float) -> None:
    """Add to each record its ratios against the unbuffered and the buffered HDFS run of its
    cardinality (None where that run is missing)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    for rec in results:
        card = rec["cardinality"]
        unbuf = next(
            (r for r in results if r["cardinality"] == card and r["mode"] == UNBUFFERED), None
        )
        hdfs = next(
            (
                r
                for r in results
                if r["cardinality"] == card and r["mode"] == BUFFERED and r["provider"] == BASELINE
            ),
            None,
        )
        for key, name in (
            ("rows", "rows_downstream"),
            ("merges", "merges"),
            ("wall", "wall_ms"),
            ("throughput", "throughput_eps"),
        ):
            rec[f"{key}_ratio"] = ratio(rec[name], unbuf[name]) if unbuf else None
        rec["expected_rows_ratio"] = expected_rows_ratio
        buffered = rec["mode"] == BUFFERED
        for key, name in (("wall", "wall_ms"), ("throughput", "throughput_eps")):
            rec[f"{key}_ratio_vs_hdfs"] = (
                ratio(rec[name], hdfs[name]) if buffered and hdfs else None
            )


def _fmt_ratio(value: float | None) -> str:
    return f" ({value:.2f}x)" if value is not None else ""


def print_cardinality(card: int, recs: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    """One table: a column per run (unbuffered first), each figure with its ratio."""

    def cell(rec: dict[str, Any], key: str) -> str:
        v = rec.get(key)
        unbuf = rec["mode"] == UNBUFFERED
        if key == "rows_downstream":
            return f"{v:,}" + ("" if unbuf else _fmt_ratio(rec["rows_ratio"]))
        if key == "merges":
            return f"{v:,}" + ("" if unbuf else _fmt_ratio(rec["merges_ratio"]))
        if key == "wall_ms":
            return f"{v / 1000:,.1f} s" + ("" if unbuf else _fmt_ratio(rec["wall_ratio"]))
        if key == "throughput_eps":
            return f"{v:,.0f} ev/s" + ("" if unbuf else _fmt_ratio(rec["throughput_ratio"]))
        if key == "throughput_ratio_vs_hdfs":
            return "-" if v is None else f"{v:.2f}x"
        if key in ("merge_ms", "wall_ms_outside_merge"):
            return f"{v / 1000:,.1f} s"
        if key == "trigger_ms_median":
            return f"{v:,.0f} ms"
        if key in ("added_latency_s_mean", "added_latency_s_max"):
            return "-" if v is None else f"{v:.2f} s"
        if key == "checks_passed":
            return "ok" if v else "MISMATCH"
        return str(v)

    rows = [
        ("rows downstream", "rows_downstream"),
        ("MERGE commits", "merges"),
        ("wall (end to end)", "wall_ms"),
        ("throughput", "throughput_eps"),
        ("  vs buffered HDFS", "throughput_ratio_vs_hdfs"),
        ("time in MERGE", "merge_ms"),
        ("time outside MERGE", "wall_ms_outside_merge"),
        ("median trigger", "trigger_ms_median"),
        ("added latency mean", "added_latency_s_mean"),
        ("added latency max", "added_latency_s_max"),
        ("final table, sends", "checks_passed"),
    ]
    cells = [["", *(r["provider_label"] for r in recs)]]
    cells += [[label, *(cell(r, key) for r in recs)] for label, key in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    first = recs[0]
    print(
        f"\ncardinality {card:,}: {first['events']:,} events; ratios against unbuffered "
        f"(rows: expected about T/F = {first['expected_rows_ratio']:.2f})",
        file=out,
    )
    for i, row in enumerate(cells):
        line = "  ".join(
            c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(row)
        )
        print(line.rstrip(), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)


def print_summary(results: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    """One line per cardinality: the rows ratio and each provider's throughput ratio."""
    labels = [PROVIDERS[n].label for n in PROVIDERS if any(r["provider"] == n for r in results)]
    cards = sorted({r["cardinality"] for r in results})
    cells = [["cardinality", "rows ratio", *(f"{lab} throughput" for lab in labels)]]
    for card in cards:
        recs = [r for r in results if r["cardinality"] == card and r["mode"] == BUFFERED]
        rows = sorted({f"{r['rows_ratio']:.3f}" for r in recs if r["rows_ratio"] is not None})
        row = [f"{card:,}", "/".join(rows) or "-"]
        for lab in labels:
            rec = next((r for r in recs if r["provider_label"] == lab), None)
            row.append("-" if rec is None else _fmt_ratio(rec["throughput_ratio"]).strip(" ()"))
        cells.append(row)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    print("\nbuffered against unbuffered (x):", file=out)
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(widths[j]) for j, c in enumerate(row)), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)


def _git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v.replace("_", "")) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"cardinalities must be positive: {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--cardinalities", type=_ints, help="C: distinct pages, comma-separated")
    parser.add_argument("--events", type=int, help="E: events per micro-batch")
    parser.add_argument("--batches", type=int, help="N: micro-batches of data")
    parser.add_argument("--trigger", type=float, help="T: seconds of event time per batch")
    parser.add_argument("--flush", type=float, help="F: the flush interval, in seconds")
    parser.add_argument("--seed", type=int, default=42, help="seed of the pages drawn")
    parser.add_argument(
        "--providers",
        default="all",
        help=f"comma-separated, run in this order: {','.join(PROVIDERS)} (default: all)",
    )
    parser.add_argument(
        "--isolation",
        choices=["shared", "per-provider"],
        default="shared",
        help="one JVM for every run (default), or one for the unbuffered runs and one per provider",
    )
    parser.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="warm each JVM up on scratch tables before the measured runs (the default but for "
        "--size small)",
    )
    parser.add_argument("--shuffle-partitions", type=int, default=2)
    parser.add_argument("--python", default=str(DEFAULT_PYTHON), help="the workers' Python")
    parser.add_argument("--jar", help="the heapstate jar (default: heapstate.jar_path())")
    parser.add_argument("--driver-memory", default="4g", help="every worker's driver heap")
    add_java_option(parser, "every worker JVM", "-XX:TieredStopAtLevel=1")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra Spark conf for every run (repeatable)",
    )
    parser.add_argument("--data-dir", help="cache of generated files (default: bench/results)")
    parser.add_argument("--work-dir", help="where tables and checkpoints go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep tables and checkpoints")
    parser.add_argument("--out", help="the JSON report (default: bench/results/w4-<time>.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    for name in ("cardinalities", "events", "batches"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(size, name))
    args.trigger = args.trigger if args.trigger is not None else size.trigger_s
    args.flush = args.flush if args.flush is not None else size.flush_s
    args.warmup = args.warmup if args.warmup is not None else size.warmup
    if args.events < 1 or args.batches < 1 or args.shuffle_partitions < 1:
        parser.error("--events, --batches and --shuffle-partitions must be positive")
    if args.trigger * 1000 < 1 or args.flush * 1000 < 1:
        parser.error("--trigger and --flush must be at least 1 ms")
    return args


def plan_processes(
    cards: Sequence[int], providers: Sequence[Provider], isolation: str
) -> list[dict[str, Any]]:
    """The worker processes, in order, each with its runs (cardinality by cardinality, the
    unbuffered run first) and the providers it warms up."""

    def unbuffered(card: int) -> dict[str, Any]:
        return {"cardinality": card, "mode": UNBUFFERED, "name": f"c{card}-{UNBUFFERED}"}

    def buffered(card: int, p: Provider) -> dict[str, Any]:
        return {
            "cardinality": card,
            "mode": BUFFERED,
            "provider": p.name,
            "name": f"c{card}-{p.name}",
        }

    if isolation == "shared":
        runs = [r for c in cards for r in [unbuffered(c), *(buffered(c, p) for p in providers)]]
        return [{"process": "all", "runs": runs, "providers": list(providers)}]
    return [{"process": UNBUFFERED, "runs": [unbuffered(c) for c in cards], "providers": []}] + [
        {"process": p.name, "runs": [buffered(c, p) for c in cards], "providers": [p]}
        for p in providers
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(json.loads(Path(args.spec).read_text()))
        return 0

    providers = parse_providers(args.providers)
    python = args.python
    if not Path(python).exists():
        raise SystemExit(f"--python {python}: no such interpreter (run bin/setup first?)")
    jar = resolve_jar(args.jar, python) if any(p.needs_jar for p in providers) else None

    stamp = timestamp()
    out = Path(args.out) if args.out else RESULTS_DIR / f"w4-{stamp}.json"
    log_dir = out.with_suffix(".logs")
    work_root = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="w4-"))
    work_root.mkdir(parents=True, exist_ok=True)
    jar_copy, jar_info = None, None
    if jar is not None:  # a private copy: a rebuild during the run must not change the classes
        jar_copy = work_root / "heapstate.jar"
        shutil.copyfile(jar, jar_copy)
        jar_info = {"path": str(jar), "sha256": hashlib.sha256(jar_copy.read_bytes()).hexdigest()}

    trigger_ms, flush_ms = round(args.trigger * 1000), round(args.flush * 1000)
    data_params = {
        "events": args.events,
        "batches": args.batches,
        "trigger_ms": trigger_ms,
        "flush_ms": flush_ms,
        "seed": args.seed,
    }
    data_root = Path(args.data_dir) if args.data_dir else RESULTS_DIR / "data"
    data_dirs = {str(c): str(data_root / _data_name(c, data_params)) for c in args.cardinalities}
    jar_version = delta_jar_version()
    params = {
        "cardinalities": list(args.cardinalities),
        "events_per_batch": args.events,
        "batches": args.batches,
        "trigger_s": trigger_ms / 1000,
        "flush_s": flush_ms / 1000,
        "expected_rows_ratio": trigger_ms / flush_ms,
        "seed": args.seed,
        "shuffle_partitions": args.shuffle_partitions,
        "isolation": args.isolation,
        "warmup": args.warmup,
        "driver_memory": args.driver_memory,
        "java_options": args.java_option,
        "delta_jar_version": jar_version,
        "providers": [p.name for p in providers],
        "spark_confs": parse_confs(args.conf),
    }
    processes = plan_processes(args.cardinalities, providers, args.isolation)
    progress(
        f"W4: C={'/'.join(str(c) for c in args.cardinalities)} E={args.events:,} "
        f"N={args.batches} T={args.trigger:g}s F={args.flush:g}s, providers "
        f"{', '.join(p.name for p in providers)}, {args.isolation} JVM; logs in {log_dir}"
    )

    results: list[dict[str, Any]] = []
    warmups: list[dict[str, Any]] = []
    environment: dict[str, Any] = {}
    failures: dict[str, str] = {}
    started = time.monotonic()
    try:
        for proc in processes:
            spec = {
                "process": proc["process"],
                "params": {**data_params, "trigger_s": trigger_ms / 1000},
                "runs": [
                    {**r, "work_dir": str(work_root / r["name"]), "verbose": True}
                    for r in proc["runs"]
                ],
                "data_dirs": data_dirs,
                "unbuffered_sinks": {
                    str(c): str(work_root / f"c{c}-{UNBUFFERED}" / "sink")
                    for c in args.cardinalities
                },
                "warmup": args.warmup,
                "warmup_providers": [p.name for p in proc["providers"]],
                "work_root": str(work_root / f"scratch-{proc['process']}"),
                "shuffle_partitions": args.shuffle_partitions,
                "spark_confs": params["spark_confs"],
                "out": str(work_root / f"{proc['process']}.out.json"),
            }
            spec_path = work_root / f"{proc['process']}.spec.json"
            spec_path.write_text(json.dumps(spec, indent=2))
            jars = [jar_copy] if jar_copy and any(p.needs_jar for p in proc["providers"]) else []
            env = {
                "PYSPARK_SUBMIT_ARGS": pyspark_submit_args(
                    args.driver_memory, jars, java_options=args.java_option
                )
            }
            try:
                run_worker(
                    python,
                    SCRIPT,
                    ["--worker", "--spec", str(spec_path)],
                    log_dir / f"{proc['process']}.log",
                    env,
                )
            except RuntimeError as err:  # one process failing must not lose the others
                failures[proc["process"]] = str(err)
                progress(f"{proc['process']}: FAILED: {err}")
            done = Path(spec["out"])
            if done.exists():  # written after each run, so a failed process keeps its runs
                got = json.loads(done.read_text())
                results += got["runs"]
                warmups += got.get("warmup", [])
                environment = environment or got["environment"]
    finally:
        if not args.keep and not args.work_dir:
            shutil.rmtree(work_root, ignore_errors=True)
    if not results:
        raise SystemExit(f"every run failed; logs in {log_dir}")
    elapsed = time.monotonic() - started

    add_ratios(results, params["expected_rows_ratio"])
    order = {UNBUFFERED: -1, **{n: i for i, n in enumerate(PROVIDERS)}}
    results.sort(key=lambda r: (r["cardinality"], order[r["provider"] or UNBUFFERED]))
    print(
        f"\nW4 buffered output: E={args.events:,} events per batch, N={args.batches} batches, "
        f"T={args.trigger:g} s, F={args.flush:g} s, Spark {environment.get('spark_version')}, "
        f"{args.isolation} JVM{'' if args.warmup else ', no warm-up'}"
        + (f", JVM options {' '.join(args.java_option)}" if args.java_option else "")
        + f"; {elapsed:.0f} s in all"
    )
    for card in args.cardinalities:
        recs = [r for r in results if r["cardinality"] == card]
        if recs:
            print_cardinality(card, recs)
    print_summary(results)

    bad = [r for r in results if not r["checks_passed"]]
    report = {
        "benchmark": "W4",
        "timestamp": stamp,
        "size": args.size,
        "params": params,
        "environment": environment,
        "heapstate_jar": jar_info,
        "python": python,
        "git": _git_state(),
        "host": host_info(),
        "elapsed_s": round(elapsed, 1),
        "warmup": warmups,
        "results": results,
        "failures": failures,
    }
    print(f"\nJSON: {write_json(out, report)}")
    for rec in bad:
        print(
            f"\n*** MISMATCH: cardinality {rec['cardinality']}, {rec['provider_label']}: "
            f"matches input {rec['matches_expected']}, matches unbuffered "
            f"{rec['matches_unbuffered']}, {rec['emission_errors']} send errors, "
            f"{rec['buffered_keys_at_end']} keys buffered at the end ***",
            file=sys.stderr,
        )
        for line in rec["mismatches"] + rec["emission_error_examples"]:
            print(f"    {line}", file=sys.stderr)
    for name, err in failures.items():
        print(f"{name} FAILED (see {log_dir / (name + '.log')}): {err.splitlines()[0]}")
    return 1 if failures or bad else 0


if __name__ == "__main__":
    sys.exit(main())
