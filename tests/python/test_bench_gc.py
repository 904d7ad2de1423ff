"""W1's account of G1's concurrent marking: the cycles read from a JVM's ``-Xlog:gc`` log
(``bench/_common.py``), and the slowest steady batch with the marking time that ran beside it
(``bench/w1.py``). A hand-written log and run: no Spark, exact figures."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import w1  # bench/ is a folder of scripts, put on the path above
from _common import PROC_KEYS, describe_pause, gc_mark_cycles, gc_pauses, marking_ms_between

# What -Xlog:gc:file=...:timemillis writes, cut down: a cycle G1 undid, two full cycles (the
# second starting while the first one's id is still open in another log line), pauses, and a
# cycle the log does not see end.
LOG = """\
[1000ms] Using G1
[1100ms] GC(3) Pause Young (Concurrent Start) (G1 Humongous Allocation) 100M->90M(512M) 5.000ms
[1100ms] GC(4) Concurrent Undo Cycle
[1150ms] GC(4) Concurrent Undo Cycle 50.000ms
[2000ms] GC(7) Pause Young (Concurrent Start) (G1 Humongous Allocation) 300M->280M(512M) 9.000ms
[2000ms] GC(8) Concurrent Mark Cycle
[2300ms] GC(8) Pause Remark 290M->280M(512M) 4.000ms
[2600ms] GC(8) Concurrent Mark Cycle 600.500ms
[5000ms] GC(12) Concurrent Mark Cycle
[5100ms] GC(12) Concurrent Mark Cycle 100.000ms
[9000ms] GC(20) Concurrent Mark Cycle
"""


def test_marking_cycles_are_read_from_the_gc_log(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    log.write_text(LOG)
    assert gc_mark_cycles(log) == [
        {"start_epoch_ms": 2000, "end_epoch_ms": 2600, "cycle_ms": 600.5},
        {"start_epoch_ms": 5000, "end_epoch_ms": 5100, "cycle_ms": 100.0},
    ]
    assert gc_mark_cycles(tmp_path / "missing.log") == []


def test_marking_time_inside_a_window() -> None:
    cycles = [
        {"start_epoch_ms": 2000, "end_epoch_ms": 2600, "cycle_ms": 600.0},
        {"start_epoch_ms": 5000, "end_epoch_ms": 5100, "cycle_ms": 100.0},
    ]
    assert marking_ms_between(cycles, 1800, 2200) == 200.0
    assert marking_ms_between(cycles, 2100, 2300) == 200.0
    assert marking_ms_between(cycles, 2500, 5050) == 150.0
    assert marking_ms_between(cycles, 2600, 5000) == 0.0
    assert marking_ms_between([], 0, 10_000) == 0.0


def _batch(batch: int, start: int, trigger: int) -> dict[str, Any]:
    return {
        "batch": batch,
        "trigger_ms": trigger,
        "commit_ms": 10,
        "memory_used_bytes": 1,
        "state_bytes_new": 1,
        "state_bytes_total": batch,
        "new_snapshot_versions": [],
        "start_epoch_ms": start,
        "end_epoch_ms": start + trigger,
    }


def test_the_slowest_steady_batch_and_the_marking_beside_it(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    log.write_text(LOG)
    batches = [
        _batch(0, 0, 1500),  # batch 0 and 1 are not steady: the first cycle's start is not counted
        _batch(1, 1500, 400),
        _batch(2, 1900, 300),  # 1900-2200: 200 ms of the cycle of 2000-2600
        _batch(3, 2200, 700),  # 2200-2900: the slowest, 400 ms of that cycle
        _batch(4, 2900, 300),
        _batch(5, 4900, 250),  # 4900-5150: the 100 ms cycle
    ]
    batches[3]["commit_ms"] = 175
    pauses = [
        {"end_epoch_ms": 2150, "kind": "Pause Young", "pause_ms": 80.0},  # in batch 2
        {"end_epoch_ms": 2300, "kind": "Pause Young", "pause_ms": 12.0},  # in batch 3
        {"end_epoch_ms": 2850, "kind": "Pause Young", "pause_ms": 52.0},  # in batch 3
    ]
    run = {"batches": batches, "gc_pauses": pauses, "gc_mark_cycles": gc_mark_cycles(log)}
    summary = w1.summarize(run)
    assert summary["trigger_ms_max"] == 700
    assert summary["trigger_ms_max_batch"] == 3
    assert summary["trigger_ms_max_marking_ms"] == 400.0
    assert summary["trigger_ms_max_pause_ms"] == 52.0  # not batch 2's 80 ms
    assert summary["trigger_ms_max_commit_ms"] == 175
    assert summary["gc_marking_batches"] == 3  # steady batches with any marking: 2, 3 and 5
    assert summary["gc_marking_ms_total"] == 200.0 + 400.0 + 100.0

    # No pause in the slowest batch is 0 ms; a run whose report has no pauses says nothing.
    assert w1.summarize({**run, "gc_pauses": pauses[:1]})["trigger_ms_max_pause_ms"] == 0.0
    no_pauses = {k: v for k, v in run.items() if k != "gc_pauses"}
    assert w1.summarize(no_pauses)["trigger_ms_max_pause_ms"] is None

    # A run from before the report read marking cycles says nothing about them, not zero.
    older = w1.summarize({"batches": batches, "gc_pauses": []})
    assert older["gc_marking_batches"] is None
    assert older["gc_marking_ms_total"] is None
    assert older["trigger_ms_max_marking_ms"] is None
    assert older["trigger_ms_max_batch"] == 3


# What the workers' GC_LOG_TAGS write for a young pause, a remark and a full collection, cut
# down from a JDK 17 log: the phases and regions before each pause's line, its threads' CPU and
# its safepoint after it, and a safepoint that is no collection's.
DETAILED_LOG = """\
[1000ms] Using G1
[2000ms] GC(5)   Pre Evacuate Collection Set: 0.1ms
[2000ms] GC(5)   Merge Heap Roots: 0.4ms
[2000ms] GC(5)   Evacuate Collection Set: 45.2ms
[2000ms] GC(5)   Post Evacuate Collection Set: 1.3ms
[2000ms] GC(5)   Other: 0.5ms
[2000ms] GC(5) Eden regions: 400->0(380)
[2000ms] GC(5) Survivor regions: 10->14(50)
[2000ms] GC(5) Old regions: 300->306
[2000ms] GC(5) Archive regions: 2->2
[2000ms] GC(5) Humongous regions: 120->120
[2000ms] GC(5) Pause Young (Normal) (G1 Evacuation Pause) 3324M->1635M(4592M) 51.568ms
[2000ms] GC(5) User=0.03s Sys=0.01s Real=0.05s
[2000ms] Safepoint "G1CollectForAllocation", Time since last: 1000 ns, Reaching safepoint: 2500000 ns, Cleanup: 3665 ns, At safepoint: 51600000 ns, Total: 54100000 ns
[2500ms] Safepoint "Cleanup", Time since last: 1000 ns, Reaching safepoint: 9000000 ns, Cleanup: 1 ns, At safepoint: 1 ns, Total: 9000002 ns
[2600ms] GC(6) Concurrent Mark Cycle
[2700ms] GC(6) Pause Remark 300M->290M(512M) 4.000ms
[2700ms] GC(6) User=0.00s Sys=0.00s Real=0.00s
[2700ms] Safepoint "G1PauseRemark", Time since last: 1 ns, Reaching safepoint: 93258 ns, Cleanup: 1 ns, At safepoint: 1 ns, Total: 93260 ns
[3000ms] GC(9) Phase 1: Mark live objects 60.000ms
[3000ms] GC(9) Phase 2: Prepare for compaction 20.500ms
[3000ms] GC(9) Eden regions: 32->0(31)
[3000ms] GC(9) Pause Full (System.gc()) 102M->49M(174M) 90.000ms
"""


def test_pause_details_are_read_from_the_gc_log(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    log.write_text(DETAILED_LOG)
    young, remark, full = gc_pauses(log)
    assert young == {
        "end_epoch_ms": 2000,
        "kind": "Pause Young",
        "pause_ms": 51.568,
        "gc_id": 5,
        "phases": {
            "Pre Evacuate Collection Set": 0.1,
            "Merge Heap Roots": 0.4,
            "Evacuate Collection Set": 45.2,
            "Post Evacuate Collection Set": 1.3,
            "Other": 0.5,
        },
        "regions": {
            "Eden": [400, 0],
            "Survivor": [10, 14],
            "Old": [300, 306],
            "Archive": [2, 2],
            "Humongous": [120, 120],
        },
        "cpu_ms": 40.0,
        "real_ms": 50.0,
        "reach_safepoint_ms": 2.5,  # its own safepoint, not the later "Cleanup" one's 9 ms
        "safepoint": "G1CollectForAllocation",
    }
    assert describe_pause(young) == (
        "Pause Young 51.6 ms (Evacuate Collection Set 45.2 ms; JVM CPU 40 ms in 50 ms; "
        "reaching the safepoint 2.5 ms; Survivor regions 10->14; Old regions 300->306)"
    )
    assert remark["kind"] == "Pause Remark" and remark["gc_id"] == 6
    assert "phases" not in remark and remark["reach_safepoint_ms"] == 0.093
    assert full["phases"] == {
        "Phase 1: Mark live objects": 60.0,
        "Phase 2: Prepare for compaction": 20.5,
    }
    assert full["regions"] == {"Eden": [32, 0]}
    assert "cpu_ms" not in full and "reach_safepoint_ms" not in full  # the log ends first
    assert describe_pause(full) == "Pause Full 90.0 ms (Phase 1: Mark live objects 60.0 ms)"
    # A log of -Xlog:gc alone (reports before stop 72) gives the pauses without details.
    plain = tmp_path / "plain.log"
    plain.write_text(LOG)
    assert [(p["kind"], p["pause_ms"], len(p)) for p in gc_pauses(plain)] == [
        ("Pause Young", 5.0, 4),
        ("Pause Young", 9.0, 4),
        ("Pause Remark", 4.0, 4),
    ]
    assert describe_pause(gc_pauses(plain)[0]) == "Pause Young 5.0 ms"


def test_the_longest_steady_pause_is_described_with_its_batch(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    log.write_text(DETAILED_LOG)
    batches = [_batch(0, 0, 1500), _batch(1, 1500, 300), _batch(2, 1800, 600), _batch(3, 2650, 300)]
    summary = w1.summarize({"batches": batches, "gc_pauses": gc_pauses(log)})
    assert summary["gc_pause_ms_max"] == 51.568
    assert summary["gc_pause_max_batch"] == 2
    assert summary["gc_pause_max_described"].startswith("Pause Young 51.6 ms (Evacuate Collection")
    # Pauses outside the steady batches are not counted: the full one (3000 ms) ends after them.
    assert summary["gc_pauses"] == 2
    none = w1.summarize({"batches": batches[:2], "gc_pauses": gc_pauses(log)})
    assert none["gc_pause_max_described"] is None and none["gc_pause_max_batch"] is None


# The spikes target as w1.targets gives it for a slowest batch 3 with 400 ms of marking in it.
SPIKES = {
    "target": "max trigger <= 1.5x median (batch >= 2)",
    "value": 700.0,
    "limit": 450.0,
    "pass": False,
    "slowest_batch": 3,
    "slowest_batch_marking_ms": 400.0,
    "slowest_batch_pause_ms": 52.0,
    "slowest_batch_commit_ms": 175,
}


def test_the_spike_target_names_the_slowest_batch(capsys: Any) -> None:
    hs = {"trigger_ms_max": 700.0, "trigger_ms_median": 300.0, "trigger_ms_max_batch": 3}
    measured = {
        "trigger_ms_max_marking_ms": 400.0,
        "trigger_ms_max_pause_ms": 52.0,
        "trigger_ms_max_commit_ms": 175,
    }
    spikes = [
        t
        for t in w1.targets({"heapstate": {**hs, **measured}})
        if t["target"].startswith("max trigger")
    ]
    assert spikes == [SPIKES]
    w1.print_targets(spikes)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  FAIL  max trigger <= 1.5x median (batch >= 2)  (700 vs limit 450); "
        "slowest: batch 3, G1 marking ran 400 ms of it, longest GC pause in it 52 ms, "
        "its commit 175 ms"
    )
    # A summary from before these were recorded names the batch alone.
    w1.print_targets(w1.targets({"heapstate": hs})[4:5])
    assert capsys.readouterr().out.splitlines()[-1].endswith("(700 vs limit 450); slowest: batch 3")


def test_the_readme_target_line_names_the_slowest_batch() -> None:
    import report

    assert report._target_line(SPIKES) == (
        "- FAIL: max trigger <= 1.5x median (batch >= 2) (700.0 ms against 450.0 ms); "
        "slowest: batch 3, G1 marking ran 400 ms of it, longest GC pause in it 52 ms, "
        "its commit 175 ms"
    )
    # Reports written before the pause and the commit were recorded read as they did.
    marking_only = {
        k: v
        for k, v in SPIKES.items()
        if k not in ("slowest_batch_pause_ms", "slowest_batch_commit_ms")
    }
    assert report._target_line(marking_only) == (
        "- FAIL: max trigger <= 1.5x median (batch >= 2) (700.0 ms against 450.0 ms); "
        "slowest: batch 3, G1 marking ran 400 ms of it"
    )
    older = {k: v for k, v in SPIKES.items() if not k.startswith("slowest")}
    assert report._target_line(older) == (
        "- FAIL: max trigger <= 1.5x median (batch >= 2) (700.0 ms against 450.0 ms)"
    )


def test_the_commit_split_is_the_median_of_heapstates_commit_metrics() -> None:
    batches = [_batch(b, 1000 * b, 300) for b in range(6)]
    parts = [
        (90_000, 1_000, 50_000, 30_000),
        (80_000, 2_000, 40_000, 30_000),
        (4_000, 12_000, 2_000, 1_500),
        (6_000, 9_500, 3_500, 200),
        (5_000, 300, 2_500, 900),
        (7_500, 800, 1_000, 6_000),
    ]
    for b, (store, report, cpu, queued) in zip(batches, parts):
        b["custom_metrics"] = {
            "heapstateCommitStoreMicros": store,
            "heapstateCommitReportMicros": report,
            "heapstateCommitStoreCpuMicros": cpu,
            "heapstateCommitStoreRunQueueMicros": queued,
        }
    summary = w1.summarize({"batches": batches, "gc_pauses": []})
    # Batches 2 to 5 only, in ms: the store's 4, 6, 5 and 7.5, the report's 12, 9.5, 0.3 and 0.8,
    # the store's CPU 2, 3.5, 2.5 and 1, its wait for a core 1.5, 0.2, 0.9 and 6.
    assert summary["commit_store_ms_median"] == 5.5
    assert summary["commit_report_ms_median"] == (0.8 + 9.5) / 2
    assert summary["commit_store_cpu_ms_median"] == 2.25
    assert summary["commit_store_run_queue_ms_median"] == 1.2
    # A provider without them (HDFS, RocksDB) has no split, not a zero one.
    plain = w1.summarize({"batches": [_batch(b, 1000 * b, 300) for b in range(6)], "gc_pauses": []})
    assert plain["commit_store_ms_median"] is None and plain["commit_report_ms_median"] is None
    assert plain["commit_store_cpu_ms_median"] is None
    assert plain["commit_store_run_queue_ms_median"] is None


def test_proc_counters_are_read_past_the_command_name() -> None:
    from _common import parse_proc_counters, proc_counters

    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
    # stime ...; the command name holds a space and a parenthesis.
    stat = "4242 (java) x (1)) S 1 4242 4242 0 -1 4194560 123456 0 7 0 55 12 0 0 20\n"
    machine = "cpu  100 0 50 9000 3 0 2 17 0 0\ncpu0 50 0 25 4500 1 0 1 9 0 0\nintr 5\n"
    counted = parse_proc_counters(stat, machine, 100)
    assert (counted.minor_faults, counted.cpu_ms, counted.steal_ms) == (123456, 670.0, 170.0)
    later = parse_proc_counters(
        stat.replace(" 123456 ", " 123556 ").replace(" 55 ", " 60 "), machine, 100
    )
    assert later.since(counted) == {"minor_faults": 100, "jvm_cpu_ms": 50, "steal_ms": 0}
    # This process has run and faulted; one that does not exist has nothing to read.
    if Path("/proc/self/stat").exists():
        mine = proc_counters(os.getpid())
        assert mine is not None and mine.minor_faults > 0 and mine.cpu_ms > 0
    assert proc_counters(2**31 - 1) is None


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Executor task l", "task"),  # Linux keeps 15 characters of a thread's name
        ("Executor task launch worker for task 3.0", "task"),
        ("stream executio", "driver"),
        ("C2 CompilerThre", "jit"),
        ("C1 CompilerThre", "jit"),
        ("GC Thread#1", "gc"),
        ("G1 Conc#0", "gc"),
        ("G1 Main Marker", "gc"),
        ("VM Thread", "gc"),
        ("VM Periodic Tas", "gc"),
        ("heapstate-snaps", "store background"),
        ("state-store-mai", "store background"),
        ("heapstate-clean", "other"),
        ("Thread-3", "other"),
        ("java", "other"),
    ],
)
def test_threads_are_told_apart_by_name(name: str, kind: str) -> None:
    from _common import THREAD_KINDS, thread_kind

    assert thread_kind(name) == kind
    assert kind in THREAD_KINDS


def test_the_cpu_a_batch_is_split_by_the_kind_of_thread() -> None:
    from _common import ProcCounters, parse_thread_cpu

    # A thread's stat has the process's layout; its name may hold spaces and parentheses. Its
    # 14th and 15th fields are its user and system time, its 22nd its start time.
    stat = "77 (C2 (Compil)) S 1 4242 4242 0 -1 4194560 10 0 0 0 30 4 0 0 20 0 1 0 8812 9\n"
    assert parse_thread_cpu(stat, 100) == ("C2 (Compil)", 340.0, 8812)
    # Each thread: kind, CPU ms, start time.
    before = ProcCounters(
        0,
        1000.0,
        0.0,
        {
            1: ("task", 400.0, 10),
            2: ("task", 100.0, 11),
            3: ("jit", 200.0, 5),
            4: ("gc", 50.0, 6),
            5: ("other", 250.0, 7),
            6: ("task", 30.0, 12),
        },
    )
    after = ProcCounters(
        0,
        # 650 ms later: the tasks 300 + 40 + 60 (thread 7, new) + 10 (thread 6's id, held by a
        # thread that started later), the JIT 120, thread 4's id held by a later thread with
        # more time than thread 4 had (80, all of it its own), and threads 4, 5 and 6 ended:
        # the 40 ms no live thread accounts for.
        1650.0,
        0.0,
        {
            1: ("task", 700.0, 10),
            2: ("task", 140.0, 11),
            3: ("jit", 320.0, 5),
            4: ("store background", 80.0, 900),
            6: ("task", 10.0, 902),
            7: ("task", 60.0, 901),
        },
    )
    counted = after.since(before)
    assert counted["jvm_cpu_ms"] == 650
    assert counted["jvm_cpu_ms_by_thread"] == {
        "task": 410,
        "driver": 0,
        "jit": 120,
        "gc": 0,
        "store background": 80,
        "other": 0,
        "ended": 40,  # 650 less 610 that live threads account for
    }
    # Without threads in either reading there is no split, only the process's counts.
    plain = ProcCounters(0, 2000.0, 0.0)
    assert "jvm_cpu_ms_by_thread" not in plain.since(before)
    assert "jvm_cpu_ms_by_thread" not in after.since(ProcCounters(0, 1000.0, 0.0))


def test_this_process_threads_are_read() -> None:
    from _common import proc_counters

    if not Path("/proc/self/task").exists():
        pytest.skip("no /proc/<pid>/task on this system (not Linux)")
    mine = proc_counters(os.getpid())
    assert mine is not None and os.getpid() in mine.threads
    assert mine.threads[os.getpid()][0] == "other"  # the main thread, named after the program


def test_the_median_cpu_by_thread_over_the_steady_batches() -> None:
    batches = [_batch(b, 1000 * b, 300) for b in range(6)]
    for b, (task, jit) in zip(
        batches, [(9000, 9000), (900, 900), (100, 10), (300, 30), (200, 20), (400, 40)]
    ):
        b["jvm_cpu_ms_by_thread"] = {"task": task, "jit": jit, "ended": -1}
    summary = w1.summarize({"batches": batches})
    assert summary["jvm_cpu_ms_by_thread_median"] == {  # batches 2 to 5
        "task": 250.0,
        "driver": 0.0,
        "jit": 25.0,
        "gc": 0.0,
        "store background": 0.0,
        "other": 0.0,
        "ended": -1.0,
    }
    for b in batches:
        del b["jvm_cpu_ms_by_thread"]
    assert w1.summarize({"batches": batches})["jvm_cpu_ms_by_thread_median"] is None


def test_the_spike_target_counts_the_slowest_batch_and_the_other_providers(
    capsys: Any,
) -> None:
    batches = [_batch(b, 1000 * b, t) for b, t in enumerate([1500, 400, 300, 700, 300, 320])]
    for b, faults in zip(batches, [90_000, 8_000, 1_000, 30_000, 2_000, 1_500]):
        b.update(minor_faults=faults, jvm_cpu_ms=faults // 10, steal_ms=b["batch"])
    summary = w1.summarize({"batches": batches})
    assert summary["trigger_ms_max_batch"] == 3
    assert summary["trigger_ms_max_minor_faults"] == 30_000
    assert summary["minor_faults_median"] == 1_750  # batches 2 to 5: 1,000, 30,000, 2,000, 1,500
    assert summary["trigger_ms_max_jvm_cpu_ms"] == 3_000
    assert summary["jvm_cpu_ms_median"] == 175
    assert (summary["trigger_ms_max_steal_ms"], summary["steal_ms_median"]) == (3, 3.5)
    hdfs = {"trigger_ms_max": 900.0, "trigger_ms_median": 500.0}
    rocks = {"trigger_ms_max": 640.0, "trigger_ms_median": 400.0}
    found = w1.targets({"heapstate": summary, "hdfs": hdfs, "rocksdb-changelog": rocks})
    spikes = next(t for t in found if t["target"].startswith("max trigger"))
    assert spikes["slowest_batch_minor_faults"] == 30_000
    assert spikes["median_batch_minor_faults"] == 1_750
    assert spikes["others_max_over_median"] == {"hdfs": 1.8, "rocksdb-changelog": 1.6}
    w1.print_targets([spikes])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  FAIL  max trigger <= 1.5x median (batch >= 2)  (700 vs limit 465); "
        "slowest: batch 3, its commit 10 ms, 30,000 minor page faults (a median batch 1,750), "
        "3,000 ms of the JVM's CPU (a median batch 175), "
        "3 ms stolen by the hypervisor (a median batch 4); "
        "the other providers' max over median: HDFS 1.80x, RocksDB+changelog 1.60x"
    )
    # A report from before these were counted has none of them.
    for b in batches:
        for key in PROC_KEYS:
            del b[key]
    older = w1.summarize({"batches": batches})
    for key in PROC_KEYS:
        assert older[f"{key}_median"] is None
        assert older[f"trigger_ms_max_{key}"] is None
    spikes = next(t for t in w1.targets({"heapstate": older}) if t["target"].startswith("max"))
    assert not any(k.startswith("median_batch") for k in spikes)


def test_the_spike_target_names_the_part_of_the_trigger_the_slowest_batch_grew(
    capsys: Any,
) -> None:
    batches = [_batch(b, 1000 * b, t) for b, t in enumerate([1500, 400, 300, 520, 310, 330])]
    # Spark's durationMs: the slowest batch (3) spent 150 ms more than a median batch in
    # latestOffset and 60 ms more in addBatch; batch 1 is not steady and counts for nothing.
    phases = [(1200, 40), (900, 300), (200, 40), (260, 190), (195, 45), (205, 35)]
    for b, (add, latest) in zip(batches, phases):
        b["duration_ms"] = {
            "addBatch": add,
            "latestOffset": latest,
            "triggerExecution": b["trigger_ms"],
        }
    summary = w1.summarize({"batches": batches})
    # Medians over batches 2 to 5: addBatch (200 + 205) / 2, latestOffset (40 + 45) / 2.
    assert summary["trigger_ms_max_phase"] == "latestOffset"
    assert summary["trigger_ms_max_phase_ms"] == 190
    assert summary["trigger_ms_max_phase_median_ms"] == 42.5
    spikes = next(t for t in w1.targets({"heapstate": summary}) if t["target"].startswith("max"))
    assert spikes["slowest_batch_phase"] == "latestOffset"
    assert spikes["median_batch_phase_ms"] == 42.5
    w1.print_targets([spikes])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  FAIL  max trigger <= 1.5x median (batch >= 2)  (520 vs limit 480); "
        "slowest: batch 3, its commit 10 ms, "
        "the part of the trigger it most exceeded: latestOffset 190 ms (a median batch 42 ms)"
    )
    # A phase the slowest batch has and a median batch lacks counts from 0 there.
    batches[3]["duration_ms"]["walCommit"] = 400
    assert w1.summarize({"batches": batches})["trigger_ms_max_phase"] == "walCommit"
    # Batches without Spark's phases (reports before stop 46) name none.
    for b in batches:
        del b["duration_ms"]
    older = w1.summarize({"batches": batches})
    assert older["trigger_ms_max_phase"] is None
    spikes = next(t for t in w1.targets({"heapstate": older}) if t["target"].startswith("max"))
    assert "slowest_batch_phase" not in spikes
