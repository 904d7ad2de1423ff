"""``bench/cpu_by_batch.py``: CPU samples read from ``jfr print`` output, sorted into categories
and cut at a report's batches. Hand-written recordings and runs: no JVM, exact figures."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import cpu_by_batch as cpu  # bench/ is a folder of scripts, put on the path above

START = dt.datetime(2026, 11, 25, 23, 59, 58, tzinfo=dt.timezone.utc)

# What `jfr print --events jdk.ExecutionSample` writes for an async-profiler recording, cut down:
# a task thread in heapstate's commit, the kernel zeroing a page under a task thread, a compiler
# thread, and a sample after midnight (the output gives the time of day only).
PRINTED = """\
jdk.ExecutionSample {
  startTime = 23:59:59.250
  sampledThread = "Executor task launch worker for task 1.0 in stage 3.0 (TID 13)" (javaThreadId = 85)
  state = "STATE_RUNNABLE"
  stackTrace = [
    heapstate.engine.EntryTable.find(Array[Array[Byte]], Array[Int], Object, long, int, int) line: 70
    heapstate.engine.LiveState.prepareCommit(ChangeSet) line: 247
    heapstate.HeapStateStoreProvider$HeapStore.commit() line: 322
    org.apache.spark.executor.Executor$TaskRunner.run() line: 620
  ]
}

jdk.ExecutionSample {
  startTime = 23:59:59.500
  sampledThread = "Executor task launch worker for task 2.0 in stage 3.0 (TID 14)" (javaThreadId = 86)
  state = "STATE_RUNNABLE"
  stackTrace = [
    .clear_page_erms(k) line: 0
    .exc_page_fault(k) line: 0
    org.apache.spark.sql.catalyst.expressions.UnsafeRow.copy() line: 480
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 00:00:00.750
  sampledThread = "C2 CompilerThread0" (javaThreadId = 12)
  state = "STATE_DEFAULT"
  stackTrace = [
    libjvm.so.PhaseIdealLoop::build_loop_tree() line: 0
  ]
}
"""


def test_samples_are_read_with_their_time_thread_and_frames() -> None:
    samples = list(cpu.parse_samples(PRINTED.splitlines(keepends=True), START))
    day = START.timestamp() * 1000
    assert [s.epoch_ms for s in samples] == [day + 1250, day + 1500, day + 2750]
    assert [s.thread for s in samples] == [
        "Executor task launch worker for task 1.0 in stage 3.0 (TID 13)",
        "Executor task launch worker for task 2.0 in stage 3.0 (TID 14)",
        "C2 CompilerThread0",
    ]
    assert samples[0].frames[0].startswith("heapstate.engine.EntryTable.find(")
    assert len(samples[0].frames) == 4
    assert samples[1].frames == (
        "clear_page_erms(k)",
        "exc_page_fault(k)",
        "org.apache.spark.sql.catalyst.expressions.UnsafeRow.copy()",
    )
    assert samples[2].frames == ("libjvm.so.PhaseIdealLoop::build_loop_tree()",)
    assert [cpu.categorize(s) for s in samples] == ["store commit", "page zeroing", "jit"]


@pytest.mark.parametrize(
    ("thread", "frames", "category"),
    [
        (
            "Executor task launch worker for task 3",
            ["org.apache.spark.sql.execution.SparkPlan.execute()"],
            "spark task",
        ),
        (
            "Executor task launch worker for task 3",
            ["heapstate.engine.LiveState.get(Object)"],
            "store",
        ),
        (
            "Executor task launch worker for task 3",
            [
                "java.util.HashMap.get(Object)",
                "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider$HDFSBackedStateStore.commit()",
            ],
            "store commit",
        ),
        (
            "Executor task launch worker for task 3",
            ["org.rocksdb.RocksDB.put(long, byte[])"],
            "store",
        ),
        (
            "Executor task idle worker#2",
            ["clear_page_rep(k)", "java.lang.Object.<init>()"],
            "page zeroing",
        ),
        (
            "stream execution thread for [id = 1]",
            ["org.apache.spark.sql.catalyst.trees.TreeNode.transform()"],
            "driver",
        ),
        ("GC Thread#1", ["libjvm.so.G1ParScanThreadState::trim_queue()"], "gc"),
        ("G1 Conc#0", ["libjvm.so.G1CMTask::do_marking_step()"], "gc"),
        ("heapstate-snapshot", ["heapstate.io.SnapshotFileWriter.finish()"], "store background"),
        (
            "state-store-maintenance-thread-0",
            ["org.rocksdb.RocksDB.compactRange()"],
            "store background",
        ),
        ("dispatcher-event-loop-1", ["org.apache.spark.rpc.netty.Inbox.process()"], "other"),
    ],
)
def test_every_sample_has_one_category(thread: str, frames: list[str], category: str) -> None:
    assert cpu.categorize(cpu.Sample(0.0, thread, tuple(frames))) == category


def test_samples_are_cut_at_the_batches_and_summed() -> None:
    def sample(ms: float, thread: str, frame: str) -> cpu.Sample:
        return cpu.Sample(ms, thread, (frame,))

    task = "Executor task launch worker for task 1"
    samples = [
        sample(999, task, "x.Y.z()"),  # before batch 0: not counted
        sample(1000, task, "x.Y.z()"),
        sample(1500, "C1 CompilerThread0", "libjvm.so.Compile()"),
        sample(2000, task, "clear_page_erms(k)"),  # at the boundary: the earlier batch's
        sample(2500, "GC Thread#0", "libjvm.so.G1()"),
        sample(3500, task, "heapstate.A.commit()"),
        sample(3600, task, "heapstate.A.commit()"),
        sample(3700, "stream execution thread for q", "x.Y.z()"),
    ]
    batches = [
        {"batch": 0, "start_epoch_ms": 1000, "end_epoch_ms": 2000, "trigger_ms": 1000},
        {"batch": 1, "start_epoch_ms": 2000, "end_epoch_ms": 3000, "trigger_ms": 1000},
        {"batch": 2, "start_epoch_ms": 3000, "end_epoch_ms": 4000, "trigger_ms": 900},
        {"batch": 3, "start_epoch_ms": 4000, "end_epoch_ms": 5000, "trigger_ms": 300},
    ]
    got = cpu.by_batch(samples, batches, interval_ms=2)
    assert dict(got[0]) == {"spark task": 2, "jit": 2, "page zeroing": 2}
    assert dict(got[1]) == {"gc": 2}
    assert dict(got[2]) == {"store commit": 4, "driver": 2}
    assert dict(got[3]) == {}

    rows = cpu.summary_rows(batches, got)
    assert [r[0] for r in rows] == ["steady batches (2)", "slowest quarter (1)", "the others (1)"]
    steady, slow, rest = rows
    assert steady[2] == 600 and slow[2] == 900 and rest[2] == 300
    assert steady[1]["store commit"] == 2 and steady[1]["driver"] == 1
    assert slow[1]["store commit"] == 4 and rest[1]["store commit"] == 0
    assert sum(slow[1].values()) == 6 and sum(rest[1].values()) == 0


def test_the_agent_option_records_every_thread_in_one_file_per_jvm(tmp_path: Path) -> None:
    lib = tmp_path / "libasyncProfiler.so"
    assert cpu.agent_option(lib, tmp_path / "out") == (
        f"-agentpath:{lib}=start,event=cpu,interval=2ms,threads,file={tmp_path / 'out' / 'worker-%p.jfr'}"
    )


def test_a_run_missing_from_the_report_is_named_with_the_ones_it_has(tmp_path: Path) -> None:
    report = tmp_path / "w5.json"
    report.write_text(
        json.dumps(
            {"runs": {"heapstate@1000000": {"batches": []}, "hdfs@1000000": {"batches": []}}}
        )
    )
    with pytest.raises(SystemExit, match=r"no run 'heapstate'.*hdfs@1000000, heapstate@1000000"):
        cpu.run_batches(report, "heapstate")
    assert cpu.run_batches(report, "hdfs@1000000") == []
    with pytest.raises(SystemExit, match=r"run 'hdfs@1000000' of .* has no fresh-process restart"):
        cpu.run_batches(report, "hdfs@1000000", restarts=True)
    # A gzipped report (bench/evidence/'s) reads the same; a cut one is refused by name.
    zipped = tmp_path / "w5.json.gz"
    zipped.write_bytes(gzip.compress(report.read_bytes()))
    assert cpu.run_batches(zipped, "hdfs@1000000") == []
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(zipped.read_bytes()[:-12])
    with pytest.raises(SystemExit, match=r"cut\.json\.gz: not a readable JSON report"):
        cpu.run_batches(cut, "hdfs@1000000")


def test_restart_batches_are_the_runs_fresh_process_restarts(tmp_path: Path) -> None:
    restart = {"batch": 30, "start_epoch_ms": 5000, "end_epoch_ms": 6000, "trigger_ms": 1000}
    report = tmp_path / "w1.json"
    report.write_text(
        json.dumps({"runs": {"heapstate": {"batches": [{"batch": 0}], "restarts": [restart]}}})
    )
    assert cpu.run_batches(report, "heapstate", restarts=True) == [restart]
    assert cpu.run_batches(report, "heapstate") == [{"batch": 0}]


# What `jfr print --events jdk.ObjectAllocationSample` writes for the JDK's own recorder, cut down:
# heapstate's put in a task thread, Spark's broadcast in the driver, and the snapshot thread.
ALLOCATIONS = """\
jdk.ObjectAllocationSample {
  startTime = 23:59:59.250
  objectClass = byte[] (classLoader = bootstrap)
  weight = 1.5 MB
  eventThread = "Executor task launch worker for task 1.0 in stage 3.0 (TID 13)" (javaThreadId = 85)
  stackTrace = [
    heapstate.engine.Entry$.copyOf(byte[], int, int) line: 1084
    heapstate.HeapStateStoreProvider$HeapStore.put(UnsafeRow, UnsafeRow, String) line: 456
    org.apache.spark.executor.Executor$TaskRunner.run() line: 620
  ]
}

jdk.ObjectAllocationSample {
  startTime = 23:59:59.500
  objectClass = java.nio.HeapByteBuffer (classLoader = bootstrap)
  weight = 4.0 MB
  eventThread = "stream execution thread for [id = 1]" (javaThreadId = 60)
  stackTrace = [
    java.nio.HeapByteBuffer.<init>(int, int, MemorySegment) line: 64
    java.nio.ByteBuffer.allocate(int) line: 363
    ...
  ]
}

jdk.ObjectAllocationSample {
  startTime = 23:59:59.750
  objectClass = long[] (classLoader = bootstrap)
  weight = 512.5 kB
  eventThread = "heapstate-snapshot" (javaThreadId = 90)
  stackTrace = [
    heapstate.io.SnapshotFileWriter.bucketStarts() line: 421
  ]
}

jdk.ObjectAllocationSample {
  startTime = 00:00:00.100
  objectClass = java.lang.Object (classLoader = bootstrap)
  weight = 24 bytes
  eventThread = "Executor task launch worker for task 2.0 in stage 3.0 (TID 14)" (javaThreadId = 86)
  stackTrace = [
    java.lang.Object.<init>() line: 44
  ]
}
"""


def test_allocation_samples_are_read_with_their_weights() -> None:
    samples = list(cpu.parse_samples(ALLOCATIONS.splitlines(keepends=True), START))
    day = START.timestamp() * 1000
    assert [s.epoch_ms for s in samples] == [day + 1250, day + 1500, day + 1750, day + 2100]
    assert [s.weight for s in samples] == [1.5 * 1024**2, 4.0 * 1024**2, 512.5 * 1024, 24]
    assert [s.thread for s in samples] == [
        "Executor task launch worker for task 1.0 in stage 3.0 (TID 13)",
        "stream execution thread for [id = 1]",
        "heapstate-snapshot",
        "Executor task launch worker for task 2.0 in stage 3.0 (TID 14)",
    ]
    assert samples[1].frames == (
        "java.nio.HeapByteBuffer.<init>(int, int, MemorySegment)",
        "java.nio.ByteBuffer.allocate(int)",
    )
    assert [cpu.categorize(s) for s in samples] == [
        "store",
        "driver",
        "store background",
        "spark task",
    ]
    assert [cpu.site(s) for s in samples] == [
        "heapstate.engine.Entry$.copyOf",
        "java.nio.HeapByteBuffer.<init>",
        "heapstate.io.SnapshotFileWriter.bucketStarts",
        "java.lang.Object.<init>",
    ]
    # A CPU sample has no weight: its batch counts the interval instead.
    cpu_samples = list(cpu.parse_samples(PRINTED.splitlines(keepends=True), START))
    assert [s.weight for s in cpu_samples] == [None, None, None]


@pytest.mark.parametrize(
    "weight_line",
    [None, "  weight = 42,0 MB", "  weight = 3.0 TB"],
    ids=["missing", "another language", "unknown unit"],
)
def test_an_allocation_sample_without_a_readable_weight_is_named(weight_line: str | None) -> None:
    lines = ALLOCATIONS.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "weight = 4.0 MB" in line)
    if weight_line is None:
        del lines[at]
    else:
        lines[at] = weight_line + "\n"
    with pytest.raises(
        SystemExit, match=r"allocation sample at 23:59:59\.500000 UTC has no weight"
    ):
        list(cpu.parse_samples(lines, START))


def test_allocations_are_cut_at_the_batches_in_mb_and_ranked_by_site() -> None:
    task = "Executor task launch worker for task 1"

    def sample(ms: float, thread: str, frames: tuple[str, ...], mib: float) -> cpu.Sample:
        return cpu.Sample(ms, thread, frames, mib * 1024 * 1024)

    put = (
        "heapstate.engine.Key$.copyOf(byte[])",
        "heapstate.HeapStateStoreProvider$HeapStore.put()",
    )
    samples = [
        sample(1500, task, put, 9.0),  # batch 1: not a steady batch
        sample(2500, task, put, 2.0),
        sample(2600, task, ("org.apache.spark.sql.catalyst.expressions.UnsafeRow.copy()",), 8.0),
        sample(3500, task, put, 1.0),
        sample(
            3600, "stream execution thread for q", ("java.nio.HeapByteBuffer.<init>(int)",), 4.0
        ),
        sample(9000, task, put, 50.0),  # after every batch
    ]
    batches = [
        {"batch": 1, "start_epoch_ms": 1000, "end_epoch_ms": 2000, "trigger_ms": 1000},
        {"batch": 2, "start_epoch_ms": 2000, "end_epoch_ms": 3000, "trigger_ms": 900},
        {"batch": 3, "start_epoch_ms": 3000, "end_epoch_ms": 4000, "trigger_ms": 300},
    ]
    got = cpu.by_batch(samples, batches, interval_ms=None)
    assert dict(got[1]) == {"store": 9.0}
    assert dict(got[2]) == {"store": 2.0, "spark task": 8.0}
    assert dict(got[3]) == {"store": 1.0, "driver": 4.0}

    assert cpu.top_sites(samples, batches) == [
        ("spark task", "org.apache.spark.sql.catalyst.expressions.UnsafeRow.copy", 4.0),
        ("driver", "java.nio.HeapByteBuffer.<init>", 2.0),
        ("store", "heapstate.engine.Key$.copyOf", 1.5),
    ]
    assert cpu.top_sites(samples, batches, limit=1) == [
        ("spark task", "org.apache.spark.sql.catalyst.expressions.UnsafeRow.copy", 4.0)
    ]

    rows = cpu.summary_rows(batches, got, categories=cpu.ALLOC_CATEGORIES)
    steady = rows[0]
    assert steady[0] == "steady batches (2)"
    assert (
        steady[1]["store"] == 1.5 and steady[1]["spark task"] == 4.0 and steady[1]["driver"] == 2.0
    )
    assert "page zeroing" not in steady[1]


def _stand_in_jfr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cases: str) -> Path:
    """Puts a stand-in for the JDK's ``jfr`` first on PATH: it records its arguments (in the file
    it returns), exits 3 unless asked for English (``JFR_ENGLISH``), and runs ``cases``, the
    branches of a shell ``case "$*" in``."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "bin" / "jfr"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        'case "$*" in *-J-Duser.language=en*-J-Duser.country=US*) ;; *) exit 3 ;; esac\n'
        f'case "$*" in\n{cases}esac\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    return calls


def _report_from_command_line(
    tmp_path: Path, mode: str, run: str, batches: list[dict[str, Any]]
) -> None:
    """``cpu_by_batch.py report <mode>`` from its command line, of an empty recording (the stand-in
    ``jfr`` prints what a test wants) and a report whose run ``run`` has ``batches``."""
    recording = tmp_path / "worker.jfr"
    recording.write_bytes(b"")
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"runs": {run: {"batches": batches}}}))
    cpu.main(["report", mode, "--recording", str(recording), "--report", str(report), "--run", run])


def test_alloc_report_runs_jfr_in_english_and_prints_mib_by_batch_and_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report --alloc`` from its command line, with a stand-in for the JDK's ``jfr`` that checks
    it was asked for English and prints ``ALLOCATIONS``."""
    printed = tmp_path / "printed.txt"
    printed.write_text(ALLOCATIONS)
    calls = _stand_in_jfr(
        tmp_path,
        monkeypatch,
        '  *" summary "*) echo " Start: 2026-11-25 23:59:58 (UTC)" ;;\n'
        f'  *" print "*) cat "{printed}" ;;\n',
    )
    day = START.timestamp() * 1000
    batches = [
        {"batch": 1, "start_epoch_ms": day + 1000, "end_epoch_ms": day + 1400, "trigger_ms": 400},
        {"batch": 2, "start_epoch_ms": day + 1400, "end_epoch_ms": day + 3000, "trigger_ms": 1600},
    ]

    _report_from_command_line(tmp_path, "--alloc", "heapstate", batches)

    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == "MiB allocated in each batch, by where it went (all threads of the worker's JVM)"
    )
    assert out[1].split() == [
        "batch",
        "trigger",
        "spark",
        "task",
        "store",
        "store",
        "commit",
        "driver",
        "jit",
        "gc",
        "store",
        "background",
        "other",
    ]
    # Batch 1 holds heapstate's put (1.5 MiB); batch 2 the driver's 4 MiB, the snapshot thread's
    # 512.5 KiB (0.5 MiB, printed to the MiB) and the task's 24 bytes.
    assert out[2].split() == ["1", "400", "0", "2", "0", "0", "0", "0", "0", "0"]
    assert out[3].split() == ["2", "1600", "0", "0", "0", "4", "0", "0", "1", "0"]
    sites = out[
        out.index("Where the steady batches allocated most (MiB a batch, by category and site)")
        + 1 :
    ]
    assert [line.split() for line in sites] == [
        ["4.0", "driver", "java.nio.HeapByteBuffer.<init>"],
        ["0.5", "store", "background", "heapstate.io.SnapshotFileWriter.bucketStarts"],
        ["0.0", "spark", "task", "java.lang.Object.<init>"],
    ]
    assert [line.split()[:2] for line in calls.read_text().splitlines()] == [
        ["-J-Duser.language=en", "-J-Duser.country=US"]
    ] * 2


def _method(owner: str, name: str) -> dict[str, object]:
    return {"type": {"name": owner}, "name": name, "descriptor": "()V"}


# What `jfr print --json --events jdk.Deoptimization,jdk.Compilation` writes, cut down: a
# deoptimisation of heapstate's look-up, one of Spark's (not the store's), a C2 compilation of a
# commit loop entered while it runs (OSR), a C1 one, a C2 one without its sizes, and a C2 one that
# failed.
JIT_DOC = {
    "recording": {
        "events": [
            {
                "type": "jdk.Compilation",
                "values": {
                    "startTime": "2026-11-25T23:59:59.900Z",
                    "method": _method("heapstate/engine/LiveState", "lookUpChanges"),
                    "compileLevel": 4,
                    "isOsr": True,
                    "succeded": True,
                    "codeSize": 2384,
                    "inlinedBytes": 410,
                },
            },
            {
                "type": "jdk.Deoptimization",
                "values": {
                    "startTime": "2026-11-25T23:59:59.250125Z",
                    "method": _method("heapstate/engine/EntryTable", "findSlot"),
                    "lineNumber": 277,
                    "reason": "unstable_if",
                    "action": "reinterpret",
                },
            },
            {
                "type": "jdk.Deoptimization",
                "values": {
                    "startTime": "2026-11-25T23:59:59.300Z",
                    "method": _method("org/apache/spark/util/NextIterator", "hasNext"),
                    "lineNumber": 12,
                    "reason": "class_check",
                    "action": "maybe_recompile",
                },
            },
            {
                "type": "jdk.Compilation",
                "values": {
                    "startTime": "2026-11-26T00:00:00.500+00:00",
                    "method": _method("heapstate/engine/StateEngine$", "markKeys"),
                    "compileLevel": 3,
                    "isOsr": False,
                    "succeded": True,
                },
            },
            {
                "type": "jdk.Compilation",
                "values": {
                    "startTime": "2026-11-26T01:00:00.750+01:00",
                    "method": _method("heapstate/engine/EntryTable", "put"),
                    "compileLevel": 4,
                    "isOsr": False,
                    "succeded": True,
                },
            },
            {
                "type": "jdk.Compilation",
                "values": {
                    "startTime": "2026-11-26T00:00:00.800Z",
                    "method": _method("heapstate/engine/EntryTable", "resize"),
                    "compileLevel": 4,
                    "isOsr": False,
                    "succeded": False,
                },
            },
        ]
    }
}


def test_jit_events_of_the_stores_methods_are_read_in_time_order() -> None:
    day = START.timestamp() * 1000
    assert cpu.parse_jit_events(JIT_DOC) == [
        cpu.JitEvent(
            day + 1250.125,
            "heapstate.engine.EntryTable.findSlot",
            True,
            277,
            "unstable_if",
            "reinterpret",
        ),
        cpu.JitEvent(
            day + 1900,
            "heapstate.engine.LiveState.lookUpChanges",
            False,
            level=4,
            osr=True,
            code_bytes=2384,
            inlined_bytes=410,
        ),
        cpu.JitEvent(day + 2500, "heapstate.engine.StateEngine$.markKeys", False, level=3),
        # 01:00:00.750 at an hour east of UTC is 00:00:00.750 UTC.
        cpu.JitEvent(day + 2750, "heapstate.engine.EntryTable.put", False, level=4),
    ]
    # Java leaves out zero seconds, a zero fraction and an offset's zero seconds.
    assert cpu._json_epoch_ms("2026-11-26T00:01Z") == day + 2000 + 60_000
    assert cpu._json_epoch_ms("2026-11-26T05:31:02.5+05:30:00") == day + 2000 + 62_500
    assert cpu._json_epoch_ms("2026-11-25T23:58:59-00:00:30") == day - 29_000
    bad = {"recording": {"events": [dict(JIT_DOC["recording"]["events"][1])]}}
    bad["recording"]["events"][0] = {
        "type": "jdk.Deoptimization",
        "values": {**JIT_DOC["recording"]["events"][1]["values"], "startTime": "23:59:59.250"},
    }
    with pytest.raises(SystemExit, match=r"a time this script cannot read: '23:59:59.250'"):
        cpu.parse_jit_events(bad)


def test_jit_events_are_cut_at_the_batches_keeping_deopts_and_c2() -> None:
    day = START.timestamp() * 1000
    batches = [
        {"batch": 1, "start_epoch_ms": day + 1000, "end_epoch_ms": day + 2000},
        {"batch": 2, "start_epoch_ms": day + 2000, "end_epoch_ms": day + 2700},
    ]
    per_batch = cpu.jit_by_batch(cpu.parse_jit_events(JIT_DOC), batches)
    # Batch 1: the look-up's deoptimisation and the loop's C2 compilation; batch 2 only C1's
    # compilation, which is left out; the put's C2 compilation came after both.
    assert {b: [e.describe() for e in events] for b, events in per_batch.items()} == {
        1: [
            "engine.EntryTable.findSlot:277 unstable_if/reinterpret",
            "engine.LiveState.lookUpChanges (OSR) [2384 B of code, 410 B of bytecode inlined]",
        ],
        2: [],
    }


def test_jit_report_runs_jfr_json_in_english_and_prints_each_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report --jit`` from its command line, with a stand-in for the JDK's ``jfr`` that checks it
    was asked for English and JSON and prints ``JIT_DOC``."""
    printed = tmp_path / "printed.json"
    printed.write_text(json.dumps(JIT_DOC))
    calls = _stand_in_jfr(
        tmp_path,
        monkeypatch,
        f'  *" print --json --events jdk.Deoptimization,jdk.Compilation "*) cat "{printed}" ;;\n'
        "  *) exit 4 ;;\n",
    )
    day = START.timestamp() * 1000
    batches = [
        {
            "batch": 1,
            "start_epoch_ms": day + 1000,
            "end_epoch_ms": day + 2000,
            "trigger_ms": 1000,
            "custom_metrics": {"heapstateCommitStoreCpuMicros": 14_250},
        },
        {"batch": 2, "start_epoch_ms": day + 2000, "end_epoch_ms": day + 2900, "trigger_ms": 900},
    ]

    _report_from_command_line(tmp_path, "--jit", "heapstate@1000000", batches)

    out = capsys.readouterr().out.splitlines()
    assert out == [
        "The JIT's work on heapstate.* in each batch: deoptimisations, and compilations by C2",
        "batch  trigger commit CPU deopts  C2  what",
        (
            "    1     1000       14.2      1   1  deopt engine.EntryTable.findSlot:277 "
            "unstable_if/reinterpret; C2 engine.LiveState.lookUpChanges (OSR) "
            "[2384 B of code, 410 B of bytecode inlined]"
        ),
        "    2      900          -      0   1  C2 engine.EntryTable.put",
        "",
        "in the steady batches (2 and later): 0 deoptimisations, 1 compilations by C2",
    ]
    assert len(calls.read_text().splitlines()) == 1

    # A recording of another JVM: nothing of the store's falls inside the run's batches.
    later = [
        {
            **b,
            "start_epoch_ms": b["start_epoch_ms"] + 60_000,
            "end_epoch_ms": b["end_epoch_ms"] + 60_000,
        }
        for b in batches
    ]
    with pytest.raises(
        SystemExit,
        match=r"no deoptimisation or compilation of heapstate\.\* .*another worker's recording",
    ):
        _report_from_command_line(tmp_path, "--jit", "heapstate@1000000", later)


def test_jit_settings_from_the_command_line_fall_back_to_java_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``jit-settings`` with a ``jfr`` on the path that lies outside any JDK: JAVA_HOME's JDK."""
    jdk = tmp_path / "jdk"
    (jdk / "lib" / "jfr").mkdir(parents=True)
    default = (
        '<event name="jdk.Compilation">\n'
        '  <setting name="threshold" control="compiler-compilation-threshold">1000 ms</setting>\n'
        "</event>\n"
    )
    (jdk / "lib" / "jfr" / "default.jfc").write_text(default)
    _stand_in_jfr(tmp_path, monkeypatch, "")  # tmp_path/bin/jfr: no lib/jfr beside it
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    out = tmp_path / "jit.jfc"

    cpu.main(["jit-settings", "--out", str(out)])

    assert out.read_text() == default.replace(">1000 ms<", ">0 ms<")
    assert capsys.readouterr().out == (
        f"--java-option=-XX:StartFlightRecording=settings={out.resolve()},filename=DIR/\n"
    )
    monkeypatch.delenv("JAVA_HOME")
    with pytest.raises(SystemExit, match=r"no default\.jfc at .*/lib/jfr/default\.jfc \(.*set"):
        cpu.main(["jit-settings", "--out", str(out)])


def test_jit_settings_record_every_compilation_and_nothing_else_changes(tmp_path: Path) -> None:
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "lib" / "jfr").mkdir(parents=True)
    (jdk / "bin" / "jfr").write_text("")
    default = (
        "<configuration>\n"
        '    <event name="jdk.JavaMonitorEnter">\n'
        '      <setting name="threshold" control="locking-threshold">20 ms</setting>\n'
        "    </event>\n"
        '    <event name="jdk.Compilation">\n'
        '      <setting name="enabled" control="compiler-enabled">true</setting>\n'
        '      <setting name="threshold" control="compiler-compilation-threshold">1000 ms</setting>\n'
        "    </event>\n"
        "</configuration>\n"
    )
    (jdk / "lib" / "jfr" / "default.jfc").write_text(default)
    link = tmp_path / "jfr"
    link.symlink_to(jdk / "bin" / "jfr")  # as /usr/bin/jfr links into the JDK

    settings = cpu.jit_settings(link)

    assert settings == default.replace(
        'compiler-compilation-threshold">1000 ms<', 'compiler-compilation-threshold">0 ms<'
    )
    # A jfr outside any JDK (macOS's /usr/bin/jfr launches the one JAVA_HOME names): JAVA_HOME's.
    launcher = tmp_path / "usr" / "bin" / "jfr"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("")
    assert cpu.jit_settings(launcher, str(jdk)) == settings
    with pytest.raises(
        SystemExit, match=r"no default\.jfc at .*usr/lib/jfr/default\.jfc \(.*set JAVA_HOME"
    ):
        cpu.jit_settings(launcher)

    (jdk / "lib" / "jfr" / "default.jfc").unlink()
    with pytest.raises(SystemExit, match=r"no default\.jfc at .*jdk/lib/jfr/default\.jfc \("):
        cpu.jit_settings(link)
    with pytest.raises(
        SystemExit,
        match=r"at .*usr/lib/jfr/default\.jfc or .*jdk/lib/jfr/default\.jfc .*then JAVA_HOME",
    ):
        cpu.jit_settings(launcher, str(jdk))
