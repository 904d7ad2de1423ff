"""How often each of heapstate's targets passed, over many W1 or W5 reports.

One run of W1 or W5 passes or fails each target once; on a 2-core machine some targets land near
their limits and a run's verdict is partly chance. This script reads any number of reports and
gives, for each target, how many runs it passed and the spread of its figure as a share of its
limit (value / limit: at most 1.00 passes, for every target the benchmarks set)::

    .venv/bin/python bench/pass_rates.py bench/results/w1-20261126-08*.json
    .venv/bin/python bench/pass_rates.py bench/results/w5-*.json --by-jar

Reports are grouped by benchmark and ``--size`` and, with ``--by-jar``, by the sha256 of the heapstate jar they
measured (its first 10 hex digits name the group), so that an A/B of two jars (``--jar``) reads
as two tables. A target that a report could not measure (``n/a``: HDFS not in the run, say)
counts in neither column. The reports' own order does not matter. For W1, a second table applies
the spikes bar to every provider of the runs that measured more than one (``spike_rates``); for
W5, a second table splits the growth targets by where G1 marked back to back (``marking_rates``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import maximum, median
from report import load


def group_key(report: dict[str, Any], by_jar: bool) -> str:
    """The table a report goes to: its benchmark and size, and its jar's hash with ``by_jar``."""
    key = f"{report['benchmark']} {report.get('size', '')}".rstrip()
    if by_jar:
        sha = ((report.get("heapstate_jar") or {}).get("sha256") or "unknown")[:10]
        key += f", jar {sha}"
    return key


def rates(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target, in the order the first report lists them: runs passed, runs measured, and the
    lowest, median and highest value / limit over the measured runs."""
    order: list[str] = []
    shares: dict[str, list[float]] = {}
    passed: dict[str, int] = {}
    for report in reports:
        for target in report.get("targets") or []:
            name = str(target["target"])
            if name not in shares:
                order.append(name)
                shares[name], passed[name] = [], 0
            if target.get("pass") is None or not target.get("limit"):
                continue
            shares[name].append(float(target["value"]) / float(target["limit"]))
            passed[name] += bool(target["pass"])
    return [
        {
            "target": name,
            "passed": passed[name],
            "measured": len(shares[name]),
            "lowest": min(shares[name], default=None),
            "median": median(shares[name]),
            "highest": maximum(shares[name]),
        }
        for name in order
    ]


SPIKE_FACTOR = 1.5
"""W1's spikes bar: the slowest steady batch's trigger at most this many times the median."""


def spike_rates(reports: Sequence[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """W1's spikes bar applied to every provider, over the reports that measured more than one
    (the others' slowest batch over their median, from each report's summary): whether a
    failure is heapstate's or the machine's shows in how often the other providers, run in the
    same process tree, clear the same bar. The number of such reports, and rows as ``rates``, one
    per provider, in the order the first such report lists them (none without such a report)."""
    order: list[str] = []
    shares: dict[str, list[float]] = {}
    runs = 0
    for report in reports:
        if report.get("benchmark") != "W1":
            continue
        summary = report.get("summary") or {}
        measured = {
            name: s["trigger_ms_max"] / s["trigger_ms_median"]
            for name, s in summary.items()
            if isinstance(s, dict) and s.get("trigger_ms_max") and s.get("trigger_ms_median")
        }
        if len(measured) < 2:
            continue
        runs += 1
        for name, ratio in measured.items():
            if name not in shares:
                order.append(name)
                shares[name] = []
            shares[name].append(ratio / SPIKE_FACTOR)
    return runs, [
        {
            "target": name,
            "passed": sum(1 for v in shares[name] if v <= 1.0),
            "measured": len(shares[name]),
            "lowest": min(shares[name]),
            "median": median(shares[name]),
            "highest": maximum(shares[name]),
        }
        for name in order
    ]


MARKING_STORM_SHARE = 0.5
"""The share of heapstate's steady batches at one K that G1 marked beside, from which
``marking_rates`` counts that K's JVM as marking back to back: a cycle runs 140 to 250 ms at W5's
sizes, so a JVM marking beside half its batches or more is starting cycle after cycle
(``w5-stop72a`` and ``w5-stop73a``: 11 of 20 at 4M, each in one of their two rounds)."""

MARKING_CLASSES = ("at neither K", "at the smaller K only", "at the larger K only", "at both")


def marking_share(report: dict[str, Any], keys: str) -> float | None:
    """The share of heapstate's steady batches at ``keys`` (a key of its summary) that ran beside
    G1 marking, over every round (``gc_marking_batches`` over the rounds' steady batches), or None
    where the report does not say."""
    summary = ((report.get("summary") or {}).get("heapstate") or {}).get(keys) or {}
    marked = summary.get("gc_marking_batches")
    batches = (report.get("params") or {}).get("batches")
    steady_from = report.get("steady_from_batch")
    if marked is None or batches is None or steady_from is None or batches <= steady_from:
        return None
    return float(marked) / ((report.get("repeat") or 1) * (batches - steady_from))


def marking_rates(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """W5's growth targets split by where G1 marked back to back beside heapstate's steady batches
    (beside at least MARKING_STORM_SHARE of them at a K; ``marking_share``) at the two largest K:
    a JVM that marks cycle after cycle gives the tasks one core of two, so such marking at the
    larger K fails the growth targets and at the smaller K flatters them, whatever the store
    does. One row per class in MARKING_CLASSES that has runs: the runs, and for the trigger and
    the commit growth targets the runs passed; commit growth's lowest, median and highest ratio."""
    rows: dict[str, dict[str, Any]] = {}
    for report in reports:
        if report.get("benchmark") != "W5":
            continue
        growth = (report.get("growth") or {}).get("heapstate") or {}
        summary = (report.get("summary") or {}).get("heapstate") or {}
        sizes = sorted(summary, key=int)
        if len(sizes) < 2 or growth.get("commit_ratio") is None:
            continue
        low, high = marking_share(report, sizes[-2]), marking_share(report, sizes[-1])
        if low is None or high is None:
            continue
        verdicts = {}
        for target in report.get("targets") or []:
            name = str(target["target"])
            for kind in ("trigger", "commit"):
                if name.startswith(f"median {kind} at K=") and target.get("pass") is not None:
                    verdicts[kind] = bool(target["pass"])
        if len(verdicts) < 2:
            continue
        cls = MARKING_CLASSES[(low >= MARKING_STORM_SHARE) + 2 * (high >= MARKING_STORM_SHARE)]
        row = rows.setdefault(
            cls, {"class": cls, "runs": 0, "trigger": 0, "commit": 0, "ratios": []}
        )
        row["runs"] += 1
        row["trigger"] += verdicts["trigger"]
        row["commit"] += verdicts["commit"]
        row["ratios"].append(float(growth["commit_ratio"]))
    return [rows[c] for c in MARKING_CLASSES if c in rows]


def render_marking(title: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """A Markdown table of ``marking_rates``' rows."""
    runs = sum(r["runs"] for r in rows)
    lines = [
        (
            f"**{title}, the growth targets by where G1 marked beside at least "
            f"{MARKING_STORM_SHARE:.0%} of heapstate's steady batches**, "
            f"{runs} run{'' if runs == 1 else 's'}"
        ),
        "",
        (
            "| marking | runs | trigger growth passed | commit growth passed "
            "| commit growth: lowest | median | highest |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratios = r["ratios"]
        lines.append(
            f"| {r['class']} | {r['runs']} | {r['trigger']} | {r['commit']} | {min(ratios):.2f}x | "
            f"{median(ratios):.2f}x | {maximum(ratios):.2f}x |"
        )
    return lines


def render(title: str, runs: int, rows: Sequence[dict[str, Any]]) -> list[str]:
    """A Markdown table of ``rows`` (see ``rates``) under a line naming the group and its runs."""

    def share(v: float | None) -> str:
        return "" if v is None else f"{v:.2f}"

    lines = [
        f"**{title}**, {runs} run{'' if runs == 1 else 's'}",
        "",
        "| target | passed | value / limit: lowest | median | highest |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["measured"]:
            lines.append(f"| {r['target']} | not measured | | | |")
            continue
        lines.append(
            f"| {r['target']} | {r['passed']} of {r['measured']} | {share(r['lowest'])} | "
            f"{share(r['median'])} | {share(r['highest'])} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="W1 or W5 JSON reports")
    parser.add_argument(
        "--by-jar", action="store_true", help="one table per heapstate jar (by its sha256)"
    )
    args = parser.parse_args(argv)
    groups: dict[str, list[dict[str, Any]]] = {}
    for path in args.reports:
        report = load(path)
        if report["benchmark"] not in ("W1", "W5"):
            parser.error(f"{path}: a {report['benchmark']} report; only W1 and W5 set targets")
        groups.setdefault(group_key(report, args.by_jar), []).append(report)
    out: list[str] = []
    for title in sorted(groups):
        out += [*render(title, len(groups[title]), rates(groups[title])), ""]
        runs, spikes = spike_rates(groups[title])
        if spikes:
            lines = render(
                f"{title}, the spikes bar for every provider in runs of more than one", runs, spikes
            )
            out += [lines[0], "", "| provider" + lines[2][len("| target") :], *lines[3:], ""]
        marking = marking_rates(groups[title])
        if marking:
            out += [*render_marking(title, marking), ""]
    print("\n".join(out).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
