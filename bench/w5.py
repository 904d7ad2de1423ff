"""W5, growth: W1 at several key counts K with the updates per batch U fixed.

As W5 in the project's BENCHMARKS.md describes, the batch cost of a provider that copies its map
(HDFS) grows with K, while one that only touches the changed keys stays flat::

    .venv/bin/python bench/w5.py --size small    # K = 5K, 10K, 20K: about a minute
    .venv/bin/python bench/w5.py --size full     # K = 100K, 1M, 4M: 20 to 30 minutes
    .venv/bin/python bench/w5.py --size full --providers hdfs,heapstate

Each K is one W1 run (``bench/w1.py``: the same data, query, workers and per-batch records) with
P=64 and no restart. Every worker JVM writes a GC log (``_common.GC_LOG_TAGS``), from which W1
takes the total and the longest stop-the-world pause inside the steady batches (2 and later);
a note under the targets describes heapstate's longest at the largest K.
Each run's worker JVM first runs ``--warmup-batches`` batches of the same query on a scratch
checkpoint, on a data set of the same shape at a tenth of that K's scale (w1.py's RUN_WARMUP
and WARMUP_SCALE). ``--pretouch`` starts every provider's worker JVM with
``-XX:+AlwaysPreTouch`` (see PRETOUCH).

It prints one table per provider (a row per K: median trigger and commit, ``memoryUsedBytes``
and the heap per key, GC pauses, the JVM's minor page faults, G1's concurrent marking beside the
steady batches and the JVM's CPU per steady batch) and then the growth ratios, largest K over the
one before it (4M over 1M at full size), of median trigger, median commit, memory per key and JVM
CPU, for every provider side by side, with heapstate's W5 targets as PASS/FAIL lines. When any of
heapstate's steady batches at the largest K took first-touch page faults (``FAULTING_BATCH``), or
had G1 marking beside them, a note says so under the targets. JSON with every run's per-batch
figures goes to ``bench/results/w5-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _probe
import w1
from _common import (
    CPU_SPLIT_KINDS,
    DEFAULT_PYTHON,
    MAINTENANCE_CONF,
    PROVIDERS,
    RESULTS_DIR,
    fmt_bytes,
    fmt_ms,
    fmt_ms_fine,
    host_info,
    maximum,
    median,
    parse_confs,
    parse_providers,
    progress,
    pyspark_submit_args,
    resolve_jar,
    run_worker,
    timestamp,
    write_json,
)


@dataclass(frozen=True)
class Size:
    keys: tuple[int, ...]
    payload: int
    updates: int
    batches: int
    driver_memory: str
    jvm: str


SIZES: dict[str, Size] = {
    # A check that everything runs: every run in one JVM.
    "small": Size((5_000, 10_000, 20_000), 64, 1_000, 3, "4g", "shared"),
    # BENCHMARKS.md's reference: P=64, U=10K, 12 batches. HDFS needs a large heap at 4M keys.
    "full": Size((100_000, 1_000_000, 4_000_000), 64, 10_000, 12, "12g", "per-provider"),
}

GROWTH_LIMIT = 1.2
"""heapstate's median trigger and commit at the largest K, over those at the K before it."""
PAUSE_LIMIT_MS = 50.0
"""heapstate's aim for the longest GC pause in the steady batches at the largest K."""
FAULTING_BATCH = 5_000
"""The minor page faults from which a steady batch counts as faulting: about 20 MB of memory
the JVM touched for the first time (a batch at W5's sizes takes a few hundred on a heap it has
used before, and 12,000 to 37,000 when it allocates into heap regions G1 committed in batch 0)."""
PRETOUCH = w1.PRETOUCH
"""The JVM option of ``--pretouch`` (w1.py's). Batch 0 loads all K keys and G1 grows the heap
for it; without the option, the next batches pay the kernel's first-touch page faults on that
new heap. Counted once for heapstate: 139,000 minor faults in batches 2 to 11 at K=4M against
57,000 at K=1M, and 18,000 to 23,000 in each of batches 1 to 5 at K=4M, the slow ones. The option
moves that cost to the moment the heap grows, which for a provider whose heap grows in the steady
batches (HDFS) lands in a GC pause there. Off by default: the default measures as BENCHMARKS.md's
reference figures did."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--keys", help="comma-separated K values (overrides the size's)")
    parser.add_argument("--payload", type=int, help="P: hex characters per value")
    parser.add_argument("--updates", type=int, help="U: keys updated by each later batch")
    parser.add_argument("--batches", type=int, help="batches per run (at least 3)")
    parser.add_argument("--seed", type=int, default=42, help="seed of the updated keys")
    parser.add_argument(
        "--providers",
        default="all",
        help=f"comma-separated, run in this order: {','.join(PROVIDERS)} (default: all)",
    )
    parser.add_argument("--python", default=str(DEFAULT_PYTHON), help="the workers' Python")
    parser.add_argument("--jar", help="the heapstate jar (default: heapstate.jar_path())")
    parser.add_argument("--driver-memory", help="every run's driver heap (default: the size's)")
    parser.add_argument("--jvm", choices=["per-provider", "shared"], help="as in w1.py")
    w1.add_jvm_arguments(parser, heap_example="-Xms12g")
    w1.add_probe_argument(parser)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds: each round runs every provider at every K once, in a JVM of its own; the "
        "medians are over the steady batches of all rounds (default 1; see bench/README.md)",
    )
    parser.add_argument("--maintenance-interval", help=f"sets {MAINTENANCE_CONF}")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--work-dir", help="where checkpoints go (default: a temporary folder)")
    parser.add_argument("--out", help="the JSON report (default: bench/results/w5-<time>.json)")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    args.keys = [int(k) for k in args.keys.split(",")] if args.keys else list(size.keys)
    args.payload = args.payload or size.payload
    args.updates = args.updates or size.updates
    args.batches = args.batches or size.batches
    args.driver_memory = args.driver_memory or size.driver_memory
    args.jvm = args.jvm or size.jvm
    w1.resolve_warmup(parser, args)
    if len(args.keys) < 2 or args.keys != sorted(set(args.keys)):
        parser.error("--keys must name at least two different K values, in increasing order")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.repeat > 1 and args.jvm == "shared":
        parser.error("--repeat runs each provider in a JVM of its own: not with --jvm shared")
    if args.batches < w1.STEADY_FROM + 1:
        parser.error(f"--batches must be at least {w1.STEADY_FROM + 1}")
    if min(*args.keys, args.payload, args.updates) < 1:
        parser.error("--keys, --payload and --updates must be positive")
    return args


def _growth(low: dict[str, Any], high: dict[str, Any], key: str) -> float | None:
    a, b = low.get(key), high.get(key)
    return b / a if a and b is not None else None


def summarize(
    keys: int, run: dict[str, Any], more: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """W1's figures for one run, plus the memory per key; with ``more`` runs of the same provider
    and K (``--repeat``), the batch figures are over the batches of all of them (see pooled)."""
    rounds = (run, *more)
    run = pooled(run, more)
    s = w1.summarize(run)
    if more:
        s.update(per_round_figures(rounds))
    used = s.get("memory_used_bytes")
    retained = s.get("heap_retained_over_baseline_bytes")
    faulting, counted = faulting_batches(run.get("batches", []))
    return {
        **s,
        "rounds": len(rounds),
        "keys": keys,
        "faulting_batches": faulting,
        "faults_counted_batches": counted,
        "memory_used_bytes_per_key": used / keys if used is not None else None,
        "heap_retained_per_key": retained / keys if retained is not None else None,
    }


def per_round_figures(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures of w1.summarize that name batches, for runs pooled from several rounds: each
    round numbers its batches from 0, so which batches ran beside a snapshot is known per round
    (``compaction_batches`` becomes one list per pooled run, in order), and the slowest batch is
    named with its round (``trigger_ms_max_round``, counted from 1: a run's ``round``, which
    main gives each later round's run, else its place in ``rounds``), as is the longest steady
    GC pause (``gc_pause_max_batch``, ``gc_pause_max_round``)."""
    beside: list[float] = []
    other: list[float] = []
    during_each: list[list[int]] = []
    slowest: tuple[float, int, int] | None = None
    longest: tuple[float, int, int] | None = None
    for i, r in enumerate(rounds, start=1):
        during = w1.compaction_batches(r["batches"])
        during_each.append(sorted(during))
        for batch, p in w1.steady_pause_records(r):
            if longest is None or p["pause_ms"] > longest[0]:
                longest = (p["pause_ms"], batch, r.get("round", i))
        for b in r["batches"]:
            if b["batch"] < w1.STEADY_FROM:
                continue
            if b.get("commit_ms") is not None:
                (beside if b["batch"] in during else other).append(b["commit_ms"])
            trigger = b.get("trigger_ms")
            if trigger is not None and (slowest is None or trigger > slowest[0]):
                slowest = (trigger, b["batch"], r.get("round", i))
    return {
        "compaction_batches": during_each,
        "commit_ms_median_compaction": median(beside),
        "commit_ms_max_compaction": maximum(beside),
        "commit_ms_median_other": median(other),
        "trigger_ms_max_batch": slowest[1] if slowest else None,
        "trigger_ms_max_round": slowest[2] if slowest else None,
        # The longest steady GC pause's batch, and its round (w1.summarize's batch alone cannot
        # tell the rounds apart).
        "gc_pause_max_batch": longest[1] if longest else None,
        "gc_pause_max_round": longest[2] if longest else None,
    }


def pooled(run: dict[str, Any], more: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``run`` with the batches, GC pauses and marking cycles of the ``more`` runs (later rounds
    of the same provider and K) after its own. Each pause and cycle falls in its own run's
    batches, as each carries its time since the epoch. The figures of the last batch (memory
    used, state bytes) are then the last round's, of the same state; the heap measured after
    the run stays ``run``'s."""
    if not more:
        return run
    runs = (run, *more)
    out = {**run, "batches": [b for r in runs for b in r["batches"]]}
    for key in ("gc_pauses", "gc_mark_cycles"):
        if all(r.get(key) is not None for r in runs):
            out[key] = [x for r in runs for x in r[key]]
        else:
            out.pop(key, None)
    return out


def round_specs(specs: list[dict[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """``specs`` in ``rounds`` rounds, in their order in each. A later round's run is named and
    works apart (``heapstate@1000000#2``) and knows its first round's name."""
    out = list(specs)
    for r in range(2, rounds + 1):
        out += [
            {
                **spec,
                "round": r,
                "first_run_name": spec["run_name"],
                "run_name": f"{spec['run_name']}#{r}",
                "work_dir": f"{spec['work_dir']}-{r}",
            }
            for spec in specs
        ]
    return out


def runs_by_round(report: Mapping[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """Every run of a W1 or W5 report by its first round's name, then by its round (counted from
    1): ``runs`` holds the first round's, ``repeat_runs`` the later rounds' (``--repeat``). A run
    whose first round failed has no round 1. A later run carries its ``round``; in a report
    from before it did, the later runs fill the rounds that ``failures`` does not name
    (``<name>#<round>``), in order."""
    runs = report.get("runs") or {}
    repeats = report.get("repeat_runs") or {}
    failures = report.get("failures") or {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for name in [*runs, *(n for n in repeats if n not in runs)]:
        unnamed = (r for r in itertools.count(2) if f"{name}#{r}" not in failures)
        out[name] = {1: runs[name]} if name in runs else {}
        for run in repeats.get(name, []):
            out[name][run.get("round") or next(unnamed)] = run
    return out


def faulting_batches(batches: list[dict[str, Any]]) -> tuple[int | None, int]:
    """How many steady batches took at least FAULTING_BATCH minor faults (None when no batch has
    the count: a run without /proc), and how many steady batches have the count."""
    faults = [
        b["minor_faults"]
        for b in batches
        if b["batch"] >= w1.STEADY_FROM and b.get("minor_faults") is not None
    ]
    return (sum(f >= FAULTING_BATCH for f in faults) if faults else None), len(faults)


def growth(summary: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Largest K over the K before it: median trigger, median commit, memory per key."""
    ks = sorted(summary)
    low, high = summary[ks[-2]], summary[ks[-1]]
    return {
        "from_keys": ks[-2],
        "to_keys": ks[-1],
        "trigger_ratio": _growth(low, high, "trigger_ms_median"),
        "commit_ratio": _growth(low, high, "commit_ms_median"),
        "commit_store_ratio": _growth(low, high, "commit_store_ms_median"),
        "commit_report_ratio": _growth(low, high, "commit_report_ms_median"),
        "commit_store_cpu_ratio": _growth(low, high, "commit_store_cpu_ms_median"),
        "memory_per_key_ratio": _growth(low, high, "memory_used_bytes_per_key"),
        "heap_per_key_ratio": _growth(low, high, "heap_retained_per_key"),
        "jvm_cpu_ratio": _growth(low, high, "jvm_cpu_ms_median"),
        # The machine probe's fixed work (bench/_probe.py): above 1.00x, the machine ran slower
        # in the larger K's batches than in the smaller's.
        "probe_ratio": _growth(low, high, "probe_us_median"),
        "faulting_from": low.get("faulting_batches"),
        "faulting_to": high.get("faulting_batches"),
        "marking_ms_from": low.get("gc_marking_ms_total"),
        "marking_ms_to": high.get("gc_marking_ms_total"),
    }


def targets(
    summaries: dict[str, dict[int, dict[str, Any]]], growths: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """heapstate's W5 targets, each with its figure and verdict (None: not measured)."""
    hs, hs_growth = summaries.get("heapstate"), growths.get("heapstate")
    if hs is None or hs_growth is None:
        return []
    top = hs[max(hs)]
    out: list[dict[str, Any]] = []
    for key, what in (("trigger_ratio", "median trigger"), ("commit_ratio", "median commit")):
        value = hs_growth[key]
        out.append(
            {
                "target": f"{what} at K={hs_growth['to_keys']:,} <= {GROWTH_LIMIT}x "
                f"K={hs_growth['from_keys']:,}",
                "value": value,
                "limit": GROWTH_LIMIT,
                "pass": None if value is None else value <= GROWTH_LIMIT,
            }
        )
    pause = top.get("gc_pause_ms_max")
    out.append(
        {
            "target": f"longest GC pause at K={max(hs):,} < {PAUSE_LIMIT_MS:.0f} ms",
            "value": pause,
            "limit": PAUSE_LIMIT_MS,
            "pass": None if pause is None else pause < PAUSE_LIMIT_MS,
        }
    )
    rocks = summaries.get("rocksdb-changelog")
    for k in sorted(hs):
        mine = hs[k].get("trigger_ms_median")
        theirs = rocks.get(k, {}).get("trigger_ms_median") if rocks else None
        out.append(
            {
                "target": f"median trigger below RocksDB+changelog's at K={k:,}",
                "value": mine,
                "limit": theirs,
                "pass": None if mine is None or theirs is None else mine < theirs,
            }
        )
    return out


def print_report(
    title: str,
    summaries: dict[str, dict[int, dict[str, Any]]],
    growths: dict[str, dict[str, Any]],
    verdicts: list[dict[str, Any]],
) -> None:
    print(title)
    header = (
        "provider",
        "K",
        "median trigger",
        "max trigger",
        "median commit",
        "  store / report",
        "memoryUsedBytes",
        "per key",
        "heap per key",
        "GC pauses",
        "longest",
        "faults",
        "faulting",
        "marking",
        "JVM CPU",
    )
    rows = [header]
    for name, by_k in summaries.items():
        for k in sorted(by_k):
            s = by_k[k]

            def cell(key: str, fmt: Any, s: dict[str, Any] = s) -> str:
                return fmt(s[key]) if s.get(key) is not None else "-"

            rows.append(
                (
                    PROVIDERS[name].label,
                    f"{k:,}",
                    cell("trigger_ms_median", fmt_ms),
                    cell("trigger_ms_max", fmt_ms),
                    cell("commit_ms_median", fmt_ms),
                    split(s),
                    cell("memory_used_bytes", fmt_bytes),
                    cell("memory_used_bytes_per_key", lambda v: f"{v:,.0f} B"),
                    cell("heap_retained_per_key", lambda v: f"{v:,.0f} B"),
                    cell("gc_pause_ms_total", fmt_ms_fine),
                    cell("gc_pause_ms_max", fmt_ms_fine),
                    cell("minor_faults_median", lambda v: f"{v:,.0f}"),
                    _faulting(s),
                    _marking(s),
                    cell("jvm_cpu_ms_median", fmt_ms),
                )
            )
    _print_rows(rows)
    print(
        "(faults and JVM CPU: the worker JVM's minor page faults and CPU time in a steady batch, "
        f"median; faulting: the steady batches with at least {FAULTING_BATCH:,} minor faults; "
        "marking: G1's concurrent marking beside the steady batches of every round, in all, and "
        "in how many)"
    )
    print("\nGrowth, largest K over the K before it (1.00x is flat):")
    rows = [
        (
            "provider",
            "K",
            "median trigger",
            "median commit",
            "  in the store",
            "  its CPU",
            "  in the report",
            "memory per key",
            "heap per key",
            "JVM CPU",
            "machine probe",
            "faulting",
            "marking",
        )
    ]
    for name, g in growths.items():

        def r(key: str, g: dict[str, Any] = g) -> str:
            return f"{g[key]:.2f}x" if g.get(key) is not None else "-"

        rows.append(
            (
                PROVIDERS[name].label,
                f"{g['from_keys']:,} -> {g['to_keys']:,}",
                r("trigger_ratio"),
                r("commit_ratio"),
                r("commit_store_ratio"),
                r("commit_store_cpu_ratio"),
                r("commit_report_ratio"),
                r("memory_per_key_ratio"),
                r("heap_per_key_ratio"),
                r("jvm_cpu_ratio"),
                r("probe_ratio"),
                _faults(g),
                _markings(g),
            )
        )
    _print_rows(rows)
    print_cpu_by_thread(summaries)
    if verdicts:
        print("\nW5 targets for heapstate:")
        for t in verdicts:
            verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
            detail = ""
            if t["value"] is not None and t["limit"] is not None:
                detail = f"  ({t['value']:,.2f} vs limit {t['limit']:,.2f})"
            print(f"  {verdict}  {t['target']}{detail}")
        hs = growths.get("heapstate", {})
        top = summaries.get("heapstate", {}).get(hs.get("to_keys"), {})
        if top.get("gc_pause_max_described"):
            print(
                f"  note: heapstate's longest steady pause at K={hs['to_keys']:,} ("
                + (
                    f"round {top['gc_pause_max_round']}, "
                    if top.get("gc_pause_max_round") is not None
                    else ""
                )
                + f"batch {top['gc_pause_max_batch']}): {top['gc_pause_max_described']}"
            )
        a, b = hs.get("faulting_from"), hs.get("faulting_to")
        if a is not None and b:
            print(
                f"  note: {b} of heapstate's steady batches at K={hs['to_keys']:,} took at least "
                f"{FAULTING_BATCH:,} minor page faults ({a} at K={hs['from_keys']:,}): the JVM's "
                "first touches of heap it took on in batch 0, which slowed some runs' batches at "
                "K=4M (see PRETOUCH and --pretouch)"
            )
        a, b = hs.get("marking_ms_from"), hs.get("marking_ms_to")
        if a is not None and b is not None and b >= 1:
            print(
                f"  note: G1's concurrent marking ran {fmt_ms(b)} beside heapstate's steady "
                f"batches at K={hs['to_keys']:,} ({fmt_ms(a)} at K={hs['from_keys']:,}): a "
                "marking thread takes one of the cores the tasks run on (see bench/README.md, W5)"
            )


def print_cpu_by_thread(summaries: dict[str, dict[int, dict[str, Any]]]) -> None:
    """The JVM's CPU in a steady batch by the kind of thread that spent it (median of each kind;
    ``CPU_SPLIT_KINDS``), at each K and then the largest K over the K before it. Nothing when no
    run recorded it (reports before stop 63, or no /proc)."""
    kinds = CPU_SPLIT_KINDS
    rows = [("provider", "K", *kinds)]
    for name, by_k in summaries.items():
        split = {
            k: s["jvm_cpu_ms_by_thread_median"]
            for k, s in by_k.items()
            if s.get("jvm_cpu_ms_by_thread_median")
        }
        for k in sorted(split):
            rows.append((PROVIDERS[name].label, f"{k:,}", *(fmt_ms(split[k][c]) for c in kinds)))
        if len(split) >= 2:
            a, b = (split[k] for k in sorted(split)[-2:])
            rows.append(
                (
                    PROVIDERS[name].label,
                    "growth",
                    *(f"{b[c] / a[c]:.2f}x" if a[c] >= 1 else "-" for c in kinds),
                )
            )
    if len(rows) == 1:
        return
    print("\nJVM CPU a steady batch by thread (median of each kind; they need not add up to the")
    print("median of the whole):")
    _print_rows(rows)
    print(
        "(task: Spark's task threads; driver: the query's thread; jit and gc: the compilers, the "
        "collector's and the VM's threads; store background: heapstate's snapshot thread and "
        "Spark's maintenance; ended: threads that ended within the batch)"
    )


def _faults(g: dict[str, Any]) -> str:
    """The faulting steady batches at the two K values, as ``from -> to``."""
    a, b = g.get("faulting_from"), g.get("faulting_to")
    return "-" if a is None or b is None else f"{a} -> {b}"


def _markings(g: dict[str, Any]) -> str:
    """G1's concurrent marking beside the steady batches at the two K values, as ``from -> to``."""
    a, b = g.get("marking_ms_from"), g.get("marking_ms_to")
    return "-" if a is None or b is None else f"{fmt_ms(a)} -> {fmt_ms(b)}"


def _marking(s: dict[str, Any]) -> str:
    """A run's G1 concurrent marking beside its steady batches: ``1,234 ms (4)``, or ``0 ms``."""
    total, n = s.get("gc_marking_ms_total"), s.get("gc_marking_batches")
    if total is None:
        return "-"
    return f"{fmt_ms(total)} ({n})" if n else fmt_ms(total)


def _faulting(s: dict[str, Any]) -> str:
    """A run's faulting steady batches, of those counted: ``4/10``."""
    n, of = s.get("faulting_batches"), s.get("faults_counted_batches")
    return "-" if n is None else f"{n}/{of}"


def split(s: dict[str, Any]) -> str:
    """heapstate's median commit parts: its store's own work, and Spark's coordinator report."""
    store, report = s.get("commit_store_ms_median"), s.get("commit_report_ms_median")
    return "-" if store is None or report is None else f"{store:,.1f} / {report:,.1f} ms"


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print(
            "  ".join(
                c.ljust(widths[j]) if j < 2 else c.rjust(widths[j]) for j, c in enumerate(row)
            )
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    providers = parse_providers(args.providers)
    python = args.python
    if not Path(python).exists():
        raise SystemExit(f"--python {python}: no such interpreter (run bin/setup first?)")
    jar = resolve_jar(args.jar, python) if any(p.needs_jar for p in providers) else None
    confs = parse_confs(args.conf)
    if args.maintenance_interval:
        confs[MAINTENANCE_CONF] = args.maintenance_interval
    stamp = timestamp()
    out = Path(args.out) if args.out else RESULTS_DIR / f"w5-{stamp}.json"
    log_dir = out.with_suffix(".logs")
    work_root = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="w5-"))
    work_root.mkdir(parents=True, exist_ok=True)
    jar_copy, jar_info = None, None
    if jar is not None:  # a private copy: a rebuild during the run must not change the classes
        jar_copy = work_root / "heapstate.jar"
        shutil.copyfile(jar, jar_copy)
        jar_info = {"path": str(jar), "sha256": hashlib.sha256(jar_copy.read_bytes()).hexdigest()}
    progress(
        f"W5: K={', '.join(f'{k:,}' for k in args.keys)} P={args.payload} U={args.updates:,} "
        f"batches={args.batches}, providers {', '.join(p.name for p in providers)}, "
        f"JVM {args.jvm}; logs in {log_dir}"
    )

    submit_env = {"PYSPARK_SUBMIT_ARGS": pyspark_submit_args(args.driver_memory)}
    specs: list[dict[str, Any]] = []
    for keys in args.keys:
        params = {
            "keys": keys,
            "payload": args.payload,
            "updates": args.updates,
            "batches": args.batches,
            "seed": args.seed,
        }
        data_dir = RESULTS_DIR / "data" / f"w1-k{keys}-p{args.payload}-u{args.updates}-s{args.seed}"
        gen_spec = {**params, "files": args.batches + 1, "data_dir": str(data_dir)}
        run_worker(
            python,
            w1.SCRIPT,
            [
                "--worker",
                "generate",
                "--spec",
                str(w1._spec_file(work_root, f"gen-{keys}", gen_spec)),
            ],
            log_dir / "generate.log",
            submit_env,
        )
        warmup_dir = (
            w1.generate_warmup_data(python, params, data_dir.parent, work_root, log_dir, submit_env)
            if args.warmup_batches > 0
            else None
        )
        for provider in providers:
            specs.append(
                {
                    **params,
                    "provider": provider.name,
                    "run_name": f"{provider.name}@{keys}",
                    "data_dir": str(data_dir),
                    "work_dir": str(work_root / f"{provider.name}-{keys}"),
                    "spark_confs": {**provider.spark_confs(), **confs},
                    "provider_confs": provider.spark_confs(),
                    "restart": "none",
                    "restart_warmup": False,
                    "warmup_batches": args.warmup_batches,
                    "warmup_data_dir": warmup_dir,
                }
            )

    java_options = w1.worker_java_options(args)
    runs: dict[str, dict[str, Any]] = {}
    repeats: dict[str, list[dict[str, Any]]] = {}  # the later rounds' runs, by first run's name
    failures: dict[str, str] = {}
    probe = _probe.Probe(log_dir / "probe.txt") if args.probe else None
    try:
        if probe is not None:
            probe.start()
        if args.jvm == "shared":
            jars = [jar_copy] if jar_copy is not None else []
            runs, failures = w1.run_shared(
                python, specs, confs, work_root, log_dir, args.driver_memory, jars, java_options
            )
        for spec in round_specs(specs, args.repeat) if args.jvm == "per-provider" else ():
            name = spec["run_name"]
            progress(f"W5: {name}")
            jars = [jar_copy] if PROVIDERS[spec["provider"]].needs_jar and jar_copy else []
            try:
                run = w1.run_provider(
                    python, spec, work_root, log_dir, args.driver_memory, jars, java_options
                )
                if spec.get("round", 1) == 1:
                    runs[name] = run
                else:  # its round, as a failed round leaves a gap in the list
                    run = {**run, "round": spec["round"]}
                    repeats.setdefault(spec["first_run_name"], []).append(run)
            except RuntimeError as err:  # one run failing must not lose the others
                failures[name] = str(err)
                progress(f"{name}: FAILED: {err}")
            shutil.rmtree(spec["work_dir"], ignore_errors=True)
    finally:
        if probe is not None:
            probe.stop()
        if not args.work_dir:
            shutil.rmtree(work_root, ignore_errors=True)
    if not runs and not repeats:
        raise SystemExit(f"every run failed; logs in {log_dir}")
    if probe is not None:
        probe.attach_to([*runs.values(), *(r for rs in repeats.values() for r in rs)])

    summaries: dict[str, dict[int, dict[str, Any]]] = {}
    for spec in specs:
        # Every round that succeeded counts, the first among them as the base (see pooled).
        done = [r for r in [runs.get(spec["run_name"])] if r is not None]
        done += repeats.get(spec["run_name"], [])
        if done:
            summaries.setdefault(spec["provider"], {})[spec["keys"]] = summarize(
                spec["keys"], done[0], done[1:]
            )
    growths = {name: growth(by_k) for name, by_k in summaries.items() if len(by_k) >= 2}
    verdicts = targets(summaries, growths)
    environment = next(iter([*runs.values(), *(r for rs in repeats.values() for r in rs)]))[
        "environment"
    ]
    title = (
        f"\nW5 growth: K={', '.join(f'{k:,}' for k in args.keys)} P={args.payload} "
        f"U={args.updates:,} batches={args.batches}, Spark {environment['spark_version']}, "
        f"driver {args.driver_memory}, JVM {args.jvm}, JVM options: "
        f"{' '.join(java_options) or 'none'}"
        + (
            f", {args.repeat} rounds (medians over the steady batches of every round)"
            if args.repeat > 1
            else ""
        )
    )
    print_report(title, summaries, growths, verdicts)

    report = {
        "benchmark": "W5",
        "timestamp": stamp,
        "size": args.size,
        "params": {
            "keys": args.keys,
            "payload": args.payload,
            "updates": args.updates,
            "batches": args.batches,
            "seed": args.seed,
        },
        "driver_memory": args.driver_memory,
        "jvm": args.jvm,
        "warmup_batches": args.warmup_batches,
        # Each K's warm-up data set (w1.WARMUP_SCALE); None: none, or a report from before it.
        "warmup_data": (
            {str(k): w1.warmup_shape({"keys": k, "updates": args.updates}) for k in args.keys}
            if args.warmup_batches > 0
            else None
        ),
        "java_options": java_options,
        "steady_from_batch": w1.STEADY_FROM,
        # The machine probe beside the runs (bench/_probe.py), or None: --no-probe.
        "probe": _probe.settings() if args.probe else None,
        "heapstate_jar": jar_info,
        "python": python,
        "host": host_info(),
        "git": w1._git_state(),
        "environment": environment,
        "providers": {p.name: asdict(p) for p in providers},
        "summary": {n: {str(k): s for k, s in by_k.items()} for n, by_k in summaries.items()},
        "growth": growths,
        "targets": verdicts,
        "runs": runs,
        # --repeat: the rounds, and each run's later rounds (the summary's medians pool them).
        "repeat": args.repeat,
        "repeat_runs": repeats,
        "failures": failures,
    }
    print(f"\nJSON: {write_json(out, report)}")
    for name, err in failures.items():
        print(f"{name} FAILED: {err.splitlines()[0]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
