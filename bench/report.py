"""The README's performance tables, rendered from the newest full-size W1 and W5 reports.

``bin/perf-report`` runs the notebooks at full size and then this script, which rewrites the
part of the README between ``<!-- perf-tables:begin -->`` and ``<!-- perf-tables:end -->``::

    .venv/bin/python bench/report.py                        # print the block
    .venv/bin/python bench/report.py --readme README.md     # rewrite it in the README
    .venv/bin/python bench/report.py --w5 bench/results/w5-20261121-144231.json

By default the reports are the newest ``bench/results/w1-*.json`` of ``--size full`` and the
newest ``w5-*.json`` of ``--size full`` (by the timestamp inside them); ``--w1`` and ``--w5``
name others. The block holds: the machine (CPU model, cores, RAM, Java, Spark, the git commit),
W1's table with each figure's ratio to HDFS and heapstate's targets, the rows where heapstate is
not the lowest, W5's table and growth ratios, and links to the figures of ``--figures-dir``
(default ``docs/``) that exist. Every figure is lower-is-better; heapstate's cell is bold where it
is the lowest of its row.

The reports record the cores, Java, Spark and the commit, but not the CPU model or the RAM: those
are read from ``/proc`` on the machine running this script, which ``bin/perf-report`` runs on
the machine that just measured.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import (
    BASELINE,
    PROVIDERS,
    REPO_DIR,
    RESULTS_DIR,
    fmt_ms,
    fmt_ms_fine,
    read_report,
    slowest_batch_detail,
)

BEGIN = "<!-- perf-tables:begin -->"
END = "<!-- perf-tables:end -->"

LABELS = {
    "hdfs": "HDFS",
    "rocksdb-changelog": "RocksDB + changelog",
    "rocksdb": "RocksDB, no changelog",
    "heapstate": "heapstate",
}
"""Column headings, as the README writes the providers."""

NATIVE_MEMORY = {"rocksdb-changelog", "rocksdb"}
"""Providers whose state lives in native memory, which the memory figures do not count."""

FIGURES: dict[str, str] = {
    "w1_bytes_per_batch.png": "W1: checkpoint bytes added per batch",
    "w1_cumulative_bytes.png": "W1: cumulative checkpoint bytes",
    "w1_bytes_by_kind.png": "W1: checkpoint bytes by kind of file",
    "w1_latency.png": "W1: trigger and commit time per batch",
    "w1_memory.png": "W1: memory",
    "w5_growth.png": "W5: median trigger, commit and memory per key as K grows",
    "w4_rows_downstream.png": "W4: rows sent downstream, buffered against unbuffered",
    "w4_throughput.png": "W4: throughput, buffered against unbuffered",
    "w4_latency.png": "W4: latency added by the buffer",
}
"""The notebooks' figures, in the order the README shows them."""

Fmt = Callable[[float], str]


def fmt_bytes(value: float) -> str:
    """Bytes in B, KB, MB or GB (powers of 1000), to three significant figures or more."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(value) >= scale:
            scaled = value / scale
            decimals = 0 if abs(scaled) >= 100 else 1 if abs(scaled) >= 10 else 2
            return f"{scaled:,.{decimals}f} {unit}"
    return f"{value:,.0f} B"


def _fmt_count(value: float) -> str:
    return f"{value:,.0f} B"


W1_ROWS: list[tuple[str, str, Fmt]] = [
    ("trigger_ms_median", "median trigger, batches >= 2", fmt_ms),
    ("trigger_ms_max", "max trigger, batches >= 2", fmt_ms),
    ("commit_ms_median", "median commit, batches >= 2", fmt_ms),
    ("memory_used_bytes", "memoryUsedBytes", fmt_bytes),
    ("heap_retained_bytes", "heap after full GC", fmt_bytes),
    ("bytes_per_batch_median", "checkpoint bytes per batch, median", fmt_bytes),
    ("bytes_per_batch_max_updates", "checkpoint bytes per batch, max (batches >= 1)", fmt_bytes),
    ("state_bytes_total", "checkpoint bytes after {batches} batches", fmt_bytes),
    ("state_bytes_before_restart", "checkpoint bytes before the restart", fmt_bytes),
    ("restart_trigger_ms", "restart: first batch", fmt_ms),
    ("gc_pause_ms_max", "longest GC pause, batches >= 2", fmt_ms_fine),
    ("gc_marking_batches", "batches with G1 concurrent marking, batches >= 2", "{:,.0f}".format),
]
MEMORY_KEYS = {"memory_used_bytes", "heap_retained_bytes"}

W5_COLUMNS: list[tuple[str, str, Fmt]] = [
    ("trigger_ms_median", "median trigger", fmt_ms),
    ("commit_ms_median", "median commit", fmt_ms),
    ("memory_used_bytes", "memoryUsedBytes", fmt_bytes),
    ("memory_used_bytes_per_key", "per key", _fmt_count),
    ("gc_pause_ms_max", "longest GC pause", fmt_ms_fine),
]


# --------------------------------------------------------------------------------------------
# Finding the reports


def load(path: Path) -> dict[str, Any]:
    try:
        report = read_report(path)
    except ValueError as err:
        raise SystemExit(str(err)) from err
    if not isinstance(report, dict) or "benchmark" not in report:
        raise SystemExit(f"{path}: not a benchmark report (no 'benchmark' field)")
    return report


def newest(results_dir: Path, benchmark: str, size: str) -> Path | None:
    """The newest report (by its own timestamp) of ``benchmark`` at ``size``, if any, of the
    ``.json`` and ``.json.gz`` reports in ``results_dir``."""
    found: list[tuple[str, Path]] = []
    paths = [*results_dir.glob(f"{benchmark.lower()}-*.json")]
    paths += results_dir.glob(f"{benchmark.lower()}-*.json.gz")
    for path in paths:
        try:
            report = read_report(path)
        except ValueError:
            continue  # a report still being written, or not one
        if report.get("benchmark") == benchmark and report.get("size") == size:
            found.append((str(report.get("timestamp", "")), path))
    return max(found)[1] if found else None


# --------------------------------------------------------------------------------------------
# The machine


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 2**30
    except (OSError, ValueError, IndexError):
        return None
    return None


def machine_lines(report: dict[str, Any]) -> list[str]:
    """The machine and software of ``report``'s run, as Markdown bullet lines."""
    host = report.get("host") or {}
    env = report.get("environment") or {}
    git = report.get("git") or {}
    cpu = host.get("cpu_model") or cpu_model() or "unknown CPU"
    cores = host.get("cpus") or env.get("available_processors")
    ram = host.get("memory_bytes")
    ram_gib = ram / 2**30 if ram else memory_gib()
    commit = git.get("commit") or "unknown"
    dirty = " (with uncommitted changes)" if git.get("dirty") else ""
    return [
        f"- Machine: {cpu}, {cores} cores, "
        + (f"{ram_gib:.0f} GiB RAM" if ram_gib else "RAM unknown"),
        (
            f"- Java {env.get('java_version', '?')}, Spark {env.get('spark_version', '?')} "
            f"(pyspark), Python {env.get('python', '?')}"
        ),
        f"- heapstate at commit `{commit[:10]}`{dirty}",
    ]


# --------------------------------------------------------------------------------------------
# Tables


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return ""
    return f" ({value / base:.2f}x)"


def _providers(summary: dict[str, Any]) -> list[str]:
    return [p for p in PROVIDERS if p in summary]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _warmup(report: dict[str, Any]) -> str:
    """The heading's words for the warm-up batches each run's JVM ran first (``--warmup-batches``),
    or none: reports from before the option, and runs without a warm-up, say nothing."""
    n = report.get("warmup_batches") or 0
    if not n:
        return ""
    # Reports from stop 49 on (W1) and stop 51 on (W5) warm up on a data set of their own.
    data = ", on data of a tenth of the run's keys and updates" if report.get("warmup_data") else ""
    return f", {n} warm-up batches in each run's JVM first{data}"


def _lead_in(report: dict[str, Any]) -> str:
    """The heading's words for W1's lead-in before its restarts (``--restart-journals``), or none:
    reports from before stop 70, and runs without a lead-in, say nothing."""
    n = report.get("restart_journals") or 0
    if not n:
        return ""
    return f" after lead-in batches until a restart reads {n} journals in some store"


def _rounds(report: dict[str, Any]) -> str:
    """The heading's words for W5's ``--repeat``: nothing for one round (and older reports)."""
    n = report.get("repeat") or 1
    if n <= 1:
        return ""
    return f" of {n} rounds, each running every provider at every K once in a JVM of its own"


def w1_section(report: dict[str, Any], path: Path) -> list[str]:
    """W1's run description, table, heapstate's targets and where heapstate loses."""
    p = report["params"]
    summary = report["summary"]
    names = _providers(summary)
    base = summary.get(BASELINE, {})
    intervals = set((report.get("maintenance_interval") or {}).values())
    restart = {
        "fresh-process": "in a fresh JVM",
        "same-process": "in the same JVM",
        "none": "not run",
    }.get(str(report.get("restart_mode")), str(report.get("restart_mode")))
    lines = [
        (
            f"**W1, incremental checkpoint** (`bench/w1.py --size {report.get('size')}`, "
            f"`{path.name}`): K={p['keys']:,} keys, {p['payload']}-character payloads, "
            f"{p['updates']:,} keys updated per batch, {p['batches']} batches, "
            f"maintenance interval {', '.join(sorted(intervals)) or 'Spark default'}, "
            f"driver heap {report.get('driver_memory')}, restart {restart}{_lead_in(report)}"
            f"{_warmup(report)}. "
            "Ratios are against HDFS; every figure is lower-is-better."
        ),
        "",
    ]
    rows: list[list[str]] = []
    losses: list[str] = []
    for key, template, fmt in W1_ROWS:
        label = template.format(batches=p["batches"])
        values = {n: summary[n].get(key) for n in names}
        present = {n: v for n, v in values.items() if v is not None}
        if not present:
            continue
        lowest = min(present.values())
        row = [label]
        for n in names:
            v = values[n]
            if v is None:
                row.append("-")
                continue
            cell = fmt(v) + (_ratio(v, base.get(key)) if n != BASELINE else "")
            if key in MEMORY_KEYS and n in NATIVE_MEMORY:
                cell += "\\*"
            if n == "heapstate" and v == lowest:
                cell = f"**{cell}**"
            row.append(cell)
        rows.append(row)
        hs = values.get("heapstate")
        if hs is not None and hs > lowest:
            best = min(present, key=lambda n: present[n])
            losses.append(f"{label} ({LABELS[best]} {fmt(lowest)}, heapstate {fmt(hs)})")
    lines += _table(["figure", *(LABELS[n] for n in names)], rows)
    if NATIVE_MEMORY & set(names):
        lines += [
            "",
            "\\* RocksDB keeps its state in native memory, which neither memory figure counts.",
        ]
    targets = report.get("targets") or []
    if targets:
        lines += ["", "heapstate's W1 targets in this run:", ""]
        lines += [_target_line(t) for t in targets]
    if losses:
        lines += ["", "Where heapstate is not the lowest in this run: " + "; ".join(losses) + "."]
    return lines


_GROWTH_TARGET = re.compile(r"<= [\d.]+x K=")


def _target_line(target: dict[str, Any]) -> str:
    """One target of a report's ``targets``: verdict, name, figure and limit in its unit (bytes
    when the name says so, a ratio for W5's growth, else milliseconds)."""
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}[target.get("pass")]
    name, value, limit = str(target["target"]), target.get("value"), target.get("limit")
    fmt: Fmt = fmt_ms_fine
    if "bytes" in name.lower():
        fmt = fmt_bytes
    elif _GROWTH_TARGET.search(name):
        fmt = "{:.2f}x".format
    detail = f" ({fmt(value)} against {fmt(limit)})" if value is not None and limit else ""
    detail += slowest_batch_detail(target) + target.get("detail", "")
    return f"- {verdict}: {name}{detail}"


def _keys(k: int) -> str:
    return f"{k / 1e6:g}M" if k >= 1_000_000 else f"{k / 1e3:g}K" if k >= 1000 else str(k)


def w5_section(report: dict[str, Any], path: Path) -> list[str]:
    """W5's run description, the figures per provider and K, the growth and the targets."""
    p = report["params"]
    summary = report["summary"]
    names = _providers(summary)
    lines = [
        (
            f"**W5, growth** (`bench/w5.py --size {report.get('size')}`, `{path.name}`): W1 at "
            f"K = {', '.join(_keys(k) for k in p['keys'])} keys, {p['payload']}-character "
            f"payloads, {p['updates']:,} keys updated per batch, {p['batches']} batches, "
            f"driver heap {report.get('driver_memory')}, JVM options "
            f"{' '.join(f'`{o}`' for o in report.get('java_options') or []) or 'none'} "
            f"(for every provider){_warmup(report)}. Figures over batches 2 and later"
            f"{_rounds(report)}."
        ),
        "",
    ]
    rows: list[list[str]] = []
    for n in names:
        for k in sorted(summary[n], key=int):
            s = summary[n][k]
            row = [LABELS[n], _keys(int(k))]
            for key, _label, fmt in W5_COLUMNS:
                v = s.get(key)
                cell = "-" if v is None else fmt(v)
                if v is not None and key.startswith("memory") and n in NATIVE_MEMORY:
                    cell += "\\*"
                row.append(cell)
            rows.append(row)
    lines += _table(["provider", "K", *(label for _k, label, _f in W5_COLUMNS)], rows)
    growth = report.get("growth") or {}
    if growth:
        lines += ["", "Growth, the largest K over the one before it (1.00x is flat):", ""]
        grows: list[list[str]] = []
        for n in _providers(growth):
            g = growth[n]
            grows.append(
                [
                    LABELS[n],
                    f"{_keys(g['from_keys'])} to {_keys(g['to_keys'])}",
                    *(
                        f"{g[key]:.2f}x" if g.get(key) is not None else "-"
                        for key in ("trigger_ratio", "commit_ratio", "memory_per_key_ratio")
                    ),
                ]
            )
        lines += _table(
            ["provider", "K", "median trigger", "median commit", "memory per key"], grows
        )
    if NATIVE_MEMORY & set(names):
        lines += ["", "\\* RocksDB's native memory is not counted."]
    targets = report.get("targets") or []
    if targets:
        lines += ["", "heapstate's W5 targets in this run:", ""]
        lines += [_target_line(t) for t in targets]
    return lines


def figure_lines(figures_dir: Path, readme_dir: Path) -> list[str]:
    """Image links to the notebooks' figures that exist, relative to the README."""
    lines: list[str] = []
    for name, caption in FIGURES.items():
        path = figures_dir / name
        if path.is_file():
            try:
                link = path.resolve().relative_to(readme_dir.resolve())
            except ValueError:
                link = path.resolve()
            lines.append(f"![{caption}]({link.as_posix()})")
    return lines


def render(
    w1: tuple[dict[str, Any], Path] | None,
    w5: tuple[dict[str, Any], Path] | None,
    figures_dir: Path,
    readme_dir: Path,
) -> str:
    """The Markdown between the markers (without them)."""
    first = w1 or w5
    if first is None:
        raise SystemExit("no W1 or W5 report to render")
    lines = [
        (
            "Generated by `bin/perf-report` (`bench/report.py`) from the reports named below; the "
            "plots come from `notebooks/checkpoint_size_comparison.ipynb` and "
            "`notebooks/buffered_output.ipynb`. Measured on:"
        ),
        "",
        *machine_lines(first[0]),
        "",
    ]
    if w1 is not None:
        lines += [*w1_section(*w1), ""]
    if w5 is not None:
        lines += [*w5_section(*w5), ""]
    figures = figure_lines(figures_dir, readme_dir)
    if figures:
        lines += [*figures, ""]
    return "\n".join(_wrap(line) for line in lines).rstrip() + "\n"


def _wrap(line: str, width: int = 100) -> str:
    """A prose line or bullet folded at ``width``, as the README is; tables and images as they
    are."""
    if len(line) <= width or line.startswith(("|", "![")):
        return line
    indent = "  " if line.startswith("- ") else ""
    return textwrap.fill(
        line,
        width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def replace_block(text: str, block: str, where: str) -> str:
    """``text`` with everything between the markers replaced by ``block``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{where}: needs exactly one {BEGIN} and one {END} line")
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    if not head.endswith("\n"):
        raise SystemExit(f"{where}: {BEGIN} must start a line")
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--readme", type=Path, help="rewrite this file's block (else: print)")
    parser.add_argument("--w1", type=Path, help="the W1 report (default: the newest of --w1-size)")
    parser.add_argument("--w5", type=Path, help="the W5 report (default: the newest of --w5-size)")
    parser.add_argument("--w1-size", default="full", help="W1's --size (default: full)")
    parser.add_argument("--w5-size", default="full", help="W5's --size (default: full)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--figures-dir",
        type=Path,
        default=REPO_DIR / "docs",
        help="where the PNGs are (default: docs/)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    picked: dict[str, tuple[dict[str, Any], Path] | None] = {}
    for bench, explicit, size in (("W1", args.w1, args.w1_size), ("W5", args.w5, args.w5_size)):
        path = explicit or newest(args.results_dir, bench, size)
        if path is None:
            print(
                f"no {bench} report of --size {size} in {args.results_dir}; its table is left out",
                file=sys.stderr,
            )
            picked[bench] = None
            continue
        report = load(path)
        if report["benchmark"] != bench:
            raise SystemExit(f"{path}: a {report['benchmark']} report, not {bench}")
        print(f"{bench}: {path}", file=sys.stderr)
        picked[bench] = (report, path)
    readme_dir = args.readme.parent if args.readme else Path.cwd()
    block = render(picked["W1"], picked["W5"], args.figures_dir, readme_dir)
    if args.readme is None:
        sys.stdout.write(block)
        return 0
    text = args.readme.read_text()
    args.readme.write_text(replace_block(text, block, str(args.readme)))
    print(f"rewrote the performance tables in {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
