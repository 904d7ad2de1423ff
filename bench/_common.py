"""Pieces the heapstate benchmarks (W1 to W5) share.

- ``PROVIDERS``: the state store providers compared side by side, with their Spark confs.
- ``resolve_jar``: where the heapstate jar is, checked to really hold the provider class.
- ``run_worker``: run one provider's measurement in its own Python (and so its own JVM), one
  after another, so the runs never compete for the machine's cores. The worker's stderr goes to
  a log file; only its progress lines (``PROGRESS_TAG``) are echoed to our stderr.
- ``StateFiles``: byte accounting of a checkpoint's ``state`` folder between batches.
- ``jvm_heap_after_gc``: the driver JVM's retained heap after full collections.
- ``print_comparison`` and ``write_json``: the report, with each figure's ratio to HDFS.

These modules are scripts' helpers, not a library: they are imported by the scripts in ``bench/``
(Python puts a script's own folder on ``sys.path``).
"""

from __future__ import annotations

import argparse
import filecmp
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_PYTHON = REPO_DIR / ".venv" / "bin" / "python"
REPO_JAR = REPO_DIR / "target" / "heapstate.jar"

HEAPSTATE_CLASS = "heapstate.HeapStateStoreProvider"
HDFS_CLASS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_CLASS = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
HEAPSTATE_PLUGIN = "heapstate.TaskActivityPlugin"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
MAINTENANCE_CONF = "spark.sql.streaming.stateStore.maintenanceInterval"

PROGRESS_TAG = "[bench] "
"""Prefix of a worker's stderr lines that the parent echoes; everything else goes to the log."""

BASELINE = "hdfs"
"""The provider every ratio is taken against."""


@dataclass(frozen=True)
class Provider:
    """One side of the comparison: a provider class and the confs that select its variant."""

    name: str
    label: str
    provider_class: str
    confs: dict[str, str] = field(default_factory=dict)
    needs_jar: bool = False

    def spark_confs(self) -> dict[str, str]:
        return {PROVIDER_CONF: self.provider_class, **self.confs}


PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider("hdfs", "HDFS", HDFS_CLASS),
        Provider("rocksdb-changelog", "RocksDB+changelog", ROCKSDB_CLASS, {CHANGELOG_CONF: "true"}),
        Provider("rocksdb", "RocksDB no changelog", ROCKSDB_CLASS, {CHANGELOG_CONF: "false"}),
        Provider("heapstate", "heapstate", HEAPSTATE_CLASS, needs_jar=True),
    )
}
"""Every provider, in the order they run by default: the baseline first."""


def read_report(path: Path) -> Any:
    """A JSON report's content, gunzipped first when the file's name ends in ``.gz`` (as the
    reports kept in git in ``bench/evidence/`` are, from stop 76 on). A file that cannot be read,
    a damaged gzip file (cut short, a byte changed, not gzip), bytes that are not UTF-8 and text
    that is not JSON all raise ``ValueError`` with the message ``<path>: not a readable JSON
    report: <why>``, which the scripts print as it is."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                text = f.read()
        else:
            text = path.read_text(encoding="utf-8")
        return json.loads(text)
    except (OSError, EOFError, zlib.error, ValueError) as err:  # ValueError: JSON's and UTF-8's
        raise ValueError(f"{path}: not a readable JSON report: {err}") from err


def parse_providers(spec: str) -> list[Provider]:
    """Parse ``--providers`` (comma-separated names, or ``all``) into providers, in that order."""
    if spec.strip() == "all":
        return list(PROVIDERS.values())
    chosen: list[Provider] = []
    for name in (n.strip() for n in spec.split(",") if n.strip()):
        if name not in PROVIDERS:
            raise SystemExit(
                f"--providers: unknown provider {name!r}; choose from {', '.join(PROVIDERS)}"
            )
        if PROVIDERS[name] not in chosen:
            chosen.append(PROVIDERS[name])
    if not chosen:
        raise SystemExit("--providers: no provider named")
    return chosen


def parse_confs(pairs: Iterable[str]) -> dict[str, str]:
    """Parse repeated ``--conf key=value`` flags."""
    confs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--conf {pair!r}: expected key=value")
        confs[key.strip()] = value.strip()
    return confs


def jar_has_provider(jar: Path) -> bool:
    """Whether ``jar`` exists and holds the compiled heapstate provider class."""
    entry = HEAPSTATE_CLASS.replace(".", "/") + ".class"
    try:
        with zipfile.ZipFile(jar) as zf:
            return entry in zf.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def newer_sources(than: Path) -> list[Path]:
    """The build's sources (``scala/``, ``build.sbt`` and ``project/`` without sbt's own output,
    as ``bin/setup`` checks them) modified after the file ``than``, newest first."""

    def is_source(f: Path) -> bool:
        top, *dirs = f.relative_to(REPO_DIR).parts[:-1] or ("",)
        output = {"target", "project"} if top == "project" else {"target"}
        return f.is_file() and not output.intersection(dirs)

    stamp = than.stat().st_mtime
    candidates = [REPO_DIR / "build.sbt"]
    for root in (REPO_DIR / "scala", REPO_DIR / "project"):
        candidates += root.rglob("*") if root.is_dir() else []
    newer = [f for f in candidates if is_source(f) and f.stat().st_mtime > stamp]
    return sorted(newer, key=lambda f: f.stat().st_mtime, reverse=True)


def _refuse_stale(jar: Path) -> None:
    """A benchmark must measure the code it is run from: the installed jar is only rebuilt by
    ``bin/setup``, so after a change to the Scala sources it still holds the old provider."""
    newer = newer_sources(jar)
    built = REPO_DIR / "target" / "heapstate.jar"
    # bin/setup leaves an installed jar alone when a rebuild gave the same bytes (a change to
    # comments only); the build's own jar then carries the time of that check.
    if newer and built.is_file() and built != jar and filecmp.cmp(built, jar, shallow=False):
        newer = newer_sources(built)
    if newer:
        raise SystemExit(
            f"the heapstate jar {jar} is older than the sources it is built from "
            f"({len(newer)} newer, the newest {newer[0].relative_to(REPO_DIR)}): run bin/setup "
            "to rebuild and reinstall it, or pass --jar to measure that jar anyway"
        )


def resolve_jar(explicit: str | None, python: str) -> Path:
    """Find the heapstate jar: ``--jar``, then the ``heapstate`` package of ``python``, then the
    build output ``target/heapstate.jar``. The first candidate holding the provider class wins;
    without ``--jar``, it must not be older than the Scala sources (see ``_refuse_stale``)."""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    else:
        probe = subprocess.run(
            [python, "-c", "import heapstate; print(heapstate.jar_path())"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip():
            candidates.append(Path(probe.stdout.strip()))
        candidates.append(REPO_JAR)
    for jar in candidates:
        if jar_has_provider(jar):
            if not explicit:
                _refuse_stale(jar)
            return jar.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise SystemExit(
        f"no heapstate jar holding {HEAPSTATE_CLASS} (tried {tried}); build it with bin/setup, "
        "pass --jar, or leave heapstate out with --providers hdfs,rocksdb-changelog,rocksdb"
    )


def progress(message: str) -> None:
    """Print one progress line on stderr, tagged so that a parent process echoes it."""
    # One write, so that the JVM's own stderr lines cannot land inside ours.
    sys.stderr.write(PROGRESS_TAG + message + "\n")
    sys.stderr.flush()


def run_worker(
    python: str,
    script: Path,
    args: Sequence[str],
    log_path: Path,
    env: dict[str, str] | None = None,
) -> None:
    """Run ``python script args...`` to completion, appending its output to ``log_path`` and
    echoing its progress lines. Raises ``RuntimeError`` naming the log if it fails.

    The worker runs in a process group of its own, with its Spark JVM. Once the worker has exited,
    its JVM gets ``JVM_EXIT_GRACE_S`` to follow, and is then killed: in stop 44 a RocksDB restart
    worker's JVM hung in its shutdown after the worker had written its figures, and, holding the
    worker's stderr open, stalled the whole benchmark until it was killed by hand. The group is
    killed too when the benchmark itself stops on an error or Ctrl-C."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [python, str(script), *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            bufsize=1,
            start_new_session=True,
        )

        def copy_output() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                log.write(line)
                if line.startswith(PROGRESS_TAG):
                    sys.stderr.write(line[len(PROGRESS_TAG) :])
                    sys.stderr.flush()

        reader = threading.Thread(target=copy_output, daemon=True)
        reader.start()
        try:
            rc = proc.wait()
            reader.join(JVM_EXIT_GRACE_S)
            if reader.is_alive():
                log.write(
                    f"[bench] the worker exited ({rc}) but its JVM still ran "
                    f"{JVM_EXIT_GRACE_S:.0f} s later: killed\n"
                )
                _kill_group(proc.pid)
                reader.join(10)
        finally:
            if proc.poll() is None:
                _kill_group(proc.pid)
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(
            f"worker {' '.join(args[:2])} failed with exit code {rc}; full log in {log_path}; "
            "it ends with:\n  " + "\n  ".join(tail)
        )


JVM_EXIT_GRACE_S = 60.0
"""How long ``run_worker`` lets a worker's JVM outlive the worker before it kills it."""


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the process group ``pgid`` (a worker and its JVM)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def pyspark_submit_args(
    driver_memory: str,
    jars: Sequence[Path] = (),
    gc_log: Path | None = None,
    java_options: Sequence[str] = (),
) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a worker: the driver's heap must be set before the JVM starts,
    which a SparkSession builder conf cannot do once ``pyspark`` launches the gateway. With
    ``gc_log``, the driver JVM (which is also the executor under ``local[*]``) writes its GC log
    there (``GC_LOG_TAGS``, each line stamped with the epoch milliseconds; see ``gc_pauses``).
    ``java_options`` go to the driver JVM as well (none may contain a space).

    ``jars`` is heapstate's jar, in a worker that runs heapstate: with it goes heapstate's plugin
    (``spark.plugins``), as ``heapstate.configure`` registers it, so that the benchmarks measure
    heapstate as its users run it. A ``--conf spark.plugins=...`` of the benchmark's own command
    line replaces it (an empty value runs without it)."""
    parts = ["--driver-memory", driver_memory]
    if jars:
        parts += ["--jars", ",".join(str(j) for j in jars)]
        parts += ["--conf", f"spark.plugins={HEAPSTATE_PLUGIN}"]
    options = list(java_options)
    if any(" " in o or not o for o in options):
        raise SystemExit(f"JVM options {options}: each must be one word, without spaces")
    if gc_log is not None:
        if ":" in str(gc_log) or " " in str(gc_log):
            raise SystemExit(f"GC log path {gc_log}: -Xlog cannot take ':' or ' ' in a path")
        options.append(f"-Xlog:{GC_LOG_TAGS}:file={gc_log}:timemillis:filecount=0")
    if options:
        parts += ["--driver-java-options", shlex.quote(" ".join(options))]
    return " ".join([*parts, "pyspark-shell"])


def add_java_option(parser: argparse.ArgumentParser, what: str, example: str) -> None:
    """``--java-option``, repeatable, into ``args.java_option`` (a list; ``pyspark_submit_args``'
    ``java_options``, which checks that each is one word): an extra option for ``what``, such as
    ``example``. W1, W4, W5 and the soak take it."""
    parser.add_argument(
        "--java-option",
        action="append",
        default=[],
        metavar="OPTION",
        help=f"an extra option for {what}, such as {example} (repeatable; one word each)",
    )


GC_LOG_TAGS = "gc,gc+phases,gc+heap,gc+cpu,safepoint"
"""What the worker JVMs' GC logs hold: each pause (``gc``), with its phases (``gc+phases``), G1's
regions by kind before and after it (``gc+heap``), the CPU the JVM used in it (``gc+cpu``: on JDK
17 the whole process's, so at most the GC threads') and the wait for the threads to stop
(``safepoint``), so that a long pause can be told apart: much copying, many regions to scan, or
GC threads kept off the cores (the JVM's CPU well under the pause's length times the GC threads).
The log is one file, never rotated (``filecount=0``). Reports from before stop 72 logged ``gc``
alone."""

_GC_PAUSE = re.compile(r"^\[(\d+)ms\] GC\((\d+)\) (Pause [^(]*?)\s*(?:\(.*\))?\s.*?([\d.]+)ms$")
_GC_PHASE = re.compile(
    r"^\[\d+ms\] GC\((\d+)\)(?:\s{2,}([A-Za-z][^:]*): | (Phase \d+: \D+?) )([\d.]+)\s?ms$"
)
_GC_REGIONS = re.compile(r"^\[\d+ms\] GC\((\d+)\) (\w+) regions: (\d+)->(\d+)")
_GC_CPU = re.compile(r"^\[\d+ms\] GC\((\d+)\) User=([\d.]+)s Sys=([\d.]+)s Real=([\d.]+)s$")
_SAFEPOINT = re.compile(r'^\[\d+ms\] Safepoint "([^"]+)".*?Reaching safepoint: (\d+) ns')


def gc_pauses(gc_log: Path) -> list[dict[str, Any]]:
    """The stop-the-world pauses in a JVM's GC log (``GC_LOG_TAGS``, or ``-Xlog:gc`` alone)
    written with the ``timemillis`` decorator: one record per pause with ``end_epoch_ms`` (when
    the line was logged, at the pause's end), ``pause_ms``, ``kind`` ("Pause Young", "Pause Full",
    "Pause Remark", ...) and ``gc_id``. Concurrent phases are not pauses and are left out.

    Where the log has them, a record also holds ``phases`` (G1's top-level phases of the pause,
    name to ms, as logged before the pause's line), ``regions`` (kind to ``[before, after]``),
    ``cpu_ms`` and ``real_ms`` (the JVM's user and system CPU in the pause, at most its GC
    threads' on JDK 17, and the pause's wall time, as ``gc+cpu`` logs them in units of 10 ms)
    and ``reach_safepoint_ms`` (how long the JVM took to stop its threads for the pause, which
    the pause's own time leaves out)."""
    pauses: list[dict[str, Any]] = []
    if not gc_log.exists():
        return pauses
    phases: dict[str, dict[str, float]] = {}
    regions: dict[str, dict[str, list[int]]] = {}
    last: dict[str, Any] | None = None
    for line in gc_log.read_text(errors="replace").splitlines():
        line = line.strip()
        m = _GC_PAUSE.match(line)
        if m:
            gc_id = m.group(2)
            last = {
                "end_epoch_ms": int(m.group(1)),
                "kind": m.group(3),
                "pause_ms": float(m.group(4)),
                "gc_id": int(gc_id),
            }
            if gc_id in phases:
                last["phases"] = phases.pop(gc_id)
            if gc_id in regions:
                last["regions"] = regions.pop(gc_id)
            pauses.append(last)
            continue
        m = _GC_PHASE.match(line)
        if m:
            name = (m.group(2) or m.group(3)).strip()
            phases.setdefault(m.group(1), {})[name] = float(m.group(4))
            continue
        m = _GC_REGIONS.match(line)
        if m:
            regions.setdefault(m.group(1), {})[m.group(2)] = [int(m.group(3)), int(m.group(4))]
            continue
        m = _GC_CPU.match(line)
        if m and last is not None and str(last["gc_id"]) == m.group(1) and "cpu_ms" not in last:
            last["cpu_ms"] = round(1000 * (float(m.group(2)) + float(m.group(3))), 1)
            last["real_ms"] = round(1000 * float(m.group(4)), 1)
            continue
        m = _SAFEPOINT.match(line)
        if m and last is not None and "reach_safepoint_ms" not in last:
            # The pause's own safepoint is the first one logged after it.
            last["reach_safepoint_ms"] = round(int(m.group(2)) / 1e6, 3)
            last["safepoint"] = m.group(1)
            last = None
    return pauses


def describe_pause(pause: dict[str, Any]) -> str:
    """A pause record of ``gc_pauses`` in words: its kind and time, its longest phase, the JVM's
    CPU in it against its wall time, the wait to stop the threads, and the regions it
    copied into (survivor and old, before and after)."""
    out = f"{pause['kind']} {pause['pause_ms']:,.1f} ms"
    parts: list[str] = []
    phases = pause.get("phases") or {}
    if phases:
        name, ms = max(phases.items(), key=lambda kv: kv[1])
        parts.append(f"{name} {ms:,.1f} ms")
    if pause.get("cpu_ms") is not None:
        parts.append(f"JVM CPU {pause['cpu_ms']:,.0f} ms in {pause['real_ms']:,.0f} ms")
    if pause.get("reach_safepoint_ms") is not None:
        parts.append(f"reaching the safepoint {pause['reach_safepoint_ms']:,.1f} ms")
    regions = pause.get("regions") or {}
    moved = [
        f"{kind} regions {a}->{b}"
        for kind, (a, b) in regions.items()
        if kind in ("Survivor", "Old")
    ]
    parts.extend(moved)
    return out + (f" ({'; '.join(parts)})" if parts else "")


_GC_CYCLE = re.compile(r"^\[(\d+)ms\] GC\((\d+)\) Concurrent Mark Cycle(?: ([\d.]+)ms)?$")


def gc_mark_cycles(gc_log: Path) -> list[dict[str, Any]]:
    """G1's concurrent marking cycles in a JVM's ``-Xlog:gc`` log written with the ``timemillis``
    decorator: one record per cycle with ``start_epoch_ms``, ``end_epoch_ms`` and ``cycle_ms``
    (as G1 logs it). A marking thread works through a cycle beside the application, so on a
    machine with few cores a cycle slows whatever runs meanwhile. Cycles G1 undid at once
    ("Concurrent Undo Cycle") are left out, and so is a cycle the log does not see end."""
    cycles: list[dict[str, Any]] = []
    if not gc_log.exists():
        return cycles
    started: dict[str, int] = {}
    for line in gc_log.read_text(errors="replace").splitlines():
        m = _GC_CYCLE.match(line.strip())
        if not m:
            continue
        at, gc_id, took = int(m.group(1)), m.group(2), m.group(3)
        if took is None:
            started[gc_id] = at
        elif gc_id in started:
            cycles.append(
                {"start_epoch_ms": started.pop(gc_id), "end_epoch_ms": at, "cycle_ms": float(took)}
            )
    return cycles


def marking_ms_between(cycles: Sequence[dict[str, Any]], start_ms: float, end_ms: float) -> float:
    """How many ms of ``[start_ms, end_ms]`` (epoch ms) G1 spent in the marking ``cycles``."""
    return float(
        sum(
            max(0.0, min(end_ms, c["end_epoch_ms"]) - max(start_ms, c["start_epoch_ms"]))
            for c in cycles
        )
    )


def pause_records_between(
    pauses: Sequence[dict[str, Any]], start_ms: float, end_ms: float
) -> list[dict[str, Any]]:
    """The records of ``pauses`` that ended within ``[start_ms, end_ms]`` (epoch ms), in order."""
    return [p for p in pauses if start_ms <= p["end_epoch_ms"] <= end_ms]


def pauses_between(pauses: Sequence[dict[str, Any]], start_ms: float, end_ms: float) -> list[float]:
    """The pause times (ms) of ``pauses`` that ended within ``[start_ms, end_ms]`` (epoch ms)."""
    return [p["pause_ms"] for p in pause_records_between(pauses, start_ms, end_ms)]


FILE_KINDS = ("journal", "snapshot", "rocksdb-sst", "rocksdb-zip", "other")
"""What a state file is, for the split of checkpoint bytes: ``journal`` is a per-version log of
changes (heapstate's ``.hs-journal``, HDFS's ``.delta``, RocksDB's ``.changelog``), ``snapshot``
a full copy of a version (heapstate's ``.hs-snapshot``, HDFS's ``.snapshot``), ``rocksdb-sst``
and ``rocksdb-zip`` RocksDB's uploaded SST files and its per-version zip of metadata and logs,
``other`` everything else (operator metadata, schema files, checksum files)."""


def file_kind(relpath: str) -> str:
    """The kind (one of ``FILE_KINDS``) of a file under a checkpoint's ``state`` folder."""
    name = os.path.basename(relpath)
    if name.startswith("."):  # Hadoop's .crc checksums and temporary files
        return "other"
    if name.endswith((".hs-journal", ".delta", ".changelog")):
        return "journal"
    if name.endswith((".hs-snapshot", ".snapshot")):
        return "snapshot"
    if name.endswith(".sst"):
        return "rocksdb-sst"
    if name.endswith(".zip"):
        return "rocksdb-zip"
    return "other"


def snapshot_or_journal(relpath: str) -> tuple[str, int] | None:
    """``("snapshot" | "journal", version)`` for a state file a restart can read: heapstate's and
    the HDFS provider's snapshots and journals (deltas), RocksDB's zips (as snapshots) and
    changelogs (as journals); ``None`` for anything else."""
    kind = file_kind(relpath)
    kind = "snapshot" if kind == "rocksdb-zip" else kind
    head = os.path.basename(relpath).split(".")[0].split("_")[0]
    if kind not in ("snapshot", "journal") or not head.isdigit():
        return None
    return kind, int(head)


def recovery_chains(state_dir: Path) -> list[dict[str, Any]]:
    """For each store folder under ``state_dir`` (``<operator>/<partition>``), what a restart at
    the newest version reads: the newest snapshot (heapstate's or the HDFS provider's; 0 if none)
    and how many journals (deltas) above it. RocksDB folders report their journals as changelogs
    and their snapshots as zips."""
    chains = []
    if not state_dir.exists():
        return chains
    for store in sorted(p for p in state_dir.glob("*/*") if p.is_dir() and p.name.isdigit()):
        versions: dict[str, set[int]] = {"journal": set(), "snapshot": set()}
        for f in store.iterdir():
            found = snapshot_or_journal(f.name)
            if found:
                versions[found[0]].add(found[1])
        newest = max(versions["journal"] | versions["snapshot"], default=0)
        snapshot = max((v for v in versions["snapshot"] if v <= newest), default=0)
        chains.append(
            {
                "store": str(store.relative_to(state_dir)),
                "version": newest,
                "snapshot": snapshot,
                "journals_above": sum(1 for v in versions["journal"] if v > snapshot),
            }
        )
    return chains


class StateFiles:
    """Byte accounting of a checkpoint's ``state`` folder, one inventory per batch.

    Cleanup (maintenance) can delete files between two looks, so two figures are kept:
    ``delta`` is the change of the folder's total, which can be negative, and ``new`` is the
    bytes of files that appeared (or grew) since the last look, i.e. what was written. Both the
    folder's total and the new bytes are also split by ``file_kind``; ``new_snapshot_versions``
    are the versions of the snapshots that appeared.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.sizes: dict[str, int] = {}

    def inventory(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        if not self.state_dir.exists():
            return sizes
        for root, _dirs, files in os.walk(self.state_dir):
            for name in files:
                if name.endswith((".tmp", ".tmp.crc")):  # a file still being written
                    continue
                path = os.path.join(root, name)
                try:
                    sizes[os.path.relpath(path, self.state_dir)] = os.path.getsize(path)
                except FileNotFoundError:  # deleted by maintenance while we walked
                    continue
        return sizes

    def step(self) -> dict[str, Any]:
        """Take a new inventory; return ``total``, ``delta``, ``new`` bytes, ``files``, and
        ``total_by_kind`` and ``new_by_kind`` (bytes per ``file_kind``)."""
        now = self.inventory()
        total_by_kind = dict.fromkeys(FILE_KINDS, 0)
        new_by_kind = dict.fromkeys(FILE_KINDS, 0)
        new_snapshots: set[int] = set()
        for path, size in now.items():
            kind = file_kind(path)
            total_by_kind[kind] += size
            grown = size - self.sizes.get(path, 0)
            if grown > 0:
                new_by_kind[kind] += grown
                found = snapshot_or_journal(path)
                if found and found[0] == "snapshot":
                    new_snapshots.add(found[1])
        total = sum(now.values())
        delta = total - sum(self.sizes.values())
        self.sizes = now
        return {
            "total": total,
            "delta": delta,
            "new": sum(new_by_kind.values()),
            "files": len(now),
            "total_by_kind": total_by_kind,
            "new_by_kind": new_by_kind,
            "new_snapshot_versions": sorted(new_snapshots),
        }


def drop_file(source: Path, input_dir: Path, name: str | None = None) -> None:
    """Copy ``source`` into a streaming query's input folder atomically, as ``name`` (its own name
    by default): the file source skips names starting with a dot, so the copy becomes visible
    only when it is renamed."""
    name = name or source.name
    hidden = input_dir / f".{name}.tmp"
    shutil.copyfile(source, hidden)
    os.replace(hidden, input_dir / name)


def wait_for_batch(
    query: Any, batch: int, timeout_s: float = 3600.0, poll_s: float = 0.05
) -> dict[str, Any]:
    """Wait for batch ``batch`` of ``query`` to finish and return its progress as plain JSON.

    ``processAllAvailable`` can return early when a trigger that listed the folder before the
    file landed reports "no new data", so it is repeated until the batch's progress appears.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        query.processAllAvailable()
        for jprogress in query._jsq.recentProgress():
            p = json.loads(jprogress.json())
            if p.get("batchId") == batch and p.get("numInputRows", 0) > 0:
                return p
        if query.exception() is not None:
            raise RuntimeError(f"the query failed before batch {batch}: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch} did not finish within {timeout_s:.0f} s")
        time.sleep(poll_s)


def is_full_collector(name: str) -> bool:
    """Whether a ``GarbageCollectorMXBean`` of this name counts full collections (G1's "G1 Old
    Generation", Parallel's "PS MarkSweep", Serial's "MarkSweepCompact")."""
    return "Old Generation" in name or "MarkSweep" in name


def jvm_heap_after_gc(spark: Any, rounds: int = 3, patience_s: float = 30.0) -> dict[str, int]:
    """The driver JVM's heap use after ``rounds`` full collections (``MemoryMXBean.gc``).

    With ``local[*]`` the executor lives in the driver JVM, so this includes every loaded state
    store. ``used`` is what survives the collections; ``committed`` is what the JVM holds.

    A requested collection does not always run. While a thread is inside a JNI critical region
    (zstd-jni compressing a snapshot on heapstate's background thread, for one), G1 drops it and
    runs a young collection when the region is left ("GCLocker Initiated GC"); ``used`` then
    counts garbage (1.17 GB against 0.45 GB, in one W1 run). So the request is repeated until the
    JVM's full-collection count has moved ``rounds`` times, for at most ``patience_s``;
    ``full_gcs`` says how many ran (``-1`` when the JVM names no full collector).
    """
    jvm = spark.sparkContext._jvm
    factory = jvm.java.lang.management.ManagementFactory
    bean = factory.getMemoryMXBean()
    full = [b for b in factory.getGarbageCollectorMXBeans() if is_full_collector(b.getName())]

    def full_count() -> int:
        return sum(int(b.getCollectionCount()) for b in full)

    done = 0
    deadline = time.monotonic() + patience_s
    while done < rounds and time.monotonic() < deadline:
        before = full_count()
        bean.gc()
        time.sleep(0.2)
        done += 1 if not full or full_count() > before else 0
    usage = bean.getHeapMemoryUsage()
    return {
        "used": int(usage.getUsed()),
        "committed": int(usage.getCommitted()),
        "max": int(usage.getMax()),
        "full_gcs": done if full else -1,
    }


def jvm_pid(spark: Any) -> int:
    """The process id of the driver JVM (with ``local[*]``, also the executor)."""
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


@dataclass(frozen=True)
class ProcCounters:
    """What Linux counts for a process and its machine, read at one moment (``proc_counters``).

    - ``minor_faults``: the process's minor page faults. A JVM takes one the first time it writes
      a page of heap that G1 committed but nothing has used yet, so a batch whose young generation
      grows into new heap takes thousands (up to 33,000 in stop 44's W1 runs, against about 100 in
      a median batch). They slow some batches and not others (docs/PERFORMANCE_HISTORY.md).
    - ``cpu_ms``: the process's CPU time, every thread (tasks, GC, JIT, heapstate's snapshots).
    - ``steal_ms``: the machine's steal time over all its CPUs: time a hypervisor gave this
      virtual machine's CPUs to something else.
    - ``threads``: each live thread's kind (``thread_kind``), CPU time (ms) and start time (clock
      ticks since boot, which tells a thread apart from a later one with the same id), by thread
      id; empty when the threads could not be read.
    """

    minor_faults: int
    cpu_ms: float
    steal_ms: float
    threads: dict[int, tuple[str, float, int]] = field(default_factory=dict)

    def since(self, before: ProcCounters) -> dict[str, Any]:
        """The counts from ``before`` to this reading, under ``PROC_KEYS``, as a W1 batch records
        them, and (when both readings have threads) ``jvm_cpu_ms_by_thread``: the CPU time by
        thread kind (``THREAD_KINDS``). A thread that began meanwhile (a new id, or an id whose
        thread started at another time) counts all its time; one that ended meanwhile is counted
        under ``ended``, the process's CPU time that no live thread accounts for (a little below
        zero from the clock's ticks)."""
        counts: dict[str, Any] = dict(
            zip(
                PROC_KEYS,
                (
                    self.minor_faults - before.minor_faults,
                    round(self.cpu_ms - before.cpu_ms),
                    round(self.steal_ms - before.steal_ms),
                ),
                strict=True,
            )
        )
        if self.threads and before.threads:
            by_kind = dict.fromkeys(THREAD_KINDS, 0.0)
            for tid, (kind, ms, started) in self.threads.items():
                earlier = before.threads.get(tid)
                same = earlier is not None and earlier[2] == started
                by_kind[kind] += ms - earlier[1] if same else ms
            by_kind["ended"] = (self.cpu_ms - before.cpu_ms) - sum(by_kind.values())
            counts["jvm_cpu_ms_by_thread"] = {k: round(v) for k, v in by_kind.items()}
        return counts


PROC_KEYS = ("minor_faults", "jvm_cpu_ms", "steal_ms")
"""The names of ``ProcCounters.since``'s counts, in a W1 batch's record and (``<key>_median``,
``trigger_ms_max_<key>``) in its summary."""

BATCH_COUNTS = (*PROC_KEYS, "probe_us")
"""What a W1 batch records of the machine beside its trigger: ``PROC_KEYS``, then the machine
probe's median sample in it (``probe_us``, bench/_probe.py; stop 69 on); each summarized as
``<key>_median`` over the steady batches and ``trigger_ms_max_<key>`` for the slowest."""


def proc_counters(pid: int) -> ProcCounters | None:
    """``ProcCounters`` of process ``pid`` now, from ``/proc/<pid>/stat`` and ``/proc/stat``; None
    where they cannot be read (not Linux, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        machine = Path("/proc/stat").read_text()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    counted = parse_proc_counters(stat, machine, ticks)
    threads: dict[int, tuple[str, float, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return counted
    for tid in tids:
        try:  # a thread may end between the listing and the read
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name, ms, started = parse_thread_cpu(stat, ticks)
        threads[int(tid)] = (thread_kind(name), ms, started)
    return ProcCounters(counted.minor_faults, counted.cpu_ms, counted.steal_ms, threads)


def parse_thread_cpu(stat: str, ticks_per_s: int) -> tuple[str, float, int]:
    """A thread's name, CPU time (ms) and start time (clock ticks since boot) from its
    ``/proc/<pid>/task/<tid>/stat`` line, which has the process's layout
    (``parse_proc_counters``; the start time is the stat's 22nd field). The name is the first 15
    characters of the thread's, as HotSpot gives them to the kernel when the thread starts or
    renames itself (Spark's task threads do, keeping their prefix); a rename by another thread
    is not seen."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = _stat_fields(stat)
    return name, _stat_cpu_ms(fields, ticks_per_s), int(fields[19])


def _stat_fields(stat: str) -> list[str]:
    """The fields of a ``/proc`` stat line (a process's or a thread's) after its command name,
    which, in parentheses, may itself hold spaces and parentheses: they are counted from the last
    ``)``, and the first after it is the stat's third (the state)."""
    return stat[stat.rindex(")") + 1 :].split()


def _stat_cpu_ms(fields: list[str], ticks_per_s: int) -> float:
    """The CPU time in ms of a stat line's ``_stat_fields``: ``utime`` and ``stime``, the stat's
    fourteenth and fifteenth, in ticks of ``1 / ticks_per_s`` seconds."""
    return (int(fields[11]) + int(fields[12])) * 1000 / ticks_per_s


THREAD_KINDS = ("task", "driver", "jit", "gc", "store background", "other")
"""The kinds of a JVM's threads ``thread_kind`` tells apart, in the order reports show them."""

CPU_SPLIT_KINDS = (*THREAD_KINDS, "ended")
"""The keys of a batch's ``jvm_cpu_ms_by_thread`` (``ProcCounters.since``), in the order reports
show them: ``THREAD_KINDS``, then ``ended``, the CPU time of threads that ended meanwhile."""

_GC_THREAD = re.compile(r"^(GC Thread|G1 |VM Thread|VM Periodic)")


def thread_kind(name: str) -> str:
    """The kind (``THREAD_KINDS``) of a worker JVM's thread, by its name or the first 15
    characters of it that Linux keeps:

    - ``task``: Spark's task threads (``Executor task launch worker``);
    - ``driver``: the query's own thread (``stream execution thread``): planning, progress;
    - ``jit`` and ``gc``: the compiler threads, and the collector's and the VM's own threads;
    - ``store background``: heapstate's snapshot thread and Spark's state store maintenance;
    - ``other``: every other thread (RPC, listeners, Py4J, a profiler)."""
    if "CompilerThre" in name:
        return "jit"
    if _GC_THREAD.match(name):
        return "gc"
    if name.startswith("Executor task"):
        return "task"
    if name.startswith("stream executio"):
        return "driver"
    if name.startswith(("heapstate-snaps", "state-store-mai")):
        return "store background"
    return "other"


def parse_proc_counters(stat: str, machine: str, ticks_per_s: int) -> ProcCounters:
    """``ProcCounters`` from a ``/proc/<pid>/stat`` line and ``/proc/stat``, whose times are in
    ticks of ``1 / ticks_per_s`` seconds.

    The process's ``minflt`` is the stat's tenth field (``_stat_fields``), its CPU time
    ``_stat_cpu_ms``. ``/proc/stat``'s ``cpu`` line sums every CPU: user, nice, system, idle,
    iowait, irq, softirq, then steal."""
    fields = _stat_fields(stat)
    cpu = next(line for line in machine.splitlines() if line.startswith("cpu "))
    return ProcCounters(
        minor_faults=int(fields[7]),
        cpu_ms=_stat_cpu_ms(fields, ticks_per_s),
        steal_ms=int(cpu.split()[8]) * 1000 / ticks_per_s,
    )


def heap_after_full_gcs(heap: dict[str, Any] | None) -> int | None:
    """``used`` of a ``jvm_heap_after_gc`` record, or None when not one full collection ran
    before it was read (a record without ``full_gcs`` predates that check: taken as it is)."""
    if not heap or heap.get("used") is None or heap.get("full_gcs") == 0:
        return None
    return int(heap["used"])


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def maximum(values: Sequence[float]) -> float | None:
    return max(values) if values else None


@dataclass(frozen=True)
class Metric:
    """One row of the comparison table: a key into each provider's summary and its format."""

    key: str
    label: str
    fmt: Callable[[float], str]


def fmt_ms(value: float) -> str:
    return f"{value:,.0f} ms"


def slowest_batch_detail(target: dict[str, Any]) -> str:
    """What W1's spikes target says of its slowest steady batch, for the console and the README:
    which batch, how much of it G1's marking ran beside, its longest GC pause, its commit and the
    part of Spark's trigger it spent most over a median batch.
    Each part is left out when the report does not hold it (reports before it was recorded)."""
    if target.get("slowest_batch") is None:
        return ""
    parts = [f"batch {target['slowest_batch']}"]
    marking = target.get("slowest_batch_marking_ms")
    if marking is not None:
        parts.append(f"G1 marking ran {fmt_ms(marking)} of it")
    pause = target.get("slowest_batch_pause_ms")
    if pause is not None:
        parts.append(f"longest GC pause in it {fmt_ms(pause)}")
    commit = target.get("slowest_batch_commit_ms")
    if commit is not None:
        parts.append(f"its commit {fmt_ms(commit)}")
    phase = target.get("slowest_batch_phase")
    if phase is not None:
        parts.append(
            f"the part of the trigger it most exceeded: {phase} "
            f"{fmt_ms(target['slowest_batch_phase_ms'])} (a median batch "
            f"{fmt_ms(target['median_batch_phase_ms'])})"
        )
    # The /proc counts of the slowest batch (stop 44 on) and the machine probe's fixed work in it
    # (bench/_probe.py; stop 69 on: well above a median batch's, the CPU itself ran slower then),
    # each beside a median batch's.
    labels = (
        "{} minor page faults",
        "{} ms of the JVM's CPU",
        "{} ms stolen by the hypervisor",
        "the machine probe's fixed work {} us",
    )
    for key, what in zip(BATCH_COUNTS, labels, strict=True):
        value = target.get(f"slowest_batch_{key}")
        if value is not None:
            typical = target.get(f"median_batch_{key}")
            of = f" (a median batch {typical:,.0f})" if typical is not None else ""
            parts.append(what.format(f"{value:,.0f}") + of)
    detail = "; slowest: " + ", ".join(parts)
    others = target.get("others_max_over_median") or {}
    if others:
        each = ", ".join(
            f"{PROVIDERS[n].label} {r:.2f}x" for n, r in others.items() if n in PROVIDERS
        )
        detail += f"; the other providers' max over median: {each}"
    return detail


def fmt_ms_fine(value: float) -> str:
    return f"{value:,.1f} ms"


def fmt_bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:,.0f} B"


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


def print_comparison(
    title: str,
    metrics: Sequence[Metric],
    summaries: dict[str, dict[str, Any]],
    out: Any = sys.stdout,
) -> None:
    """Print one row per metric and one column per provider: the figure and its ratio to HDFS.

    ``summaries`` maps a provider name (a key of ``PROVIDERS``) to its figures.
    """
    names = list(summaries)
    base = summaries.get(BASELINE, {})
    cells: list[list[str]] = [["", *(PROVIDERS[n].label for n in names)]]
    for metric in metrics:
        row = [metric.label]
        for name in names:
            value = summaries[name].get(metric.key)
            if value is None:
                row.append("-")
                continue
            text = metric.fmt(value)
            r = ratio(value, base.get(metric.key))
            if r is not None and name != BASELINE:
                text += f" ({r:.2f}x)"
            row.append(text)
        cells.append(row)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    print(title, file=out)
    for i, row in enumerate(cells):
        line = "  ".join(
            cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j]) for j, cell in enumerate(row)
        )
        print(line.rstrip(), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)
    if BASELINE in summaries:
        print(f"(ratios are against {PROVIDERS[BASELINE].label})", file=out)


def host_info() -> dict[str, Any]:
    """The machine a report was measured on: architecture, cores, CPU model and memory."""
    import platform

    info: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_bytes"] = int(line.split()[1]) * 1024
                break
    except OSError:  # not Linux: the architecture and core count will do
        pass
    return info


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    return path
