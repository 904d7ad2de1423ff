"""A machine-speed probe: the CPU time a fixed piece of work takes, sampled while W1 or W5 runs.

On the 2-core virtual machines these benchmarks run on, a whole run of batches sometimes goes
slower in every part at once: in stop 68's ``w1-stop68a`` heapstate's batches 18 to 21 took
twice the median's JVM CPU, in its task threads and in the query's driver thread alike, with no
GC pause, no G1 marking and no steal time. A batch's own counters cannot tell a slower CPU from
more work. This probe is a process of its own that every ``INTERVAL_S`` seconds runs the same
``WORK`` iterations of pure-Python arithmetic, on data that fits in a core's first-level cache,
and records the CPU time they took (the thread's clock: time spent waiting for a core does not
count). A batch's ``probe_us`` is the median of the samples that ended while it ran.

What a slow sample means, on the machine of stops 66 to 69 (Linux with paravirtual steal
accounting and no separate IRQ time accounting):
- the time the hypervisor gave the probe's CPU to something else is steal, which the kernel takes
  out of the thread's clock (and which the batches' ``steal_ms`` counts), so it does not count;
- a CPU that runs slower while the probe has it (another tenant on the same physical core or
  cache, a lower clock) does count, and so does interrupt handling on that CPU (disk and network
  completions, the JVM's TLB shootdowns), which this kernel charges to the running thread.
So a batch whose probe is near the run's median ran on a CPU of the usual speed; one well above it
is a sign, not a proof, of a slower machine: in stop 69's ``w5-stop69a``, five of heapstate's ten
steady batches at 4M in the second round had probes 1.45x to 1.66x the median; they averaged 301
ms against 278 for the other five, and the two highest probes were the round's two slowest
batches (353 and 326 ms), but the others among them were not slow.

It costs about 1% of one core (about 1 ms of work every 100 ms), for every provider alike.

Run as a script it samples until killed or its parent ends: ``python bench/_probe.py OUT
PARENT_PID``, one line per sample: the epoch in ms when the sample ended, then its CPU time in
microseconds.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

WORK = 12_000
"""Iterations of ``fixed_work`` a sample runs: about 0.83 to 0.87 ms of CPU on stop 69's AMD EPYC."""

INTERVAL_S = 0.1
"""Seconds between the end of one sample and the start of the next."""


def settings() -> dict[str, Any]:
    """What a report records of the probe: its work and interval."""
    return {"work": WORK, "interval_s": INTERVAL_S}


def fixed_work(n: int) -> int:
    """``n`` rounds of integer arithmetic on two local variables; returns the result, so that
    nothing can skip the work."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return x


def sample(n: int = WORK) -> float:
    """The CPU time, in microseconds, that this thread took for ``fixed_work(n)``."""
    start = time.thread_time_ns()
    fixed_work(n)
    return (time.thread_time_ns() - start) / 1000


def run(out: Path, parent: int, interval_s: float = INTERVAL_S) -> None:
    """Samples until the process is killed, or process ``parent`` is no longer its parent (a
    benchmark killed before it could stop the probe, perhaps before the probe even started: the
    probe is then a child of another process), appending a line to ``out`` for each sample."""
    # A Ctrl-C reaches the whole process group; the benchmark stops the probe itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with out.open("a", encoding="utf-8") as f:
        while os.getppid() == parent:
            us = sample()
            f.write(f"{time.time_ns() // 1_000_000} {us:.0f}\n")
            f.flush()
            time.sleep(interval_s)


def read(path: Path) -> list[tuple[int, float]]:
    """The samples of a probe's file, as (epoch ms, CPU µs), in the file's order. Only whole lines
    count: a last line without its newline (the probe killed while writing it) is left out."""
    samples = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        parts = line.split()
        if line.endswith("\n") and len(parts) == 2:
            try:
                samples.append((int(parts[0]), float(parts[1])))
            except ValueError:
                continue
    return samples


def median_between(
    samples: Sequence[tuple[int, float]], start_ms: float, end_ms: float
) -> float | None:
    """The median CPU time of the samples that ended from ``start_ms`` to ``end_ms``, or None when
    none did."""
    inside = [us for at, us in samples if start_ms <= at <= end_ms]
    return statistics.median(inside) if inside else None


def attach(batches: Iterable[dict[str, Any]], samples: Sequence[tuple[int, float]]) -> None:
    """Sets each batch record's ``probe_us`` (``median_between`` its start and end epochs); a
    batch without those epochs, or with no sample inside them, gets None."""
    for b in batches:
        start, end = b.get("start_epoch_ms"), b.get("end_epoch_ms")
        b["probe_us"] = (
            median_between(samples, start, end) if start is not None and end is not None else None
        )


class Probe:
    """The probe as a child process from ``start`` to ``stop``, writing to ``out``; ``samples()``
    reads what it wrote."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text("", encoding="utf-8")
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(self.out), str(os.getpid())]
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    @property
    def pid(self) -> int | None:
        """The probe's process id while it runs, else None."""
        return self._proc.pid if self._proc is not None else None

    def samples(self) -> list[tuple[int, float]]:
        return read(self.out)

    def attach_to(self, runs: Iterable[dict[str, Any]]) -> None:
        """``attach`` of what the probe wrote to the batches of each run (a W1 or W5 run record)."""
        samples = self.samples()
        for run in runs:
            attach(run["batches"], samples)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python bench/_probe.py OUT PARENT_PID")
    run(Path(sys.argv[1]), int(sys.argv[2]))
