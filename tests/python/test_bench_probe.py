"""The machine-speed probe (``bench/_probe.py``) and what W1 and W5 make of it: its samples read
from its file, each batch's median sample, the slowest batch's beside a median batch's in W1's
spike line, and W5's growth of it. Hand-written samples and batches give exact figures; two tests
run the probe's own process."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _probe  # bench/ is a folder of scripts, put on the path above
import w1
import w5
from test_bench_gc import _batch as gc_batch


def test_samples_are_read_and_a_line_cut_short_is_left_out(tmp_path: Path) -> None:
    f = tmp_path / "probe.txt"
    f.write_text("1000 950\n1100 980\n1200 1900\n13")
    assert _probe.read(f) == [(1000, 950.0), (1100, 980.0), (1200, 1900.0)]
    f.write_text("1000 950\n1100 9")  # cut inside the second number
    assert _probe.read(f) == [(1000, 950.0)]
    f.write_text("")
    assert _probe.read(f) == []


SAMPLES = [(900, 5000.0), (1000, 900.0), (1100, 1000.0), (1200, 2000.0), (1300, 4000.0)]


def test_a_batch_gets_the_median_of_the_samples_that_ended_inside_it() -> None:
    assert _probe.median_between(SAMPLES, 1000, 1200) == 1000.0  # 900, 1,000 and 2,000
    assert _probe.median_between(SAMPLES, 1050, 1300) == 2000.0  # 1,000, 2,000 and 4,000
    assert _probe.median_between(SAMPLES, 1000, 1100) == 950.0
    assert _probe.median_between(SAMPLES, 1001, 1099) is None
    batches: list[dict[str, Any]] = [
        {"batch": 0, "start_epoch_ms": 950, "end_epoch_ms": 1150},
        {"batch": 1, "start_epoch_ms": 1150, "end_epoch_ms": 1350},
        {"batch": 2, "start_epoch_ms": 1400, "end_epoch_ms": 1500},
        {"batch": 3},  # a record without its window
    ]
    _probe.attach(batches, SAMPLES)
    assert [b["probe_us"] for b in batches] == [950.0, 3000.0, None, None]


def _batch(batch: int, start: int, trigger: int, probe: float) -> dict[str, Any]:
    """test_bench_gc's batch record, with its probe sample."""
    return {**gc_batch(batch, start, trigger), "probe_us": probe}


def test_the_spike_line_gives_the_slowest_batchs_probe_beside_a_median_batchs(
    capsys: Any,
) -> None:
    triggers = [1500, 400, 300, 700, 300, 320]
    probes = [900.0, 950.0, 940.0, 1900.0, 960.0, 1000.0]
    batches = [_batch(b, 1000 * b, t, p) for b, (t, p) in enumerate(zip(triggers, probes))]
    summary = w1.summarize({"batches": batches})
    assert summary["trigger_ms_max_probe_us"] == 1900.0
    assert summary["probe_us_median"] == 980.0  # batches 2 to 5: 940, 1,900, 960, 1,000
    spikes = next(t for t in w1.targets({"heapstate": summary}) if t["target"].startswith("max"))
    assert (spikes["slowest_batch_probe_us"], spikes["median_batch_probe_us"]) == (1900.0, 980.0)
    w1.print_targets([spikes])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  FAIL  max trigger <= 1.5x median (batch >= 2)  (700 vs limit 465); "
        "slowest: batch 3, its commit 10 ms, the machine probe's fixed work 1,900 us "
        "(a median batch 980)"
    )
    # Batches without a sample (a run with --no-probe, or a report from before stop 69) name none.
    for b in batches:
        b["probe_us"] = None
    older = w1.summarize({"batches": batches})
    assert older["probe_us_median"] is None and older["trigger_ms_max_probe_us"] is None
    spikes = next(t for t in w1.targets({"heapstate": older}) if t["target"].startswith("max"))
    assert "slowest_batch_probe_us" not in spikes


def test_w5s_growth_gives_the_probes_ratio(capsys: Any) -> None:
    low = {"trigger_ms_median": 250.0, "probe_us_median": 1000.0, "jvm_cpu_ms_median": 400.0}
    high = {"trigger_ms_median": 300.0, "probe_us_median": 1500.0, "jvm_cpu_ms_median": 500.0}
    g = w5.growth({1_000_000: low, 4_000_000: high})
    assert (g["trigger_ratio"], g["jvm_cpu_ratio"], g["probe_ratio"]) == (1.2, 1.25, 1.5)
    w5.print_report("W5", {"heapstate": {1_000_000: low, 4_000_000: high}}, {"heapstate": g}, [])
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "machine probe" in line)
    row = next(line for line in lines if "1,000,000 -> 4,000,000" in line)
    # Each ratio sits under its heading, right-aligned to it: the JVM CPU's, then the probe's.
    for heading, ratio in (("JVM CPU", "1.25x"), ("machine probe", "1.50x")):
        end = header.index(heading) + len(heading)
        assert row[end - len(ratio) : end] == ratio, heading
    del high["probe_us_median"]
    assert w5.growth({1_000_000: low, 4_000_000: high})["probe_ratio"] is None


def test_the_probe_process_samples_until_stopped(tmp_path: Path) -> None:
    probe = _probe.Probe(tmp_path / "logs" / "probe.txt")
    started = time.time() * 1000
    probe.start()
    try:
        deadline = time.monotonic() + 30
        while len(probe.samples()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        probe.stop()
    stopped = time.time() * 1000
    samples = probe.samples()
    assert len(samples) >= 3
    assert all(started <= at <= stopped for at, _ in samples)
    assert all(us > 0 for _, us in samples)
    # What W1 and W5 do with them: a run whose one batch spans the probe's life gets their median.
    run: dict[str, Any] = {"batches": [{"start_epoch_ms": started, "end_epoch_ms": stopped}]}
    probe.attach_to([run])
    assert run["batches"][0]["probe_us"] == statistics.median(us for _, us in samples)
    assert probe.pid is None


PARENT = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import _probe
probe = _probe.Probe(Path(sys.argv[2]))
probe.start()
print(probe.pid, flush=True)
time.sleep(60)
"""


def test_the_probe_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    out = tmp_path / "probe.txt"
    # A parent that starts the probe and is killed before it can stop it.
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(BENCH), str(out)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
