"""Soak: a long run of W1's query on one provider, checking that nothing grows that should not.

Runs W1's streaming aggregation (``bench/w1.py``: the same data, one parquet file per
micro-batch, ``groupBy(k).agg(last(v), count(*))``) for many batches with compaction every
``--compaction-interval`` versions and ``spark.sql.streaming.minBatchesToRetain`` set to
``--retain``, in one process, and checks:

- **files**: after every batch, each state store folder holds at most the files retention needs:
  journals from the newest snapshot at or below the oldest retained version up to the newest,
  and the snapshots among them (``file_bound``), plus a few versions of slack for maintenance,
  which runs on its own clock. After the last batch, once maintenance has run, exactly within
  the bound;
- **bytes**: the state folder's bytes after the last batch are at most 1.25x their largest value
  over the first window in which retention is full (the state's size is constant after batch 0:
  updates rewrite existing keys);
- **heap**: the JVM's retained heap after full GCs grows by at most ``--heap-slack-mb`` from the
  first sample after warm-up to the last;
- **state**: the final state, read with Spark's state data source
  (``spark.read.format("statestore")``), equals the model: every key's count is 1 plus the number
  of batches that updated it.

::

    .venv/bin/python bench/soak.py                      # heapstate, 300 batches: 5 to 10 minutes
    .venv/bin/python bench/soak.py --batches 50         # the suite's version (tests/python/test_soak.py)
    .venv/bin/python bench/soak.py --provider hdfs      # the same checks on another provider

It prints one line per batch (or every ``--report-every``), the checks as PASS/FAIL lines, and
writes ``bench/results/soak-<timestamp>.json``; it exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import w1
from _common import (
    HEAPSTATE_CLASS,
    MAINTENANCE_CONF,
    PROVIDERS,
    REPO_JAR,
    RESULTS_DIR,
    StateFiles,
    add_java_option,
    fmt_bytes,
    heap_after_full_gcs,
    jvm_heap_after_gc,
    jvm_pid,
    progress,
    pyspark_submit_args,
    timestamp,
    write_json,
)

HEAPSTATE_PREFIX = "spark.sql.streaming.stateStore.heapstate."
SLACK_VERSIONS = 5
"""Versions a folder may run ahead of the bound while maintenance, on its own clock, catches up."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=64)
    parser.add_argument("--updates", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--compaction-interval", type=int, default=10)
    parser.add_argument("--retain", type=int, default=20, help="minBatchesToRetain")
    parser.add_argument("--maintenance-interval", default="1s")
    parser.add_argument("--heap-every", type=int, default=10, help="heap sample every N batches")
    parser.add_argument("--heap-slack-mb", type=float, default=48.0)
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="heapstate")
    parser.add_argument(
        "--strict-lag-detection",
        action="store_true",
        help="make Spark's coordinator count a store as lagging after minDeltasForSnapshot "
        "versions without a reported snapshot (50 by default) and check at every batch, so that "
        "a provider that does not report its snapshots gets a forced snapshot on every commit "
        "within a short run",
    )
    add_java_option(
        parser,
        "the driver JVM (which is also the executor; its heap is 4g)",
        "--java-option=-XX:+UseZGC",
    )
    parser.add_argument("--report-every", type=int, default=10, help="progress every N batches")
    parser.add_argument("--work-dir", help="where the checkpoint goes (default: a temporary one)")
    parser.add_argument("--out", help="the JSON report (default: bench/results/soak-<time>.json)")
    args = parser.parse_args(argv)
    if args.batches < 2 * (args.retain + args.compaction_interval):
        parser.error(
            "--batches must be at least twice --retain + --compaction-interval, so that "
            "retention is full for a while"
        )
    return args


def file_bound(retain: int, interval: int) -> dict[str, int]:
    """Files a heapstate store folder needs after cleanup: journals above the newest snapshot at
    or below the oldest retained version (at most ``retain - 1 + gap`` of them, the base
    snapshot's own journal being deleted), and the snapshots from that base up. ``gap`` is the
    widest gap cleanup leaves between the snapshots it keeps, ``max(interval, retain // 2)``
    (``StateEngine.thinningGap``); thinning only ever removes snapshots, so the count of snapshots
    one per ``interval`` versions would need still bounds them."""
    journals = retain - 1 + max(interval, retain // 2)
    snapshots = math.ceil(journals / interval) + 1
    return {"journals": journals, "snapshots": snapshots}


def store_counts(state_dir: Path) -> dict[str, dict[str, int]]:
    """Per store folder (``<operator>/<partition>``): journal and snapshot files (heapstate's
    ``.hs-journal`` and ``.hs-snapshot``, HDFS's ``.delta`` and ``.snapshot``)."""
    out: dict[str, dict[str, int]] = {}
    for folder in sorted(p for p in state_dir.glob("*/*") if p.is_dir()):
        names = [n for n in os.listdir(folder) if not n.startswith(".")]
        out[str(folder.relative_to(state_dir))] = {
            "journals": sum(n.endswith((".hs-journal", ".delta")) for n in names),
            "snapshots": sum(n.endswith((".hs-snapshot", ".snapshot")) for n in names),
        }
    return out


def model_counts(keys: int, updates: int, seed: int, batches: int) -> Counter[int]:
    """Every key's count after ``batches`` batches: 1 for batch 0, 1 per later batch updating it."""
    counts: Counter[int] = Counter(range(keys))
    for batch in range(1, batches):
        counts.update(w1.update_keys(keys, updates, seed, batch))
    return counts


def state_counts(spark: Any, checkpoint: Path) -> dict[int, int]:
    """Every key's count in the checkpoint's last committed state, through the state data source.
    The aggregation's value row holds ``last``'s buffer and ``count``'s; the count is its one
    ``long`` field."""
    from pyspark.sql.types import LongType

    df = spark.read.format("statestore").load(str(checkpoint))
    value_type = df.schema["value"].dataType
    longs = [f.name for f in value_type.fields if isinstance(f.dataType, LongType)]
    if len(longs) != 1:
        raise RuntimeError(f"expected one long field in the state's value, got {value_type}")
    rows = df.selectExpr("key.k AS k", f"value.`{longs[0]}` AS n").collect()
    return {int(r["k"]): int(r["n"]) for r in rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    provider = PROVIDERS[args.provider]
    stamp = timestamp()
    out = Path(args.out) if args.out else RESULTS_DIR / f"soak-{stamp}.json"
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="soak-"))
    data_dir = (
        RESULTS_DIR / "data" / f"w1-k{args.keys}-p{args.payload}-u{args.updates}-s{args.seed}"
    )
    params = {
        "keys": args.keys,
        "payload": args.payload,
        "updates": args.updates,
        "batches": args.batches,
        "seed": args.seed,
    }
    confs = {
        **provider.spark_confs(),
        MAINTENANCE_CONF: args.maintenance_interval,
        "spark.sql.streaming.minBatchesToRetain": str(args.retain),
        HEAPSTATE_PREFIX + "compactionInterval": str(args.compaction_interval),
    }
    if args.strict_lag_detection:
        confs.update(
            {
                "spark.sql.streaming.stateStore.multiplierForMinVersionDiffToLog": "1",
                "spark.sql.streaming.stateStore.multiplierForMinTimeDiffToLog": "1",
                "spark.sql.streaming.stateStore.snapshotLagReportInterval": "0",
            }
        )
    if provider.provider_class == HEAPSTATE_CLASS:
        import heapstate

        jar = Path(heapstate.jar_path()) if heapstate.jar_path() else REPO_JAR
        os.environ["PYSPARK_SUBMIT_ARGS"] = pyspark_submit_args(
            "4g", [jar], java_options=args.java_option
        )
    else:
        confs.pop(HEAPSTATE_PREFIX + "compactionInterval")
        confs["spark.sql.streaming.stateStore.minDeltasForSnapshot"] = str(args.compaction_interval)
        os.environ["PYSPARK_SUBMIT_ARGS"] = pyspark_submit_args("4g", java_options=args.java_option)
    progress(
        f"soak: {provider.name}, {args.batches} batches, K={args.keys:,} U={args.updates:,}, "
        f"compaction every {args.compaction_interval}, retain {args.retain}"
    )
    w1.worker_generate({**params, "files": args.batches, "data_dir": str(data_dir)})

    bound = file_bound(args.retain, args.compaction_interval)
    spark = w1._session({"provider": provider.name, "spark_confs": confs})
    shutil.rmtree(work / "input", ignore_errors=True)
    shutil.rmtree(work / "checkpoint", ignore_errors=True)
    (work / "input").mkdir(parents=True)
    checkpoint = work / "checkpoint"
    files = StateFiles(checkpoint / "state")
    spec = {**params, "data_dir": str(data_dir), "work_dir": str(work)}
    records: list[dict[str, Any]] = []
    heap: list[dict[str, int]] = []
    over_bound: list[str] = []
    warmup = args.retain + args.compaction_interval
    try:
        query = w1._start_query(spark, work / "input", checkpoint)
        pid = jvm_pid(spark)
        try:
            for batch in range(args.batches):
                rec = w1._run_one_batch(query, spec, batch, files, pid)
                counts = store_counts(checkpoint / "state")
                rec["store_files"] = counts
                worst = {
                    kind: max((c[kind] for c in counts.values()), default=0)
                    for kind in ("journals", "snapshots")
                }
                rec["max_journals"], rec["max_snapshots"] = worst["journals"], worst["snapshots"]
                if provider.provider_class == HEAPSTATE_CLASS and (
                    worst["journals"] > bound["journals"] + SLACK_VERSIONS
                    or worst["snapshots"] > bound["snapshots"] + 1
                ):
                    over_bound.append(f"batch {batch}: {worst} over {bound} + slack")
                if batch >= warmup and (batch - warmup) % args.heap_every == 0:
                    heap.append({"batch": batch, **jvm_heap_after_gc(spark)})
                records.append(rec)
                if batch % args.report_every == 0 or batch == args.batches - 1:
                    progress(
                        f"batch {batch}: trigger {rec['trigger_ms']} ms, state "
                        f"{fmt_bytes(rec['state_bytes_total'])} in {rec['state_files']} files, "
                        f"max per store {worst['journals']} journals, "
                        f"{worst['snapshots']} snapshots"
                        + (f", heap {fmt_bytes(heap[-1]['used'])}" if heap else "")
                    )
            heap.append({"batch": args.batches - 1, **jvm_heap_after_gc(spark)})
            # Let maintenance (snapshot, then cleanup) catch up with the last version.
            settle_until = time.monotonic() + 30
            final = store_counts(checkpoint / "state")
            while time.monotonic() < settle_until and any(
                c["journals"] > bound["journals"] or c["snapshots"] > bound["snapshots"]
                for c in final.values()
            ):
                time.sleep(0.5)
                final = store_counts(checkpoint / "state")
        finally:
            query.stop()
        final_bytes = files.step()["total"]
        state = state_counts(spark, checkpoint)
    finally:
        spark.stop()
    model = model_counts(args.keys, args.updates, args.seed, args.batches)
    wrong = [k for k in model if state.get(k) != model[k]] + [k for k in state if k not in model]

    window = [r["state_bytes_total"] for r in records[warmup : 2 * warmup]]
    checks = []
    heapstate_run = provider.provider_class == HEAPSTATE_CLASS
    if heapstate_run:
        checks.append(("store files within the bound plus slack after every batch", not over_bound))
        checks.append(
            (
                f"store files within the bound after the last batch: {bound}",
                all(
                    c["journals"] <= bound["journals"] and c["snapshots"] <= bound["snapshots"]
                    for c in final.values()
                ),
            )
        )
    # A reading taken when no full collection ran counts garbage (see jvm_heap_after_gc), which
    # could hide growth in the first one: the check fails rather than judge on it.
    first_heap, last_heap = heap_after_full_gcs(heap[0]), heap_after_full_gcs(heap[-1])
    heap_grown = None if first_heap is None or last_heap is None else last_heap - first_heap
    checks += [
        (
            "state bytes after the last batch <= 1.25x their max over the first full window",
            final_bytes <= 1.25 * max(window),
        ),
        (
            f"retained heap grows by <= {args.heap_slack_mb:.0f} MB after warm-up",
            heap_grown is not None and heap_grown <= args.heap_slack_mb * 1e6,
        ),
        (f"final state equals the model ({len(model):,} keys)", not wrong),
    ]
    print(f"\nSoak: {provider.label}, {args.batches} batches, K={args.keys:,} U={args.updates:,}")
    print(
        f"  state bytes: max over batches {warmup}-{2 * warmup - 1} {fmt_bytes(max(window))}, "
        f"after the last {fmt_bytes(final_bytes)}"
    )
    print(
        f"  heap after GC: {fmt_bytes(heap[0]['used'])} at batch {heap[0]['batch']}, "
        f"{fmt_bytes(heap[-1]['used'])} at batch {heap[-1]['batch']}"
    )
    print(f"  files per store after the last batch: {sorted(final.items())[:4]} ...")
    for name, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    for line in over_bound[:5]:
        print(f"    {line}")
    if wrong:
        print(
            f"    {len(wrong)} keys differ, e.g. {[(k, state.get(k), model.get(k)) for k in wrong[:5]]}"
        )
    report = {
        "benchmark": "soak",
        "timestamp": stamp,
        "provider": provider.name,
        "params": {
            **params,
            "compaction_interval": args.compaction_interval,
            "retain": args.retain,
            "maintenance_interval": args.maintenance_interval,
            "strict_lag_detection": args.strict_lag_detection,
            "java_options": args.java_option,
        },
        "file_bound": bound,
        "final_store_files": final,
        "final_state_bytes": final_bytes,
        "heap": heap,
        "checks": [{"check": name, "pass": ok} for name, ok in checks],
        "state_matches_model": not wrong,
        "keys_wrong": len(wrong),
        "over_bound": over_bound,
        "batches": records,
    }
    print(f"\nJSON: {write_json(out, report)}")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
