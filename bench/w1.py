"""W1, incremental checkpoint: what each state store provider writes and spends per batch.

Compares heapstate, HDFS and RocksDB (with and without changelog checkpointing) side by side in
one invocation, as W1 in the project's BENCHMARKS.md describes::

    .venv/bin/python bench/w1.py --size small
    .venv/bin/python bench/w1.py --size full --providers hdfs,rocksdb-changelog,heapstate
    .venv/bin/python bench/w1.py --keys 200000 --payload 128 --updates 5000 --batches 10
    .venv/bin/python bench/w1.py --size small --python .venv-spark43/bin/python

The data: K keys (``k long``), each with a payload of P random-looking hex characters (sha2 of
the key and the batch). Batch 0 inserts every key; each later batch updates U keys drawn with a
seeded generator. One parquet file per batch, generated once with pyarrow and cached under
``bench/results/data/``. The query, ``groupBy(k).agg(last(v), count(*))`` in update mode into a
noop sink on ``local[2]`` with 4 shuffle partitions, reads the folder with
``maxFilesPerTrigger=1``: the script drops one file at a time and waits for its batch, so every
batch is exactly one file.

Each provider runs in its own Python and JVM, one after another, so runs never share the two
cores. After the batches, a restart in a fresh process (cold: no state in memory) drops one more
file and times that first batch.

It prints, per provider and with ratios to HDFS: median and max trigger ms (batches 2 and later),
median commit ms, ``memoryUsedBytes``, the JVM's retained heap after full GCs, the bytes each batch
adds under ``<checkpoint>/state`` (median, and max), the total after the last batch and the
restart's first batch, and the GC pauses of the steady batches from the JVM's own GC log
(``_common.GC_LOG_TAGS``). Then heapstate's pass/fail lines for W1's targets. JSON with every
per-batch figure goes to ``bench/results/w1-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _probe
from _common import (
    BASELINE,
    BATCH_COUNTS,
    CPU_SPLIT_KINDS,
    DEFAULT_PYTHON,
    MAINTENANCE_CONF,
    PROVIDERS,
    REPO_DIR,
    RESULTS_DIR,
    Metric,
    Provider,
    StateFiles,
    add_java_option,
    describe_pause,
    drop_file,
    file_kind,
    fmt_bytes,
    fmt_ms,
    fmt_ms_fine,
    gc_mark_cycles,
    gc_pauses,
    heap_after_full_gcs,
    host_info,
    jvm_heap_after_gc,
    jvm_pid,
    marking_ms_between,
    maximum,
    median,
    parse_confs,
    parse_providers,
    pause_records_between,
    pauses_between,
    print_comparison,
    proc_counters,
    progress,
    pyspark_submit_args,
    recovery_chains,
    resolve_jar,
    run_worker,
    slowest_batch_detail,
    timestamp,
    wait_for_batch,
    write_json,
)

SCRIPT = Path(__file__).resolve()
STEADY_FROM = 2
"""Trigger and commit figures are taken over batches with this id and later: batch 0 loads every
key and batch 1 is the first to update them (class loading, JIT, first delta)."""
RUN_WARMUP = 90
"""Batches of the same query and provider that a fresh worker JVM runs on a scratch checkpoint
before a measured run (``--warmup-batches``). Without them the JIT compiler is still busy
through the measured batches, compiling Spark's own per-batch code (planning, mostly). In a
heapstate W5 run at K=4M on a 2-core machine (``perf sched``, 26 November), the compiler threads
took 3.05 of the 10 CPU-seconds of 5 s of batches 1 to 11, more than the task threads' 1.97, and
were what preempted those most (615 times, 488 ms of waiting). After 30 warm-up batches (10 to
15 s): 1.59 of 8 CPU-seconds in 4 s, and 145 ms of waiting. 30 were still not enough: in twelve
alternating pairs of heapstate W1 runs (stop 40), 90 warm-up batches gave a lower median trigger
than 30 in every pair (355 against 400 ms, the means), and JFR still counted 3.6 s of JIT
compilation in batches 10 to 29 after 30. Every provider gets the same warm-up."""
WARMUP_SCALE = 10
"""A run's warm-up (RUN_WARMUP) reads a data set of its own, of the same shape at a tenth of the
scale: K/10 keys in its batch 0, then two files of U/10 keys (of those K/10) in turn. Until stop
49 it took the measured data's files 1 and 2 (U keys each) in turn, so its state held 2U keys
and every batch rewrote half of it: a store's code paths for a state where most keys stay put
between snapshots, and for a first batch of many keys, never ran, and the JIT compiled them in
the measured batches. In a heapstate W1 run (stop 49, JFR), the C2 compiler spent about 0.5 s on
heapstate's snapshot writer and reader in batches 10 to 13, those of the first snapshots that
copied unchanged buckets (the writer's loop compiled again after its copying branch was first
taken), and those batches were the slowest of the run. At a tenth of the scale each of W1's four
stores holds 25,000 keys, and ten batches touch about 500 of them. Every provider gets the same
warm-up.
W5 warms each K's runs up the same way (from stop 51): until then its warm-up cycled the measured
files 1 and 2, and in an all-provider W5 run at 4M (stop 50, JFR) C2 compiled the snapshot
writer's copying branch in the measured batches 5 to 7 (456 ms), those of the first snapshot that
copied unchanged buckets."""
PRETOUCH = "-XX:+AlwaysPreTouch"
"""The JVM option of ``--pretouch``: the JVM writes each page of heap when it commits it, not
when the program first uses it, so the kernel's first-touch page faults land when the heap grows
(at start, or in the GC pause that grows it) instead of in the batches that first use the pages.
Off by default: the default measures as BENCHMARKS.md's reference figures did."""
RESTART_JOURNALS = 9
"""W1's recovery target names a restart with 10 journals after the last snapshot. heapstate, which
snapshots each store every 10 versions, has at most 9 above its snapshot when it stops, and the
restart's own batch writes the 10th (HDFS, which snapshots once a store has more than 10 deltas,
can have more). So before fresh-process restarts, a run goes on with lead-in
batches (not among the measured ones) until a restart would read at least this many journals
above a snapshot in some store (``--restart-journals``). Without them, where the restart fell in
each provider's snapshot cycle was chance: in ``w1-stop69a`` HDFS restarted on 0 to 2 deltas above
its snapshots and heapstate on up to 10, and the target failed by 18 ms."""
LEAD_IN_MAX = 20
"""At most this many lead-in batches: twice a snapshot cycle of 10 versions."""
LEAD_IN_SETTLE_MARGIN_S = 3.0
"""Past one maintenance interval, how long the lead-in waits before it reads the chains again,
and between the reads that follow (see ``_lead_in``): time for a snapshot that the maintenance
pass began to reach the disk. An HDFS snapshot of a W1 store (250,000 keys) takes about a second."""
LEAD_IN_SETTLE_READS = 5
"""The most reads of the chains after one wait, until two agree."""


def add_jvm_arguments(parser: argparse.ArgumentParser, heap_example: str) -> None:
    """``--pretouch`` and ``--java-option``, which W1 and W5 share; see ``worker_java_options``."""
    parser.add_argument(
        "--pretouch",
        action="store_true",
        help=f"start every worker JVM with {PRETOUCH} (see PRETOUCH in w1.py)",
    )
    add_java_option(parser, "every worker JVM", heap_example)
    parser.add_argument(
        "--warmup-batches",
        type=int,
        metavar="N",
        help="before a run's measured batches, run N small batches of the same query and provider "
        f"on a scratch checkpoint in the same JVM (see _warm_up; default {RUN_WARMUP} with a JVM "
        "per provider, 0 in a shared one)",
    )


def add_probe_argument(parser: argparse.ArgumentParser) -> None:
    """``--no-probe``, which W1 and W5 share: see bench/_probe.py."""
    parser.add_argument(
        "--no-probe",
        dest="probe",
        action="store_false",
        help="do not run the machine-speed probe beside the runs (bench/_probe.py), which takes "
        "about 1%% of one core and gives each batch its probe_us",
    )


def resolve_warmup(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--warmup-batches``' default: RUN_WARMUP with a JVM per provider, none in a shared JVM
    (``--size small``, a quick check, where later runs find the JVM warm anyway)."""
    if args.warmup_batches is None:
        args.warmup_batches = RUN_WARMUP if args.jvm == "per-provider" else 0
    if args.warmup_batches < 0:
        parser.error("--warmup-batches must be 0 or more")


def worker_java_options(args: argparse.Namespace) -> list[str]:
    """The worker JVMs' extra options that ``add_jvm_arguments``'s flags ask for."""
    return [*args.java_option, *([PRETOUCH] if args.pretouch else [])]


@dataclass(frozen=True)
class Size:
    keys: int
    payload: int
    updates: int
    batches: int
    restart: str = "fresh-process"
    jvm: str = "per-provider"


SIZES: dict[str, Size] = {
    # Small is a quick check that everything runs, in about a minute: all providers share one
    # JVM and restart in it, rather than spending two JVM starts per provider.
    "small": Size(
        keys=10_000, payload=256, updates=1_000, batches=4, restart="same-process", jvm="shared"
    ),
    "full": Size(keys=1_000_000, payload=256, updates=10_000, batches=15),
    "k4m": Size(keys=4_000_000, payload=64, updates=10_000, batches=15),
    "k100k": Size(keys=100_000, payload=256, updates=10_000, batches=15),
}


# --------------------------------------------------------------------------------------------
# Worker side: runs inside the per-provider (or data-generating) Python process.


def _session(spec: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"heapstate-bench-w1-{spec.get('provider', 'data')}")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in spec.get("spark_confs", {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _batch_file(data_dir: Path, batch: int) -> Path:
    return data_dir / f"batch-{batch:05d}.parquet"


def payload(key: int, batch: int, width: int) -> str:
    """``width`` hex characters: sha256 of ``k:batch``, then of ``k:batch:j`` for j = 1, 2, ...
    concatenated, so the payload never compresses like a repeated string. The same as Spark's
    ``substring(concat(sha2(concat(k, ':batch'), 256), ...), 1, width)``, which wrote the data
    until stop 61."""
    pieces = [hashlib.sha256(f"{key}:{batch}".encode()).hexdigest()]
    for j in range(1, math.ceil(width / 64)):
        pieces.append(hashlib.sha256(f"{key}:{batch}:{j}".encode()).hexdigest())
    return "".join(pieces)[:width]


def update_keys(keys: int, updates: int, seed: int, batch: int) -> list[int]:
    """The keys batch ``batch`` (1 or later) updates: ``updates`` distinct keys, seeded."""
    return random.Random(f"{seed}:{batch}").sample(range(keys), min(updates, keys))


def warmup_shape(params: dict[str, Any]) -> dict[str, int]:
    """The keys and updates of the warm-up data set of a run with ``params`` (WARMUP_SCALE)."""
    return {
        "keys": max(params["keys"] // WARMUP_SCALE, 1),
        "updates": max(params["updates"] // WARMUP_SCALE, 1),
    }


def generate_warmup_data(
    python: str,
    params: dict[str, Any],
    data_root: Path,
    work_root: Path,
    log_dir: Path,
    env: dict[str, str],
) -> str:
    """Write (when missing) the warm-up data set of a measured run with ``params`` (see
    WARMUP_SCALE): K/10 keys in batch 0, then two files of U/10 of them. W1 and W5 share it.
    Returns its folder, the ``warmup_data_dir`` of the run's spec."""
    warm = {**params, **warmup_shape(params)}
    name = f"w1-warmup-k{warm['keys']}-p{warm['payload']}-u{warm['updates']}-s{warm['seed']}"
    spec = {**warm, "files": 3, "data_dir": str(data_root / name)}
    run_worker(
        python,
        SCRIPT,
        ["--worker", "generate", "--spec", str(_spec_file(work_root, f"generate-{name}", spec))],
        log_dir / "generate-warmup.log",
        env,
    )
    return spec["data_dir"]


GENERATE_CHUNK = 250_000
"""Rows of a generated file made and written at a time, as one row group: batch 0 of 4M keys is
written in 16, so that no more than one piece's Python strings are in memory at once."""


def worker_generate(spec: dict[str, Any]) -> None:
    """Write the missing batch files: batch 0 has every key, later batches U seeded keys.

    With pyarrow, in this process: no JVM. A Spark session took about 45 s to write the four
    files of a 5,000-key data set on a 2-core machine beside another pytest worker. Columns
    ``k`` (int64) and ``v`` (string), both nullable, plain-encoded and snappy-compressed, as
    Spark wrote them (its dictionary encoding falls back to plain on these payloads): the files
    are within 1% of the size of Spark's (``tests/python/test_bench_data.py`` checks the rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_dir = Path(spec["data_dir"])
    data_dir.mkdir(parents=True, exist_ok=True)
    missing = [b for b in range(spec["files"]) if not _batch_file(data_dir, b).exists()]
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    for batch in missing:
        started = time.monotonic()
        if batch == 0:
            keys: Sequence[int] = range(spec["keys"])
        else:
            keys = update_keys(spec["keys"], spec["updates"], spec["seed"], batch)
        hidden = data_dir / f".gen-{batch}-{os.getpid()}.parquet"
        try:
            with pq.ParquetWriter(
                hidden, schema, compression="snappy", use_dictionary=False
            ) as writer:
                for at in range(0, len(keys), GENERATE_CHUNK):
                    chunk = keys[at : at + GENERATE_CHUNK]
                    values = [payload(k, batch, spec["payload"]) for k in chunk]
                    writer.write_table(pa.table({"k": list(chunk), "v": values}, schema=schema))
            os.replace(hidden, _batch_file(data_dir, batch))
        finally:
            hidden.unlink(missing_ok=True)  # only there if writing it failed
        progress(
            f"data: batch {batch} written ({time.monotonic() - started:.1f} s, "
            f"{fmt_bytes(_batch_file(data_dir, batch).stat().st_size)})"
        )


def _drop_file(data_dir: Path, input_dir: Path, batch: int) -> None:
    drop_file(_batch_file(data_dir, batch), input_dir)


def _start_query(spark: Any, input_dir: Path, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    stream = (
        spark.readStream.schema("k long, v string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(input_dir))
    )
    counts = stream.groupBy("k").agg(F.last("v").alias("v"), F.count("*").alias("n"))
    return (
        counts.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def _batch_record(
    p: dict[str, Any], wall_ms: float, files: dict[str, Any], window: tuple[float, float]
) -> dict[str, Any]:
    ops = p.get("stateOperators") or [{}]
    op = ops[0]
    return {
        "batch": p["batchId"],
        "trigger_ms": p["durationMs"].get("triggerExecution"),
        "commit_ms": op.get("commitTimeMs"),
        "memory_used_bytes": op.get("memoryUsedBytes"),
        "num_rows_total": op.get("numRowsTotal"),
        "num_rows_updated": op.get("numRowsUpdated"),
        "input_rows": p.get("numInputRows"),
        "wall_ms": round(wall_ms, 1),
        "state_bytes_total": files["total"],
        "state_bytes_delta": files["delta"],
        "state_bytes_new": files["new"],
        "state_files": files["files"],
        "state_bytes_total_by_kind": files["total_by_kind"],
        "state_bytes_new_by_kind": files["new_by_kind"],
        "new_snapshot_versions": files["new_snapshot_versions"],
        "start_epoch_ms": round(window[0]),
        "end_epoch_ms": round(window[1]),
        "duration_ms": p["durationMs"],
        "custom_metrics": op.get("customMetrics", {}),
    }


def _run_one_batch(
    spark_query: Any, spec: dict[str, Any], batch: int, files: StateFiles, pid: int
) -> dict[str, Any]:
    """Run one batch; its record also holds what Linux counted for the worker JVM (``pid``) and
    the machine meanwhile (``ProcCounters``)."""
    data_dir, input_dir = Path(spec["data_dir"]), Path(spec["work_dir"]) / "input"
    before = proc_counters(pid)
    started, start_epoch = time.monotonic(), time.time() * 1000
    _drop_file(data_dir, input_dir, batch)
    p = wait_for_batch(spark_query, batch)
    wall_ms = (time.monotonic() - started) * 1000
    end_epoch, after = time.time() * 1000, proc_counters(pid)
    rec = _batch_record(p, wall_ms, files.step(), (start_epoch, end_epoch))
    if before is not None and after is not None:
        rec.update(after.since(before))
    return rec


def longest_chain(chains: list[dict[str, Any]]) -> int:
    """The most journals above a snapshot that a restart reads in any one store (0: none)."""
    return max((c["journals_above"] for c in chains), default=0)


def _lead_in(
    query: Any,
    spec: dict[str, Any],
    files: StateFiles,
    pid: int,
    first: int,
    settle_s: float = 0.0,
    settles: list[dict[str, Any]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """Run batches ``first``, ``first + 1`` and so on until a restart would read at least
    ``restart_journals`` journals above a snapshot in some store (see RESTART_JOURNALS), or
    LEAD_IN_MAX batches ran; none for a provider that writes no journals (RocksDB without
    changelog checkpointing). Their records are kept apart from the measured batches'.

    The chains are read from the files after each batch. A snapshot that a provider's maintenance
    writes in the background after that read would leave the restart fewer journals than the
    lead-in saw: HDFS snapshots a store once it has more than 10 deltas above its snapshot, so in
    ``w1-stop72a`` and ``w1-stop72b`` two or three stores that the measured batches had left with
    11 or more were snapshotted just after the chains were read, and HDFS's restarts read the
    other stores' 2 to 6 deltas. So once the chains are long enough, the lead-in waits
    ``settle_s`` (a maintenance interval and LEAD_IN_SETTLE_MARGIN_S), then reads them again
    every LEAD_IN_SETTLE_MARGIN_S until two reads agree (a maintenance pass may snapshot the
    stores one after another; at most LEAD_IN_SETTLE_READS reads), and goes on with batches if
    they got shorter. Each wait goes to ``settles`` (the batches run before it and the chains
    before and after). The restart still records the chains it read (``recovery_chains``).
    ``sleep`` waits (tests pass their own)."""
    state = Path(spec["work_dir"]) / "checkpoint" / "state"
    records: list[dict[str, Any]] = []
    if not any(file_kind(f.name) == "journal" for f in state.rglob("*")):
        progress(f"{_run_name(spec):<18} lead-in: none, the provider writes no journals")
        return records
    wanted = spec["restart_journals"]
    chains = recovery_chains(state)
    while True:
        if longest_chain(chains) >= wanted:
            if settle_s <= 0:
                break
            sleep(settle_s)
            settled = recovery_chains(state)
            for _ in range(LEAD_IN_SETTLE_READS - 1):
                sleep(LEAD_IN_SETTLE_MARGIN_S)
                again = recovery_chains(state)
                if again == settled:
                    break
                settled = again
            if settles is not None:
                settles.append({"after_batches": len(records), "before": chains, "after": settled})
            if longest_chain(settled) >= wanted:
                break
            progress(
                f"{_run_name(spec):<18} lead-in: {longest_chain(chains)} journals above a "
                f"snapshot became {longest_chain(settled)} within {settle_s:.0f} s (a snapshot "
                "written in the background); more batches"
            )
            chains = settled
            continue
        if len(records) == LEAD_IN_MAX:
            progress(
                f"{_run_name(spec):<18} lead-in: {LEAD_IN_MAX} batches and no store with "
                f"{wanted} journals above a snapshot; restarting anyway"
            )
            break
        rec = _run_one_batch(query, spec, first + len(records), files, pid)
        chains = rec["recovery_chains"] = recovery_chains(state)
        records.append(rec)
        progress(_describe(_run_name(spec), f"lead-in batch {rec['batch']}", rec))
    return records


_TIME_UNITS_S = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
"""Spark's time-string units (``JavaUtils.timeStringAs``), in seconds."""


def maintenance_seconds(value: str | None) -> float:
    """Spark's ``spark.sql.streaming.stateStore.maintenanceInterval`` in seconds, read as Spark
    reads a time string: an integer and an optional unit (us, ms, s, m, min, h, d), without one
    milliseconds (this conf's unit; unset, Spark gives its default as ``60000``); None: 60 s."""
    if value is None:
        return 60.0
    found = re.fullmatch(r"(-?[0-9]+)([a-z]+)?", value.strip().lower())
    if found is None or (found.group(2) is not None and found.group(2) not in _TIME_UNITS_S):
        raise ValueError(f"{MAINTENANCE_CONF}: not a time: {value!r}")
    return int(found.group(1)) * _TIME_UNITS_S[found.group(2) or "ms"]


def _describe(provider: str, what: str, rec: dict[str, Any]) -> str:
    return (
        f"{provider:<18} {what}: trigger {fmt_ms(rec['trigger_ms'] or 0)}, "
        f"commit {fmt_ms(rec['commit_ms'] or 0)}, state +{fmt_bytes(rec['state_bytes_new'])} "
        f"(total {fmt_bytes(rec['state_bytes_total'])}), "
        f"memoryUsed {fmt_bytes(rec['memory_used_bytes'] or 0)}"
        + (
            f", {rec['minor_faults']:,} minor faults, JVM CPU {fmt_ms(rec['jvm_cpu_ms'])}"
            if "minor_faults" in rec
            else ""
        )
    )


def _restart(spark: Any, spec: dict[str, Any], files: StateFiles) -> dict[str, Any]:
    """Start a new query on the checkpoint, with the next file already in place, and time it."""
    work = Path(spec["work_dir"])
    batch = spec.get("restart_batch", spec["batches"])
    chains = recovery_chains(work / "checkpoint" / "state")
    _drop_file(Path(spec["data_dir"]), work / "input", batch)
    started, start_epoch = time.monotonic(), time.time() * 1000
    query = _start_query(spark, work / "input", work / "checkpoint")
    try:
        p = wait_for_batch(query, batch)
        wall_ms = (time.monotonic() - started) * 1000
        end_epoch = time.time() * 1000
    finally:
        query.stop()
    rec = _batch_record(p, wall_ms, files.step(), (start_epoch, end_epoch))
    rec["mode"] = spec["restart"]
    rec["state_bytes_before"] = rec["state_bytes_total"] - rec["state_bytes_delta"]
    rec["recovery_chains"] = chains
    progress(_describe(_run_name(spec), f"restart, batch {batch} ({spec['restart']})", rec))
    progress(
        f"{_run_name(spec):<18} restart read, per store: "
        + ", ".join(f"snapshot {c['snapshot']} + {c['journals_above']} journals" for c in chains)
    )
    return rec


def _environment(spark: Any) -> dict[str, Any]:
    jvm = spark.sparkContext._jvm
    runtime = jvm.java.lang.Runtime.getRuntime()
    return {
        "spark_version": spark.version,
        "python": platform.python_version(),
        "java_version": jvm.java.lang.System.getProperty("java.version"),
        "jvm_max_heap": int(runtime.maxMemory()),
        "available_processors": int(runtime.availableProcessors()),
        "spark_plugins": spark.sparkContext.getConf().get("spark.plugins", ""),
    }


def _run_batches(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Run the batches on a fresh checkpoint; then restart unless it runs in another process."""
    work = Path(spec["work_dir"])
    shutil.rmtree(work, ignore_errors=True)
    (work / "input").mkdir(parents=True)
    warmup = spec.get("warmup_batches", 0)
    warmup_triggers = _warm_up(spark, spec, warmup, "run") if warmup > 0 else None
    result: dict[str, Any] = {
        "warmup_trigger_ms": warmup_triggers,
        "environment": _environment(spark),
        "maintenance_interval": spark.conf.get(MAINTENANCE_CONF),
        "heap_baseline": jvm_heap_after_gc(spark),
    }
    # Read before the batches, so that a value the lead-in cannot read costs no run.
    settle_s = maintenance_seconds(result["maintenance_interval"]) + LEAD_IN_SETTLE_MARGIN_S
    files = StateFiles(work / "checkpoint" / "state")
    query = _start_query(spark, work / "input", work / "checkpoint")
    batches = []
    pid = jvm_pid(spark)
    try:
        for batch in range(spec["batches"]):
            rec = _run_one_batch(query, spec, batch, files, pid)
            batches.append(rec)
            progress(_describe(_run_name(spec), f"batch {batch}/{spec['batches'] - 1}", rec))
        # Taken while the query is live, so the loaded state stores count.
        result["heap_after"] = jvm_heap_after_gc(spark)
        if spec.get("restart_journals"):
            result["restart_journals"] = spec["restart_journals"]
            result["lead_in_settles"] = []
            result["lead_in"] = _lead_in(
                query, spec, files, pid, len(batches), settle_s, result["lead_in_settles"]
            )
    finally:
        query.stop()
    result["batches"] = batches
    if spec["restart"] == "same-process":
        result["restart"] = _restart(spark, spec, files)
    return result


def worker_run(spec: dict[str, Any]) -> None:
    """One provider's batches in this process's own JVM."""
    spark = _session(spec)
    try:
        result = _run_batches(spark, spec)
        Path(spec["out"]).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        spark.stop()


def _run_name(spec: dict[str, Any]) -> str:
    """A run's name in a shared JVM: the provider's, unless the spec names the run (W5 runs each
    provider at several sizes)."""
    return str(spec.get("run_name", spec["provider"]))


def worker_run_shared(spec: dict[str, Any]) -> None:
    """Every provider's batches, one after another, in this one JVM (``--jvm shared``).

    The provider is a SQL conf that a query reads when it starts (and pins in its checkpoint),
    so each provider's confs are set on the session before its query and unset after it."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    spark = _session({"provider": "shared", "spark_confs": spec["common_confs"]})
    results: dict[str, Any] = {}
    try:
        for provider_spec in spec["providers"]:
            confs = provider_spec["provider_confs"]
            for key, value in confs.items():
                spark.conf.set(key, value)
            try:
                results[_run_name(provider_spec)] = _run_batches(spark, provider_spec)
            # One provider failing must not lose the others.
            except (RuntimeError, TimeoutError, PySparkException, Py4JError) as err:
                results[_run_name(provider_spec)] = {"error": f"{type(err).__name__}: {err}"}
                progress(f"{provider_spec['provider']}: FAILED: {err}")
            finally:
                for key in confs:
                    spark.conf.unset(key)
        Path(spec["out"]).write_text(json.dumps(results, indent=2) + "\n")
    finally:
        spark.stop()


def _warm_up(
    spark: Any, spec: dict[str, Any], batches: int = 2, what: str = "restart"
) -> list[float]:
    """Run the same query with the same provider over ``batches`` small batches on a scratch
    checkpoint, so that a figure measured next in this JVM is the provider's work, not the JVM's
    start (class loading, JIT, code generation). A restart's batches take data files 1 and 2 in
    turn (U keys each), so the scratch state stays at 2U keys at most. A run's take the warm-up
    data set when the spec names one (``warmup_data_dir``, see WARMUP_SCALE): its K/10 keys, then
    its two files of U/10 keys in turn. Returns their trigger ms.

    A restart takes two. A run (``--warmup-batches``) may take more: in a fresh JVM the JIT
    compiler is still busy through the first few dozen batches (compiling Spark's planning code,
    mostly), and on two cores it takes its time from the tasks."""
    scratch = Path(spec["work_dir"]) / "warmup"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "input").mkdir(parents=True)
    query = _start_query(spark, scratch / "input", scratch / "checkpoint")
    triggers = []
    warm_data = spec.get("warmup_data_dir") if what == "run" else None
    try:
        for batch in range(batches):
            if warm_data:  # see WARMUP_SCALE: its batch 0 first, then its batches 1 and 2 in turn
                data_file = _batch_file(Path(warm_data), 0 if batch == 0 else 1 + (batch - 1) % 2)
            else:
                data_file = _batch_file(Path(spec["data_dir"]), 1 + batch % 2)
            drop_file(data_file, scratch / "input", f"warmup-{batch:05d}.parquet")
            triggers.append(wait_for_batch(query, batch)["durationMs"]["triggerExecution"])
    finally:
        query.stop()
    shutil.rmtree(scratch, ignore_errors=True)
    progress(
        f"{_run_name(spec):<18} {what} warm-up: {batches} batches, median trigger "
        f"{median(triggers):.0f} ms, last {triggers[-1]} ms"
    )
    return triggers


def worker_restart(spec: dict[str, Any]) -> None:
    """Restart from the checkpoint in a fresh JVM: no provider has state in memory."""
    files = StateFiles(Path(spec["work_dir"]) / "checkpoint" / "state")
    files.sizes = files.inventory()
    spark = _session(spec)
    try:
        warmup = _warm_up(spark, spec) if spec["restart_warmup"] else None
        result = {"restart": {**_restart(spark, spec, files), "warmup_trigger_ms": warmup}}
        Path(spec["out"]).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        spark.stop()


WORKERS = {
    "generate": worker_generate,
    "run": worker_run,
    "run-shared": worker_run_shared,
    "restart": worker_restart,
}


# --------------------------------------------------------------------------------------------
# Parent side: plans the runs, launches the workers one after another, reports.


def steady_pause_records(run: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """The GC pauses of ``run`` that ended inside its steady batches, each with its batch number,
    in batch order (the order of ``run``'s pauses within a batch)."""
    return [
        (b["batch"], p)
        for b in run["batches"]
        if b["batch"] >= STEADY_FROM and b.get("start_epoch_ms") is not None
        for p in pause_records_between(
            run.get("gc_pauses", []), b["start_epoch_ms"], b["end_epoch_ms"]
        )
    ]


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The figures W1 reports for one provider, from its per-batch series."""
    batches = run["batches"]
    steady = [b for b in batches if b["batch"] >= STEADY_FROM]
    updates = [b for b in batches if b["batch"] >= 1]
    trigger = [b["trigger_ms"] for b in steady if b["trigger_ms"] is not None]
    commit = [b["commit_ms"] for b in steady if b["commit_ms"] is not None]
    restart = run.get("restart") or {}
    restarts = run.get("restarts") or ([restart] if restart else [])
    restart_loads = [(r.get("custom_metrics") or {}).get("heapstateLoadMs") for r in restarts]
    during = compaction_batches(batches)
    compaction_commit = [b["commit_ms"] for b in steady if b["batch"] in during]
    other_commit = [b["commit_ms"] for b in steady if b["batch"] not in during]
    pause_records = steady_pause_records(run)
    steady_pauses = [p["pause_ms"] for _, p in pause_records]
    # The longest of them, with the batch it ended in (W5's pooled rounds number their batches
    # alike: w5.per_round_figures names the round).
    longest = max(pause_records, key=lambda bp: bp[1]["pause_ms"], default=None)
    cycles = run.get("gc_mark_cycles")
    timed = [
        b for b in steady if b.get("start_epoch_ms") is not None and b["trigger_ms"] is not None
    ]
    slowest = max(timed, key=lambda b: b["trigger_ms"], default=None)

    def marking(b: dict[str, Any]) -> float:
        return marking_ms_between(cycles or [], b["start_epoch_ms"], b["end_epoch_ms"])

    # G1 marking beside each timed steady batch, once (None: the run's report read no cycles).
    marked = [marking(b) for b in timed] if cycles is not None else None

    def commit_part(metric: str) -> float | None:
        """The median over the steady batches of a heapstate commit-time metric, in ms."""
        parts = [(b.get("custom_metrics") or {}).get(metric) for b in steady]
        return median([v / 1000 for v in parts if v is not None])

    counted = {key: [b[key] for b in steady if b.get(key) is not None] for key in BATCH_COUNTS}
    phase = grown_phase(steady, slowest)
    heap_after = heap_after_full_gcs(run.get("heap_after"))
    heap_base = heap_after_full_gcs(run.get("heap_baseline"))
    return {
        "trigger_ms_median": median(trigger),
        "trigger_ms_max": maximum(trigger),
        "commit_ms_median": median(commit),
        "compaction_batches": sorted(during),
        "commit_ms_median_compaction": median(compaction_commit),
        "commit_ms_max_compaction": maximum(compaction_commit),
        "commit_ms_median_other": median(other_commit),
        # heapstate's split of its commit time: its store's own work, and Spark's report to the
        # state store coordinator that every provider's commit waits for (summed over partitions).
        "commit_store_ms_median": commit_part("heapstateCommitStoreMicros"),
        "commit_report_ms_median": commit_part("heapstateCommitReportMicros"),
        # Of the store's part, the time its threads ran (not waiting for a core or the disk).
        "commit_store_cpu_ms_median": commit_part("heapstateCommitStoreCpuMicros"),
        # And the time its threads were ready to run but waited for a core (Linux's schedstat).
        "commit_store_run_queue_ms_median": commit_part("heapstateCommitStoreRunQueueMicros"),
        "memory_used_bytes": batches[-1]["memory_used_bytes"] if batches else None,
        "heap_retained_bytes": heap_after,
        "heap_retained_over_baseline_bytes": (
            heap_after - heap_base if heap_after is not None and heap_base is not None else None
        ),
        "bytes_per_batch_median": median([b["state_bytes_new"] for b in updates]),
        "bytes_per_batch_max": maximum([b["state_bytes_new"] for b in batches]),
        "bytes_per_batch_max_updates": maximum([b["state_bytes_new"] for b in updates]),
        "state_bytes_total": batches[-1]["state_bytes_total"] if batches else None,
        "state_bytes_before_restart": restart.get("state_bytes_before"),
        "restart_trigger_ms": median([r["trigger_ms"] for r in restarts]),
        "restart_trigger_ms_each": [r["trigger_ms"] for r in restarts],
        "restart_wall_ms": median([r["wall_ms"] for r in restarts]),
        "restart_load_ms": median([v for v in restart_loads if v is not None]),
        "restart_lead_in_batches": len(run["lead_in"]) if "lead_in" in run else None,
        # What the lead-in asked for (None: none ran), and what each restart read in its longest
        # chain: the first restart reads at least that many unless a background snapshot landed
        # after the lead-in looked, or the lead-in gave up.
        "restart_journals_asked": run.get("restart_journals"),
        "restart_journals_read": [longest_chain(r.get("recovery_chains") or []) for r in restarts],
        "restart_journals_max": maximum(
            [c["journals_above"] for r in restarts for c in r.get("recovery_chains") or []]
        ),
        "gc_pause_ms_total": sum(steady_pauses) if "gc_pauses" in run else None,
        "gc_pause_ms_max": max(steady_pauses, default=0.0) if "gc_pauses" in run else None,
        "gc_pauses": len(steady_pauses) if "gc_pauses" in run else None,
        # That longest pause in words (see _common.describe_pause), and its batch.
        "gc_pause_max_described": describe_pause(longest[1]) if longest else None,
        "gc_pause_max_batch": longest[0] if longest else None,
        "gc_marking_batches": sum(1 for m in marked if m > 0) if marked is not None else None,
        "gc_marking_ms_total": sum(marked) if marked is not None else None,
        "trigger_ms_max_batch": slowest["batch"] if slowest else None,
        "trigger_ms_max_marking_ms": (
            marking(slowest) if slowest is not None and cycles is not None else None
        ),
        "trigger_ms_max_pause_ms": (
            max(
                pauses_between(
                    run["gc_pauses"], slowest["start_epoch_ms"], slowest["end_epoch_ms"]
                ),
                default=0.0,
            )
            if slowest is not None and "gc_pauses" in run
            else None
        ),
        "trigger_ms_max_commit_ms": slowest["commit_ms"] if slowest else None,
        # The part of Spark's trigger (its durationMs) that the slowest batch spent most over that
        # part's median: addBatch holds the tasks (and the heap's first-touch page faults), the
        # others the driver's offset and commit logs (stop 46).
        "trigger_ms_max_phase": phase[0] if phase else None,
        "trigger_ms_max_phase_ms": phase[1] if phase else None,
        "trigger_ms_max_phase_median_ms": phase[2] if phase else None,
        # What Linux counted in the steady batches (ProcCounters; reports before stop 44 have
        # none), and the machine probe's fixed work (bench/_probe.py; stop 69 on): the median
        # batch's, and the slowest one's.
        **{f"{key}_median": median(counted[key]) if counted[key] else None for key in BATCH_COUNTS},
        **{f"trigger_ms_max_{key}": slowest.get(key) if slowest else None for key in BATCH_COUNTS},
        # The JVM's CPU a steady batch by the kind of thread that spent it (stop 63 on).
        "jvm_cpu_ms_by_thread_median": cpu_by_thread_median(steady),
    }


def cpu_by_thread_median(steady: list[dict[str, Any]]) -> dict[str, float] | None:
    """For each kind of thread (``CPU_SPLIT_KINDS``), the median of its CPU time over
    the ``steady`` batches whose records have ``jvm_cpu_ms_by_thread``; None when none has."""
    split = [b["jvm_cpu_ms_by_thread"] for b in steady if b.get("jvm_cpu_ms_by_thread")]
    if not split:
        return None
    return {kind: median([s.get(kind, 0) for s in split]) for kind in CPU_SPLIT_KINDS}


METRICS = [
    Metric("trigger_ms_median", f"median trigger (batch >= {STEADY_FROM})", fmt_ms),
    Metric("trigger_ms_max", f"max trigger (batch >= {STEADY_FROM})", fmt_ms),
    Metric("commit_ms_median", f"median commit (batch >= {STEADY_FROM})", fmt_ms),
    Metric("commit_ms_median_compaction", "median commit, compaction batches", fmt_ms),
    Metric("commit_ms_max_compaction", "max commit, compaction batches", fmt_ms),
    Metric("commit_ms_median_other", "median commit, other batches", fmt_ms),
    Metric("commit_store_ms_median", "  of the commit, in heapstate's store (median)", fmt_ms_fine),
    Metric("commit_report_ms_median", "  of it, the coordinator report (median)", fmt_ms_fine),
    Metric("commit_store_cpu_ms_median", "  CPU time of the store's part (median)", fmt_ms_fine),
    Metric(
        "commit_store_run_queue_ms_median",
        "  waiting for a core in the store's part (median)",
        fmt_ms_fine,
    ),
    Metric("memory_used_bytes", "memoryUsedBytes (last batch)", fmt_bytes),
    Metric("heap_retained_bytes", "heap after full GC", fmt_bytes),
    Metric("heap_retained_over_baseline_bytes", "  of which since query start", fmt_bytes),
    Metric("bytes_per_batch_median", "state bytes/batch median (>= 1)", fmt_bytes),
    Metric("bytes_per_batch_max", "state bytes/batch max (all)", fmt_bytes),
    Metric("bytes_per_batch_max_updates", "state bytes/batch max (>= 1)", fmt_bytes),
    Metric("state_bytes_total", "state bytes total (last batch)", fmt_bytes),
    Metric("state_bytes_before_restart", "state bytes total before restart", fmt_bytes),
    Metric("restart_trigger_ms", "restart: first batch trigger (median)", fmt_ms),
    Metric("restart_wall_ms", "restart: start to first batch (median)", fmt_ms),
    Metric("restart_load_ms", "restart: heapstateLoadMs, all stores (median)", fmt_ms),
    Metric(
        "restart_lead_in_batches",
        "restart: lead-in batches before it",
        lambda v: f"{v:,.0f}",
    ),
    Metric(
        "restart_journals_max", "restart: most journals above a snapshot", lambda v: f"{v:,.0f}"
    ),
    Metric("gc_pause_ms_total", f"GC pauses total (batch >= {STEADY_FROM})", fmt_ms_fine),
    Metric("gc_pause_ms_max", f"GC longest pause (batch >= {STEADY_FROM})", fmt_ms_fine),
    Metric(
        "gc_marking_batches",
        f"batches with G1 marking (batch >= {STEADY_FROM})",
        lambda v: f"{v:,.0f}",
    ),
    Metric("trigger_ms_max_marking_ms", "  G1 marking in the slowest batch", fmt_ms),
    Metric(
        "minor_faults_median",
        f"JVM minor page faults a batch (median, batch >= {STEADY_FROM})",
        lambda v: f"{v:,.0f}",
    ),
    Metric("trigger_ms_max_minor_faults", "  in the slowest batch", lambda v: f"{v:,.0f}"),
    Metric("jvm_cpu_ms_median", f"JVM CPU a batch (median, batch >= {STEADY_FROM})", fmt_ms),
    Metric("trigger_ms_max_jvm_cpu_ms", "  in the slowest batch", fmt_ms),
    Metric("steal_ms_median", f"CPU stolen a batch (median, batch >= {STEADY_FROM})", fmt_ms),
    Metric("trigger_ms_max_steal_ms", "  in the slowest batch", fmt_ms),
    Metric(
        "probe_us_median",
        f"machine probe's fixed work (median, batch >= {STEADY_FROM})",
        lambda v: f"{v:,.0f} us",
    ),
    Metric("trigger_ms_max_probe_us", "  in the slowest batch", lambda v: f"{v:,.0f} us"),
]


def grown_phase(
    steady: list[dict[str, Any]], slowest: dict[str, Any] | None
) -> tuple[str, float, float] | None:
    """The phase of Spark's trigger (``durationMs`` of its progress, less ``triggerExecution``,
    the whole) by which ``slowest`` most exceeds that phase's median over ``steady``: its name,
    its ms in ``slowest`` and the median. None without phases (reports before stop 46 have them,
    hand-made ones may not)."""
    if slowest is None or not slowest.get("duration_ms"):
        return None
    grown = []
    for name, ms in slowest["duration_ms"].items():
        if name == "triggerExecution":
            continue
        typical = median([(b.get("duration_ms") or {}).get(name, 0) for b in steady])
        grown.append((ms - typical, name, ms, typical))
    if not grown:
        return None
    _, name, ms, typical = max(grown)
    return name, ms, typical


def compaction_batches(batches: list[dict[str, Any]]) -> set[int]:
    """The batches that ran while a snapshot was being written. A snapshot of version V can start
    once batch V - 1 has committed it, so every batch from V up to the one after which the file
    was first seen overlapped it (a background snapshot can span several batches)."""
    during: set[int] = set()
    for b in batches:
        for v in b.get("new_snapshot_versions") or []:
            during.update(range(v, b["batch"] + 1))
    return during


def targets(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """W1's issue targets for heapstate, each with its figures and a verdict (None: not run)."""
    hs = summaries.get("heapstate")
    base = summaries.get(BASELINE)

    def check(
        name: str, key: str, factor: float, against: dict[str, Any] | None, ref: str
    ) -> dict[str, Any]:
        value = hs.get(key) if hs else None
        bound = against.get(ref) if against else None
        limit = bound * factor if bound is not None else None
        ok = None if value is None or limit is None else value <= limit
        return {"target": name, "value": value, "limit": limit, "pass": ok}

    spikes = check(
        f"max trigger <= 1.5x median (batch >= {STEADY_FROM})",
        "trigger_ms_max",
        1.5,
        hs,
        "trigger_ms_median",
    )
    if hs and hs.get("trigger_ms_max_batch") is not None:
        # Where the slowest batch fell, how much of it G1's marking thread ran beside it, its
        # longest GC pause and its commit: what most often made a batch slow.
        spikes["slowest_batch"] = hs["trigger_ms_max_batch"]
        spikes["slowest_batch_marking_ms"] = hs.get("trigger_ms_max_marking_ms")
        spikes["slowest_batch_pause_ms"] = hs.get("trigger_ms_max_pause_ms")
        spikes["slowest_batch_commit_ms"] = hs.get("trigger_ms_max_commit_ms")
        if hs.get("trigger_ms_max_phase") is not None:
            spikes["slowest_batch_phase"] = hs["trigger_ms_max_phase"]
            spikes["slowest_batch_phase_ms"] = hs["trigger_ms_max_phase_ms"]
            spikes["median_batch_phase_ms"] = hs["trigger_ms_max_phase_median_ms"]
        for key in BATCH_COUNTS:
            if hs.get(f"trigger_ms_max_{key}") is not None:
                spikes[f"slowest_batch_{key}"] = hs[f"trigger_ms_max_{key}"]
                spikes[f"median_batch_{key}"] = hs.get(f"{key}_median")
    # The same ratio for the other providers of the run: a JVM's own slow batches (its heap
    # growing, G1 marking) slow every provider, and this tells them from heapstate's.
    others = {
        name: s["trigger_ms_max"] / s["trigger_ms_median"]
        for name, s in summaries.items()
        if name != "heapstate" and s.get("trigger_ms_max") and s.get("trigger_ms_median")
    }
    if hs and others:
        spikes["others_max_over_median"] = others
    return [
        check(
            "median bytes/batch <= 0.6x HDFS",
            "bytes_per_batch_median",
            0.6,
            base,
            "bytes_per_batch_median",
        ),
        check(
            "total checkpoint bytes <= 0.6x HDFS",
            "state_bytes_total",
            0.6,
            base,
            "state_bytes_total",
        ),
        check("median commit ms <= HDFS", "commit_ms_median", 1.0, base, "commit_ms_median"),
        check("memoryUsedBytes <= HDFS", "memory_used_bytes", 1.0, base, "memory_used_bytes"),
        spikes,
        check(
            "median commit on compaction batches <= 1.2x the other batches",
            "commit_ms_median_compaction",
            1.2,
            hs,
            "commit_ms_median_other",
        ),
        {
            **check(
                "restart: first batch <= 0.5x HDFS",
                "restart_trigger_ms",
                0.5,
                base,
                "restart_trigger_ms",
            ),
            "detail": restart_detail(hs, base),
        },
    ]


def restart_detail(hs: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    """What the restart target's figures read: the most journals above a snapshot in any one store,
    restart by restart, for heapstate and HDFS, and what the lead-in asked for; flagged when a
    provider's first restart read fewer (the target names 10 journals after the last snapshot)."""
    read = [
        (label, summary)
        for label, summary in (("heapstate", hs), ("HDFS", base))
        if summary and summary.get("restart_journals_read")
    ]
    if not read:
        return ""
    text = "; the most journals a restart read in one store: " + "; ".join(
        f"{label} {', '.join(str(n) for n in summary['restart_journals_read'])}"
        for label, summary in read
    )
    asked = max((summary.get("restart_journals_asked") or 0 for _, summary in read), default=0)
    if asked:
        text += f" (the lead-in asked for {asked})"
    short = [
        label
        for label, summary in read
        if summary["restart_journals_read"][0] < (summary.get("restart_journals_asked") or 0)
    ]
    if short:
        text += f"; SHORT of it: {' and '.join(short)}"
    return text


def print_targets(results: list[dict[str, Any]]) -> None:
    print("\nW1 targets for heapstate:")
    for t in results:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
        detail = ""
        if t["value"] is not None and t["limit"] is not None:
            detail = f"  ({t['value']:,.0f} vs limit {t['limit']:,.0f})"
        elif t["pass"] is None:
            detail = "  (not measured: needs heapstate and HDFS in the same run, or compaction)"
        detail += slowest_batch_detail(t) + t.get("detail", "")
        print(f"  {verdict}  {t['target']}{detail}")


def _git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--keys", type=int, help="K: keys inserted by batch 0")
    parser.add_argument("--payload", type=int, help="P: hex characters per value")
    parser.add_argument("--updates", type=int, help="U: keys updated by each later batch")
    parser.add_argument("--batches", type=int, help="batches before the restart (at least 3)")
    parser.add_argument("--seed", type=int, default=42, help="seed of the updated keys")
    parser.add_argument(
        "--providers",
        default="all",
        help=f"comma-separated, run in this order: {','.join(PROVIDERS)} (default: all)",
    )
    parser.add_argument("--python", default=str(DEFAULT_PYTHON), help="the workers' Python")
    parser.add_argument("--jar", help="the heapstate jar (default: heapstate.jar_path())")
    parser.add_argument("--driver-memory", default="6g", help="every run's driver heap")
    parser.add_argument(
        "--restart",
        choices=["fresh-process", "same-process", "none"],
        help="where the restart runs: a new JVM (cold; the default but for --size small) or "
        "the same one",
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=1,
        help="fresh-process restarts, one after another, each in a new JVM running the next "
        "batch; the report gives their median (default 1)",
    )
    parser.add_argument(
        "--restart-journals",
        type=int,
        help="before fresh-process restarts, run lead-in batches until a restart reads at least "
        f"this many journals above a snapshot in some store (default {RESTART_JOURNALS} with "
        "fresh-process restarts, else 0: off)",
    )
    parser.add_argument(
        "--restart-warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="in a fresh-process restart, first warm the JVM up on a scratch checkpoint",
    )
    parser.add_argument(
        "--jvm",
        choices=["per-provider", "shared"],
        help="each provider in its own Python and JVM (the default but for --size small), or "
        "all in one (quicker; heap figures then include what earlier providers left behind)",
    )
    add_jvm_arguments(parser, heap_example="-Xms6g")
    parser.add_argument("--maintenance-interval", help=f"sets {MAINTENANCE_CONF}")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra Spark conf for every provider (repeatable)",
    )
    parser.add_argument("--data-dir", help="cache of generated batches (default: bench/results)")
    parser.add_argument("--work-dir", help="where checkpoints go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep checkpoints after the run")
    add_probe_argument(parser)
    parser.add_argument("--out", help="the JSON report (default: bench/results/w1-<time>.json)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    args.keys = args.keys if args.keys is not None else size.keys
    args.payload = args.payload if args.payload is not None else size.payload
    args.updates = args.updates if args.updates is not None else size.updates
    args.batches = args.batches if args.batches is not None else size.batches
    args.restart = args.restart or size.restart
    args.jvm = args.jvm or size.jvm
    resolve_warmup(parser, args)
    if args.jvm == "shared" and args.restart == "fresh-process":
        parser.error("--jvm shared restarts in the same JVM: use --restart same-process or none")
    if args.batches < STEADY_FROM + 1:
        parser.error(f"--batches must be at least {STEADY_FROM + 1}")
    if min(args.keys, args.payload, args.updates) < 1:
        parser.error("--keys, --payload and --updates must be positive")
    if args.restarts < 1:
        parser.error("--restarts must be at least 1")
    if args.restart_journals is None:
        args.restart_journals = RESTART_JOURNALS if args.restart == "fresh-process" else 0
    elif args.restart_journals < 0:
        parser.error("--restart-journals must be at least 0")
    elif args.restart_journals and args.restart != "fresh-process":
        parser.error("--restart-journals needs --restart fresh-process")
    return args


def data_files(args: argparse.Namespace) -> int:
    """How many batch files a run can drop: its batches, the most lead-in batches when it runs
    any, and one a restart."""
    return args.batches + (LEAD_IN_MAX if args.restart_journals else 0) + args.restarts


def _spec_file(work_root: Path, name: str, spec: dict[str, Any]) -> Path:
    path = work_root / f"{name}.spec.json"
    path.write_text(json.dumps(spec, indent=2))
    return path


def run_provider(
    python: str,
    spec: dict[str, Any],
    work_root: Path,
    log_dir: Path,
    driver_memory: str,
    jars: list[Path],
    java_options: Sequence[str] = (),
) -> dict[str, Any]:
    """One provider's batches in a worker process, then its restart in a second one unless the
    restart runs in the first (``same-process``) or not at all. Each worker JVM writes a GC log
    next to the worker's log; the run's pauses are kept under ``gc_pauses``. ``java_options``
    go to every worker JVM."""
    name = _run_name(spec)
    log = log_dir / f"{name}.log"
    restarts = spec["restarts"] if spec["restart"] == "fresh-process" else 0
    # Each restart is its own fresh JVM and runs the next batch: restart i runs batch
    # batches + (lead-in batches) + i.
    phases = [("run", "run")] + [
        ("restart", f"restart{i}" if i else "restart") for i in range(restarts)
    ]
    run: dict[str, Any] = {"spark_confs": spec["spark_confs"]}
    for index, (worker, phase) in enumerate(phases):
        extra = {}
        if worker == "restart":  # the run's result, with its lead-in, is in by now
            after = spec["batches"] + len(run.get("lead_in") or [])
            extra = {"restart_batch": after + index - 1}
        phase_spec = {**spec, **extra, "out": str(work_root / f"{name}.{phase}.json")}
        spec_path = _spec_file(work_root, f"{name}.{phase}", phase_spec)
        gc_log = log_dir / f"{name}.{phase}.gc.log"
        submit_args = pyspark_submit_args(driver_memory, jars, gc_log, java_options)
        env = {"PYSPARK_SUBMIT_ARGS": submit_args}
        run_worker(python, SCRIPT, ["--worker", worker, "--spec", str(spec_path)], log, env)
        result = json.loads(Path(phase_spec["out"]).read_text())
        if worker == "restart":
            run.setdefault("restarts", []).append(result["restart"])
            run.setdefault("restart", result["restart"])  # the first, as before
        else:
            run.update(result)
            run["gc_pauses"] = gc_pauses(gc_log)
            run["gc_mark_cycles"] = gc_mark_cycles(gc_log)
    return run


def run_shared(
    python: str,
    specs: list[dict[str, Any]],
    common_confs: dict[str, str],
    work_root: Path,
    log_dir: Path,
    driver_memory: str,
    jars: list[Path],
    java_options: Sequence[str] = (),
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every provider in one worker process and JVM (``--jvm shared``). Returns the runs of the
    providers that succeeded and the errors of those that failed."""
    out = work_root / "shared.run.json"
    spec = {"providers": specs, "common_confs": common_confs, "out": str(out)}
    gc_log = log_dir / "shared.run.gc.log"
    env = {"PYSPARK_SUBMIT_ARGS": pyspark_submit_args(driver_memory, jars, gc_log, java_options)}
    spec_path = _spec_file(work_root, "shared.run", spec)
    run_worker(
        python,
        SCRIPT,
        ["--worker", "run-shared", "--spec", str(spec_path)],
        log_dir / "shared.log",
        env,
    )
    pauses = gc_pauses(gc_log)
    cycles = gc_mark_cycles(gc_log)
    runs: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    results = json.loads(out.read_text())
    for provider_spec in specs:
        name = _run_name(provider_spec)
        result = results.get(name, {"error": "no result"})
        if "error" in result:
            failures[name] = result["error"]
        else:
            runs[name] = {
                "spark_confs": provider_spec["spark_confs"],
                **result,
                "gc_pauses": pauses,
                "gc_mark_cycles": cycles,
            }
    return runs, failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        WORKERS[args.worker](json.loads(Path(args.spec).read_text()))
        return 0

    providers: list[Provider] = parse_providers(args.providers)
    python = args.python
    if not Path(python).exists():
        raise SystemExit(f"--python {python}: no such interpreter (run bin/setup first?)")
    jar = resolve_jar(args.jar, python) if any(p.needs_jar for p in providers) else None
    confs = parse_confs(args.conf)
    if args.maintenance_interval:
        confs[MAINTENANCE_CONF] = args.maintenance_interval

    stamp = timestamp()
    out = Path(args.out) if args.out else RESULTS_DIR / f"w1-{stamp}.json"
    log_dir = out.with_suffix(".logs")
    data_dir = (
        Path(args.data_dir)
        if args.data_dir
        else (
            RESULTS_DIR / "data" / f"w1-k{args.keys}-p{args.payload}-u{args.updates}-s{args.seed}"
        )
    )
    work_root = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="w1-"))
    work_root.mkdir(parents=True, exist_ok=True)
    jar_copy, jar_info = None, None
    if jar is not None:  # a private copy: a rebuild during the run must not change the classes
        jar_copy = work_root / "heapstate.jar"
        shutil.copyfile(jar, jar_copy)
        jar_info = {"path": str(jar), "sha256": hashlib.sha256(jar_copy.read_bytes()).hexdigest()}
    submit_env = {"PYSPARK_SUBMIT_ARGS": pyspark_submit_args(args.driver_memory)}
    params = {
        "keys": args.keys,
        "payload": args.payload,
        "updates": args.updates,
        "batches": args.batches,
        "seed": args.seed,
    }
    progress(
        f"W1: K={args.keys:,} P={args.payload} U={args.updates:,} batches={args.batches}, "
        f"providers {', '.join(p.name for p in providers)}; logs in {log_dir}"
    )

    gen_spec = {**params, "files": data_files(args), "data_dir": str(data_dir)}
    run_worker(
        python,
        SCRIPT,
        ["--worker", "generate", "--spec", str(_spec_file(work_root, "generate", gen_spec))],
        log_dir / "generate.log",
        submit_env,
    )
    warmup_dir = (
        generate_warmup_data(python, params, data_dir.parent, work_root, log_dir, submit_env)
        if args.warmup_batches > 0
        else None
    )

    runs: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    java_options = worker_java_options(args)
    probe = _probe.Probe(log_dir / "probe.txt") if args.probe else None
    specs = [
        {
            **params,
            "provider": provider.name,
            "data_dir": str(data_dir),
            "work_dir": str(work_root / provider.name),
            "spark_confs": {**provider.spark_confs(), **confs},
            "provider_confs": provider.spark_confs(),
            "restart": args.restart,
            "restarts": args.restarts,
            "restart_journals": args.restart_journals,
            "restart_warmup": args.restart_warmup,
            "warmup_batches": args.warmup_batches,
            "warmup_data_dir": warmup_dir,
        }
        for provider in providers
    ]
    try:
        if probe is not None:
            probe.start()
        if args.jvm == "shared":
            jars = [jar_copy] if jar_copy is not None else []
            runs, failures = run_shared(
                python, specs, confs, work_root, log_dir, args.driver_memory, jars, java_options
            )
        for provider, spec in zip(providers, specs) if args.jvm == "per-provider" else ():
            jars = [jar_copy] if provider.needs_jar and jar_copy is not None else []
            try:
                runs[provider.name] = run_provider(
                    python, spec, work_root, log_dir, args.driver_memory, jars, java_options
                )
            except RuntimeError as err:  # one provider failing must not lose the others
                failures[provider.name] = str(err)
                progress(f"{provider.name}: FAILED: {err}")
            if not args.keep:
                shutil.rmtree(work_root / provider.name, ignore_errors=True)
    finally:
        if probe is not None:
            probe.stop()
        if not args.keep and not args.work_dir:
            shutil.rmtree(work_root, ignore_errors=True)
    if not runs:
        raise SystemExit(f"every provider failed; logs in {log_dir}")
    if probe is not None:
        probe.attach_to(runs.values())

    summaries = {name: summarize(run) for name, run in runs.items()}
    environment = next(iter(runs.values()))["environment"]
    title = (
        f"\nW1 incremental checkpoint: K={args.keys:,} P={args.payload} U={args.updates:,} "
        f"batches={args.batches}, Spark {environment['spark_version']}, "
        f"driver {args.driver_memory}, restart {args.restart}, JVM {args.jvm}"
        + (" after warm-up" if args.restart == "fresh-process" and args.restart_warmup else "")
        + (
            f", after lead-in batches to {args.restart_journals} journals"
            if args.restart_journals
            else ""
        )
        + (f", JVM options {' '.join(java_options)}" if java_options else "")
    )
    print_comparison(title, METRICS, summaries)
    verdicts = targets(summaries)
    if "heapstate" in summaries:
        print_targets(verdicts)

    report = {
        "benchmark": "W1",
        "timestamp": stamp,
        "params": params,
        "size": args.size,
        "driver_memory": args.driver_memory,
        "restart_mode": args.restart,
        "jvm": args.jvm,
        "restart_warmup": args.restart_warmup and args.restart == "fresh-process",
        # What the lead-in asked for: lead-in batches ran until a restart would read this many
        # journals in some store (0: no lead-in; reports before stop 70 have no key and none).
        "restart_journals": args.restart_journals,
        "warmup_batches": args.warmup_batches,
        # The warm-up's own data set (see WARMUP_SCALE); None: none, or a report from before it.
        "warmup_data": warmup_shape(params) if args.warmup_batches > 0 else None,
        "java_options": java_options,
        "steady_from_batch": STEADY_FROM,
        # The machine probe beside the runs (bench/_probe.py), or None: --no-probe.
        "probe": _probe.settings() if args.probe else None,
        "maintenance_interval": {n: r.get("maintenance_interval") for n, r in runs.items()},
        "heapstate_jar": jar_info,
        "python": python,
        "host": host_info(),
        "git": _git_state(),
        "environment": environment,
        "providers": {p.name: asdict(p) for p in providers},
        "summary": summaries,
        "targets": verdicts if "heapstate" in summaries else [],
        "runs": runs,
        "failures": failures,
    }
    print(f"\nJSON: {write_json(out, report)}")
    for name, err in failures.items():
        print(f"{name} FAILED (see {log_dir / (name + '.log')}): {err.splitlines()[0]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
