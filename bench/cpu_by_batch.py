"""Where each micro-batch's CPU time (or heap allocation) went: a profile of a W1 or W5 worker, cut
at its batches.

A batch's trigger time says how long it took, not what ran meanwhile. On a 2-core machine the
task threads share the cores with the JIT compiler, the garbage collector, the driver's planning
and a provider's background thread, and the kernel zeroes each page of heap that is written for
the first time. This script attributes the CPU samples of an async-profiler recording (which sees
all of those, native and kernel frames included) to the batches of a W1 or W5 report::

    # 1. fetch async-profiler (once) and print the JVM option that records a worker:
    .venv/bin/python bench/cpu_by_batch.py agent --out /tmp/profiles
    # 2. run a benchmark with that option, for example:
    .venv/bin/python bench/w1.py --size full --batches 30 --restart none --providers heapstate \\
        --java-option=-agentpath:...
    # 3. cut the recording at the report's batches:
    .venv/bin/python bench/cpu_by_batch.py report --recording /tmp/profiles/worker-1234.jfr \\
        --report bench/results/w1-....json --run heapstate

The table has one row per batch: its trigger time, then CPU milliseconds (samples times the
interval) in each category of ``CATEGORIES``, from every thread of the worker's JVM. Below it,
the means over the steady batches (2 and later), and over the slowest quarter of them against the
rest, which is where a spike's cause shows. One recording per worker JVM (``%p`` in the file
name is its process id); pick the one whose samples cover the run's batches. A W5 report of
``--repeat N`` holds each run N times, each in a JVM of its own: ``--round R`` (from 1, the
default) picks the round the recording was made in.

With ``--alloc`` the same cut is made of the JDK's own allocation samples
(``jdk.ObjectAllocationSample``): MiB allocated in each batch by the same categories (no page
zeroing), then the sites that allocated most in the steady batches, each named by its first store
frame (heapstate's, RocksDB's or HDFS's provider) or else by the allocating method. Record them
with the JDK's flight recorder instead of async-profiler, for one provider with no restart (every
JVM given the option writes to the same file)::

    .venv/bin/python bench/w1.py --size full --batches 30 --maintenance-interval 5s --restart none \\
        --providers heapstate \\
        --java-option=-XX:StartFlightRecording=settings=profile,filename=/tmp/alloc.jfr
    .venv/bin/python bench/cpu_by_batch.py report --alloc --recording /tmp/alloc.jfr \\
        --report bench/results/w1-....json --run heapstate

Each sample stands for the bytes the JVM allocated in its thread since the last one (its
``weight``), so the figures are estimates, close over many samples and rough for one site in one
batch. ``jfr print`` writes the weights rounded to a tenth of a KiB or MiB (it calls them kB and
MB), in the JVM's language, so the script runs it in English.

With ``--jit`` it lists, for each batch, the JIT's work on the store's own classes (heapstate's,
``JIT_PREFIX``): each deoptimisation (a trap in compiled code, named by the method it is in,
which may have been inlined into the compiled one, with its line, reason and action) and each
compilation by C2 (``C2_LEVEL``, with the bytes of code it made and of bytecode it inlined),
beside the batch's trigger time and the CPU of the store's part of its commits. A
deoptimisation whose action is ``reinterpret`` throws the compiled method that hit it away, and
that code runs in slower tiers until the JIT has counted it again (stop 75 found a commit's loop
running in C1's code for four to five batches after batch 0's). Record with the
JDK's flight recorder, every compilation included (its default settings keep only those over a
second)::

    .venv/bin/python bench/cpu_by_batch.py jit-settings --out /tmp/jit.jfc
    mkdir -p /tmp/jit
    .venv/bin/python bench/w5.py --size full --keys 1000000,4000000 --providers heapstate \\
        --java-option=-XX:StartFlightRecording=settings=/tmp/jit.jfc,filename=/tmp/jit/
    .venv/bin/python bench/cpu_by_batch.py report --jit --recording /tmp/jit/hotspot-....jfr \\
        --report bench/results/w5-....json --run heapstate@4000000

async-profiler comes from Maven Central (``tools.profiler:async-profiler``, Linux x64), or from
the mirror ``~/.m2/settings.xml`` names, into ``~/.cache/heapstate``. Reading the recording needs
the JDK's ``jfr`` tool.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import read_report, thread_kind
from _delta import maven_mirror
from w5 import runs_by_round

PROFILER_VERSION = "3.0"
PROFILER_PATH = f"tools/profiler/async-profiler/{PROFILER_VERSION}/async-profiler-{PROFILER_VERSION}-linux-x64.jar"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
CACHE = Path.home() / ".cache" / "heapstate"
INTERVAL_MS = 2
"""The sampling interval the ``agent`` option asks for: each sample stands for this much CPU."""

CATEGORIES = (
    "spark task",
    "store",
    "store commit",
    "page zeroing",
    "driver",
    "jit",
    "gc",
    "store background",
    "other",
)
"""Where a sample goes, in the table's column order:

- ``page zeroing``: the kernel clearing a page at its first touch, in any thread (a fresh heap
  region's first writes; it is counted here, not in the thread's own column);
- ``store commit`` and ``store``: a task thread inside a state store's ``commit``, or elsewhere in a
  store (heapstate's classes, Spark's HDFS or RocksDB store, RocksDB's JNI);
- ``spark task``: the rest of the task threads' time;
- ``driver``: the query's own thread (planning, progress);
- ``jit`` and ``gc``: the compiler threads and the collector's threads;
- ``store background``: heapstate's snapshot thread and Spark's state store maintenance thread;
- ``other``: every other thread (RPC, listeners, the profiler)."""

_ZEROING = re.compile(r"^clear_page(_erms|_rep|_orig)?\b")
_STORE_FRAME = re.compile(
    r"^(heapstate\.|org\.rocksdb\.|org\.apache\.spark\.sql\.execution\.streaming\.state\.(HDFSBacked|RocksDB))"
)


MIB = 1024 * 1024
"""Bytes in a MiB: ``--alloc`` reports MiB, the unit ``jfr print``'s "MB" and G1's logs use."""

ALLOC_CATEGORIES = tuple(c for c in CATEGORIES if c != "page zeroing")
"""The categories of allocation samples (``--alloc``): the kernel's page zeroing allocates nothing."""


@dataclass(frozen=True)
class Sample:
    """One sample: when (epoch ms), which thread, and its frames from the leaf down; for an
    allocation sample, the bytes it stands for (``weight``; None for a CPU sample)."""

    epoch_ms: float
    thread: str
    frames: tuple[str, ...]
    weight: float | None = None


def categorize(sample: Sample) -> str:
    """The category of ``CATEGORIES`` one sample goes to."""
    thread, frames = sample.thread, sample.frames
    if frames and _ZEROING.match(frames[0]):
        return "page zeroing"
    kind = thread_kind(thread)
    if kind == "task":
        store = [f for f in frames if _STORE_FRAME.match(f)]
        if any(f.rsplit("(", 1)[0].endswith(".commit") for f in store):
            return "store commit"
        return "store" if store else "spark task"
    return kind


_EVENT = re.compile(r"^jdk\.(?:ExecutionSample|(ObjectAllocationSample)) \{")
_TIME = re.compile(r"startTime = (\d+):(\d+):(\d+)\.(\d+)")
_THREAD = re.compile(r'(?:sampledThread|eventThread) = "([^"]*)"')
_WEIGHT = re.compile(r"^\s*weight = ([\d.]+) (bytes|byte|kB|MB|GB)\s*$")
_ANY_WEIGHT = re.compile(r"^\s*weight = ")
_UNIT = {"byte": 1, "bytes": 1, "kB": 1024, "MB": 1024**2, "GB": 1024**3}
_FRAME = re.compile(r"^\s{4}(\S.*?)(?:\s+line: \d+)?(?:\s+bci: \d+)?\s*$")


def parse_samples(lines: Iterable[str], start: dt.datetime) -> Iterator[Sample]:
    """The samples in ``jfr print --events jdk.ExecutionSample`` output (run with ``TZ=UTC``), or
    in that of ``jdk.ObjectAllocationSample`` (with their weights: ``jfr print`` writes kB, MB
    and GB of 1,024, in English; ``JFR_ENGLISH``). An allocation sample whose weight is missing or
    unreadable stops the parse, naming its time: it would count as nothing.

    That output gives each sample's time of day only; ``start``, the recording's start in UTC,
    gives the date, and a time of day before the start's is taken as the next day's."""
    time: float | None = None
    thread = ""
    frames: list[str] = []
    weight: float | None = None
    allocation = False
    in_stack = False

    def at(h: int, m: int, s: int, fraction: str) -> float:
        day = start.date()
        moment = dt.datetime(day.year, day.month, day.day, h, m, s, tzinfo=dt.timezone.utc)
        if moment.time() < start.replace(microsecond=0).time():
            moment += dt.timedelta(days=1)
        return moment.timestamp() * 1000 + float("0." + fraction) * 1000

    def sample() -> Sample:
        assert time is not None
        if allocation and weight is None:
            moment = dt.datetime.fromtimestamp(time / 1000, dt.timezone.utc)
            raise SystemExit(
                f"the allocation sample at {moment:%H:%M:%S.%f} UTC has no weight this script "
                "can read (it reads bytes, kB, MB and GB as jfr print writes them in English)"
            )
        return Sample(time, thread, tuple(frames), weight)

    for line in lines:
        if (e := _EVENT.match(line)) is not None:
            if time is not None:
                yield sample()
            time, thread, frames, weight, in_stack = None, "", [], None, False
            allocation = e[1] is not None
        elif (m := _TIME.search(line)) is not None and time is None:
            time = at(int(m[1]), int(m[2]), int(m[3]), m[4])
        elif (m := _THREAD.search(line)) is not None and not thread:
            thread = m[1]
        elif not in_stack and _ANY_WEIGHT.match(line):
            m = _WEIGHT.match(line)
            weight = None if m is None else float(m[1]) * _UNIT[m[2]]
        elif "stackTrace = [" in line:
            in_stack = True
        elif (in_stack and line.strip() in ("]", "...")) or line.startswith("}"):
            in_stack = False
        elif in_stack and (m := _FRAME.match(line)) is not None:
            frames.append(m[1].lstrip("."))
    if time is not None:
        yield sample()


def _batch_of(windows: Sequence[tuple[float, float, int]], epoch_ms: float) -> int | None:
    """The batch whose start and end hold ``epoch_ms`` (the earlier one at a boundary)."""
    for start, end, batch in windows:
        if start <= epoch_ms <= end:
            return batch
    return None


def _windows(batches: Sequence[dict[str, Any]]) -> list[tuple[float, float, int]]:
    return sorted((b["start_epoch_ms"], b["end_epoch_ms"], b["batch"]) for b in batches)


def by_batch(
    samples: Iterable[Sample], batches: Sequence[dict[str, Any]], interval_ms: float | None
) -> dict[int, Counter[str]]:
    """Per category for each batch, from the samples inside its start and end: CPU ms, each
    sample counting ``interval_ms``; or, with ``interval_ms`` None, MiB allocated (the samples'
    weights)."""
    windows = _windows(batches)
    out: dict[int, Counter[str]] = {b["batch"]: Counter() for b in batches}
    for s in samples:
        batch = _batch_of(windows, s.epoch_ms)
        if batch is not None:
            out[batch][categorize(s)] += (
                (s.weight or 0.0) / MIB if interval_ms is None else interval_ms
            )
    return out


def site(sample: Sample) -> str:
    """Where an allocation sample was made: its first store frame (see ``categorize``), or else its
    allocating method; without the arguments."""
    store = [f for f in sample.frames if _STORE_FRAME.match(f)]
    frame = store[0] if store else (sample.frames[0] if sample.frames else "(no stack)")
    return frame.split("(", 1)[0]


def top_sites(
    samples: Iterable[Sample],
    batches: Sequence[dict[str, Any]],
    steady_from: int = 2,
    limit: int = 15,
) -> list[tuple[str, str, float]]:
    """The ``limit`` sites (``site``) that allocated most in the steady batches, with their
    category: (category, site, mean MiB a steady batch), largest first."""
    steady = [b for b in batches if b["batch"] >= steady_from]
    windows = _windows(steady)
    total: Counter[tuple[str, str]] = Counter()
    for s in samples:
        if _batch_of(windows, s.epoch_ms) is not None:
            total[(categorize(s), site(s))] += (s.weight or 0.0) / MIB
    n = max(1, len(steady))
    return [(cat, where, mb / n) for (cat, where), mb in total.most_common(limit)]


def summary_rows(
    batches: Sequence[dict[str, Any]],
    cpu: dict[int, Counter[str]],
    steady_from: int = 2,
    categories: Sequence[str] = CATEGORIES,
) -> list[tuple[str, dict[str, float], float]]:
    """Mean trigger ms and the mean per category (CPU ms, or MiB allocated) over the steady
    batches, their slowest quarter (at least one) and the rest: (label, means by category, mean
    trigger)."""
    steady = [b for b in batches if b["batch"] >= steady_from]
    if not steady:
        return []
    ranked = sorted(steady, key=lambda b: b["trigger_ms"], reverse=True)
    slow = ranked[: max(1, len(ranked) // 4)]
    rest = ranked[len(slow) :]

    def mean(group: Sequence[dict[str, Any]]) -> tuple[dict[str, float], float]:
        n = len(group)
        cats = {c: sum(cpu[b["batch"]][c] for b in group) / n for c in categories}
        return cats, sum(b["trigger_ms"] for b in group) / n

    rows = [(f"steady batches ({len(steady)})", *mean(steady))]
    rows.append((f"slowest quarter ({len(slow)})", *mean(slow)))
    if rest:
        rows.append((f"the others ({len(rest)})", *mean(rest)))
    return rows


def print_table(
    batches: Sequence[dict[str, Any]], cpu: dict[int, Counter[str]], alloc: bool = False
) -> None:
    categories = ALLOC_CATEGORIES if alloc else CATEGORIES
    what = "MiB allocated" if alloc else "CPU ms"
    head = f"{'batch':>5} {'trigger':>8} " + " ".join(f"{c:>{max(7, len(c))}}" for c in categories)
    print(f"{what} in each batch, by where it went (all threads of the worker's JVM)")
    print(head)
    for b in batches:
        cells = " ".join(f"{cpu[b['batch']][c]:>{max(7, len(c))}.0f}" for c in categories)
        print(f"{b['batch']:>5} {b['trigger_ms']:>8.0f} {cells}")
    print()
    for label, cats, trigger in summary_rows(batches, cpu, categories=categories):
        cells = " ".join(f"{cats[c]:>{max(7, len(c))}.0f}" for c in categories)
        print(f"{label:<26} mean trigger {trigger:6.0f} ms; mean {what}: {cells}")


def print_sites(sites: Sequence[tuple[str, str, float]]) -> None:
    print()
    print("Where the steady batches allocated most (MiB a batch, by category and site)")
    for category, where, mb in sites:
        print(f"{mb:8.1f}  {category:<16} {where}")


JIT_PREFIX = "heapstate."
"""``--jit`` lists the JIT's work on the methods of the classes whose names start so."""

C2_LEVEL = 4
"""The tier of C2's compilations, the JIT's fastest code (C1's are 1 to 3)."""

JIT_EVENTS = "jdk.Deoptimization,jdk.Compilation"

_JSON_TIME = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d)(?::(\d\d))?(?:\.(\d+))?(?:(Z)|([+-])(\d\d):(\d\d)(?::(\d\d))?)$"
)
"""A time as ``jfr print --json`` writes it (Java's ``OffsetDateTime``): seconds, their fraction
and the offset's seconds are left out when zero."""


@dataclass(frozen=True)
class JitEvent:
    """A deoptimisation or a compilation: when (epoch ms), of which method (``pkg.Class.name``),
    and what: the line, reason and action of a deoptimisation; the tier (and OSR: a loop's code
    entered while it runs) of a compilation, and the bytes of machine code it made and of bytecode
    it inlined (two compilations of one method that inlined different callees differ there)."""

    epoch_ms: float
    method: str
    deopt: bool
    line: int | None = None
    reason: str = ""
    action: str = ""
    level: int | None = None
    osr: bool = False
    code_bytes: int | None = None
    inlined_bytes: int | None = None

    def describe(self) -> str:
        name = self.method.removeprefix(JIT_PREFIX)
        if self.deopt:
            return f"{name}:{self.line} {self.reason}/{self.action}"
        sizes = ""
        if self.code_bytes is not None:
            inlined = (
                ""
                if self.inlined_bytes is None
                else f", {self.inlined_bytes} B of bytecode inlined"
            )
            sizes = f" [{self.code_bytes} B of code{inlined}]"
        return f"{name}{' (OSR)' if self.osr else ''}{sizes}"


def _json_epoch_ms(text: str) -> float:
    m = _JSON_TIME.match(text)
    if m is None:
        raise SystemExit(f"jfr print --json wrote a time this script cannot read: {text!r}")
    local = dt.datetime.fromisoformat(f"{m[1]}:{m[2] or '00'}").replace(tzinfo=dt.timezone.utc)
    offset_s = 0 if m[4] else int(m[6]) * 3600 + int(m[7]) * 60 + int(m[8] or 0)
    sign = -1 if m[5] == "-" else 1
    return (local.timestamp() - sign * offset_s) * 1000 + float("0." + (m[3] or "0")) * 1000


def parse_jit_events(doc: dict[str, Any], prefix: str = JIT_PREFIX) -> list[JitEvent]:
    """The deoptimisations and successful compilations of methods of classes under ``prefix`` in
    the output of ``jfr print --json --events jdk.Deoptimization,jdk.Compilation``, in time
    order."""
    out = []
    for event in doc.get("recording", {}).get("events", []):
        kind, v = event.get("type"), event.get("values", {})
        if kind not in ("jdk.Deoptimization", "jdk.Compilation"):
            continue
        method = v.get("method") or {}
        owner = ((method.get("type") or {}).get("name") or "").replace("/", ".")
        if not owner.startswith(prefix):
            continue
        name = f"{owner}.{method.get('name', '?')}"
        at = _json_epoch_ms(v["startTime"])
        if kind == "jdk.Deoptimization":
            line = v.get("lineNumber")
            out.append(JitEvent(at, name, True, line, v.get("reason", ""), v.get("action", "")))
        elif v.get("succeded", True):  # the JDK's spelling
            out.append(
                JitEvent(
                    at,
                    name,
                    False,
                    level=v.get("compileLevel"),
                    osr=bool(v.get("isOsr")),
                    code_bytes=v.get("codeSize"),
                    inlined_bytes=v.get("inlinedBytes"),
                )
            )
    return sorted(out, key=lambda e: e.epoch_ms)


def _jit_in_batches(
    events: Iterable[JitEvent], batches: Sequence[dict[str, Any]]
) -> dict[int, list[JitEvent]]:
    """Each batch's events, of every tier: those inside its start and end."""
    windows = _windows(batches)
    out: dict[int, list[JitEvent]] = {b["batch"]: [] for b in batches}
    for e in events:
        batch = _batch_of(windows, e.epoch_ms)
        if batch is not None:
            out[batch].append(e)
    return out


def _deopts_and_c2(in_batches: dict[int, list[JitEvent]]) -> dict[int, list[JitEvent]]:
    return {
        b: [e for e in events if e.deopt or e.level == C2_LEVEL] for b, events in in_batches.items()
    }


def jit_by_batch(
    events: Iterable[JitEvent], batches: Sequence[dict[str, Any]]
) -> dict[int, list[JitEvent]]:
    """Each batch's deoptimisations and compilations by C2 (``C2_LEVEL``), from those inside its
    start and end."""
    return _deopts_and_c2(_jit_in_batches(events, batches))


def print_jit(
    batches: Sequence[dict[str, Any]], per_batch: dict[int, list[JitEvent]], steady_from: int = 2
) -> None:
    print(f"The JIT's work on {JIT_PREFIX}* in each batch: deoptimisations, and compilations by C2")
    print(f"{'batch':>5} {'trigger':>8} {'commit CPU':>10} {'deopts':>6} {'C2':>3}  what")
    for b in batches:
        events = per_batch[b["batch"]]
        micros = (b.get("custom_metrics") or {}).get("heapstateCommitStoreCpuMicros")
        commit = "-" if micros is None else f"{micros / 1000:.1f}"
        deopts = [e for e in events if e.deopt]
        what = "; ".join(
            [f"deopt {e.describe()}" for e in deopts]
            + [f"C2 {e.describe()}" for e in events if not e.deopt]
        )
        print(
            f"{b['batch']:>5} {b['trigger_ms']:>8.0f} {commit:>10} {len(deopts):>6} "
            f"{len(events) - len(deopts):>3}  {what}".rstrip()
        )
    steady = [e for b in batches if b["batch"] >= steady_from for e in per_batch[b["batch"]]]
    print()
    print(
        f"in the steady batches ({steady_from} and later): "
        f"{sum(e.deopt for e in steady)} deoptimisations, "
        f"{sum(not e.deopt for e in steady)} compilations by C2"
    )


def jit_settings(jdk_jfr: Path, java_home: str | None = None) -> str:
    """The JDK's default flight-recorder settings (``lib/jfr/default.jfc`` of the JDK that holds
    ``jdk_jfr``, its ``jfr`` tool, or else of ``java_home``: a ``jfr`` that is a launcher of the
    system's, such as macOS's ``/usr/bin/jfr``, lies outside any JDK), with every compilation
    recorded instead of those over a second only."""
    homes = [jdk_jfr.resolve().parent.parent] + ([Path(java_home)] if java_home else [])
    tried = [home / "lib" / "jfr" / "default.jfc" for home in homes]
    default = next((f for f in tried if f.is_file()), None)
    if default is None:
        raise SystemExit(
            f"no default.jfc at {' or '.join(map(str, tried))} (the JDK of {jdk_jfr}"
            f"{', then JAVA_HOME' if java_home else '; set JAVA_HOME to a JDK'})"
        )
    pattern = re.compile(
        r'(<event name="jdk\.Compilation">.*?<setting name="threshold"[^>]*>)[^<]*(</setting>)',
        re.DOTALL,
    )
    settings, n = pattern.subn(r"\g<1>0 ms\g<2>", default.read_text(), count=1)
    if n != 1:
        raise SystemExit(f"{default} sets no threshold for jdk.Compilation")
    return settings


def fetch_profiler(cache: Path = CACHE) -> Path:
    """async-profiler's agent library, fetched and unpacked once into ``cache``."""
    lib = cache / f"async-profiler-{PROFILER_VERSION}" / "libasyncProfiler.so"
    if lib.is_file():
        return lib
    repository = (maven_mirror() or MAVEN_CENTRAL).rstrip("/")
    url = f"{repository}/{PROFILER_PATH}"
    lib.parent.mkdir(parents=True, exist_ok=True)
    jar = lib.parent / "async-profiler.jar"
    try:
        with urllib.request.urlopen(url, timeout=60) as response, jar.open("wb") as out:
            shutil.copyfileobj(response, out)
        with zipfile.ZipFile(jar) as z:
            member = next((n for n in z.namelist() if n.endswith("/libasyncProfiler.so")), None)
            if member is None:
                raise SystemExit(f"{url} holds no libasyncProfiler.so")
            lib.write_bytes(z.read(member))
    except OSError as e:
        raise SystemExit(f"could not fetch async-profiler from {url}: {e}") from e
    finally:
        jar.unlink(missing_ok=True)
    return lib


def agent_option(lib: Path, out_dir: Path, interval_ms: int = INTERVAL_MS) -> str:
    """The ``--java-option`` that records every thread's CPU samples of a worker JVM."""
    target = out_dir / "worker-%p.jfr"
    return f"-agentpath:{lib}=start,event=cpu,interval={interval_ms}ms,threads,file={target}"


JFR_ENGLISH = ("-J-Duser.language=en", "-J-Duser.country=US")
"""``jfr``'s options that make it write numbers as this script reads them (``42.0 MB``, not the
``42,0 MB`` of a German locale, say)."""


def recording_start(recording: Path, jfr: str) -> dt.datetime:
    """The recording's start in UTC, from ``jfr summary``."""
    text = subprocess.run(
        [jfr, *JFR_ENGLISH, "summary", str(recording)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TZ": "UTC"},
    ).stdout
    m = re.search(r"Start: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", text)
    if m is None:
        raise SystemExit(f"jfr summary of {recording} names no start time")
    return dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)


def run_batches(
    report: Path, run: str, restarts: bool = False, in_round: int = 1
) -> list[dict[str, Any]]:
    """The per-batch records of run ``run`` (a provider, or ``provider@K`` in W5) of a report, in
    round ``in_round`` (W5's ``--repeat``, counted from 1); with ``restarts``, its fresh-process
    restart batches instead (W1), each recorded by the JVM that restarted."""
    try:
        loaded = read_report(report)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    runs = runs_by_round(loaded)
    if run not in runs:
        raise SystemExit(
            f"{report} has no run '{run}' with batches; it has: {', '.join(sorted(runs)) or 'none'}"
        )
    if in_round not in runs[run]:
        rounds = ", ".join(str(r) for r in sorted(runs[run])) or "none"
        raise SystemExit(f"run '{run}' of {report} has no round {in_round}; its rounds: {rounds}")
    chosen = runs[run][in_round]
    if "batches" not in chosen:
        raise SystemExit(f"round {in_round} of run '{run}' of {report} has no batches")
    if not restarts:
        return chosen["batches"]
    found = [r for r in chosen.get("restarts") or [] if "start_epoch_ms" in r]
    if not found:
        raise SystemExit(f"run '{run}' of {report} has no fresh-process restart")
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    agent = sub.add_parser(
        "agent", help="fetch async-profiler and print the JVM option that records a worker"
    )
    agent.add_argument(
        "--out", required=True, help="folder for the recordings (one per worker JVM)"
    )
    settings = sub.add_parser(
        "jit-settings",
        help="write the flight recorder's settings that --jit needs (every compilation recorded)",
    )
    settings.add_argument("--out", required=True, help="the .jfc file to write")
    rep = sub.add_parser("report", help="cut a recording at a report's batches")
    rep.add_argument(
        "--recording",
        required=True,
        help="a .jfr recording of one worker: async-profiler's, or the JDK's with --alloc or --jit",
    )
    rep.add_argument("--report", required=True, help="the W1 or W5 JSON report of the same run")
    rep.add_argument(
        "--run", required=True, help="the run in the report: a provider, or provider@K for W5"
    )
    rep.add_argument(
        "--round",
        type=int,
        default=1,
        help="the round of the run that the recording is of (W5's --repeat; from 1, the default)",
    )
    rep.add_argument(
        "--interval-ms",
        type=float,
        default=INTERVAL_MS,
        help="the recording's sampling interval (CPU samples; --alloc reads each sample's weight)",
    )
    kind = rep.add_mutually_exclusive_group()
    kind.add_argument(
        "--alloc",
        action="store_true",
        help="cut the JDK's allocation samples (jdk.ObjectAllocationSample) instead of CPU samples",
    )
    kind.add_argument(
        "--jit",
        action="store_true",
        help=f"list the JIT's deoptimisations and C2 compilations of {JIT_PREFIX}* by batch",
    )
    rep.add_argument(
        "--restarts",
        action="store_true",
        help="cut at the run's fresh-process restart batches (W1) instead",
    )
    args = parser.parse_args(argv)

    if args.command == "agent":
        out = Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        print(f"--java-option={agent_option(fetch_profiler(), out)}")
        return
    jfr = shutil.which("jfr") or (Path(os.environ.get("JAVA_HOME", "")) / "bin" / "jfr").as_posix()
    if not Path(jfr).is_file():
        raise SystemExit("the JDK's jfr tool is not on PATH or in JAVA_HOME/bin")
    if args.command == "jit-settings":
        Path(args.out).write_text(jit_settings(Path(jfr), os.environ.get("JAVA_HOME")))
        print(
            f"--java-option=-XX:StartFlightRecording=settings={Path(args.out).resolve()},filename=DIR/"
        )
        return
    recording = Path(args.recording)
    if not recording.is_file():
        raise SystemExit(f"no recording at {recording}")
    batches = run_batches(Path(args.report), args.run, args.restarts, args.round)
    if args.jit:
        printed_json = subprocess.run(
            [jfr, *JFR_ENGLISH, "print", "--json", "--events", JIT_EVENTS, str(recording)],
            check=False,
            capture_output=True,
            text=True,
            env={**os.environ, "TZ": "UTC"},
        )
        if printed_json.returncode != 0:
            raise SystemExit(f"jfr print failed on {recording}: {printed_json.stderr.strip()}")
        in_batches = _jit_in_batches(parse_jit_events(json.loads(printed_json.stdout)), batches)
        # Any event of the store's inside the batches (a C1 compilation too) says the recording is
        # of this run's JVM, even when none of them is one the table lists.
        if not any(in_batches.values()):
            sys.exit(
                f"no deoptimisation or compilation of {JIT_PREFIX}* in {recording} falls inside a "
                f"batch of round {args.round} of run '{args.run}': another worker's recording?"
            )
        print_jit(batches, _deopts_and_c2(in_batches))
        return
    start = recording_start(recording, jfr)
    event = "jdk.ObjectAllocationSample" if args.alloc else "jdk.ExecutionSample"
    printed = subprocess.Popen(
        [jfr, *JFR_ENGLISH, "print", "--events", event, "--stack-depth", "128", str(recording)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TZ": "UTC"},
    )
    assert printed.stdout is not None
    # A CPU recording can hold millions of samples: they are only streamed. The allocation samples
    # (a few hundred a second at most) are kept, for the sites as well as the batches.
    parsed = parse_samples(printed.stdout, start)
    samples: Iterable[Sample] = list(parsed) if args.alloc else parsed
    cpu = by_batch(samples, batches, None if args.alloc else args.interval_ms)
    if printed.wait() != 0:
        raise SystemExit(f"jfr print failed on {recording}")
    if not any(sum(c.values()) for c in cpu.values()):
        sys.exit(
            f"no {event} sample of {recording} falls inside a batch of round {args.round} of run "
            f"'{args.run}': another worker's recording?"
        )
    print_table(batches, cpu, alloc=args.alloc)
    if args.alloc:
        print_sites(top_sites(samples, batches))


if __name__ == "__main__":
    main()
