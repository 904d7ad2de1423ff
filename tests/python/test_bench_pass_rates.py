"""``bench/pass_rates.py``: how often each target passed over many reports, from hand-written
reports: exact counts, shares and table text, no Spark."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import pass_rates  # bench/ is a folder of scripts, put on the path above

SPIKES = "max trigger <= 1.5x median (batch >= 2)"
RESTART = "restart: first batch <= 0.5x HDFS"


def _w1(
    spike: float, passed: bool, jar: str = "a" * 64, restart: float | None = None
) -> dict[str, Any]:
    """A W1 report with the spikes target at ``spike`` against a limit of 500, and the restart
    target measured (against 1,000) only when ``restart`` is given."""
    return {
        "benchmark": "W1",
        "size": "full",
        "heapstate_jar": {"path": "/x/heapstate.jar", "sha256": jar},
        "targets": [
            {"target": SPIKES, "value": spike, "limit": 500.0, "pass": passed},
            {
                "target": RESTART,
                "value": restart,
                "limit": None if restart is None else 1000.0,
                "pass": None if restart is None else restart <= 1000.0,
            },
        ],
    }


def test_rates_count_the_passes_and_spread_the_value_over_the_limit() -> None:
    reports = [_w1(400, True), _w1(550, False), _w1(450, True, restart=400.0)]
    assert pass_rates.rates(reports) == [
        {
            "target": SPIKES,
            "passed": 2,
            "measured": 3,
            "lowest": 0.8,
            "median": 0.9,
            "highest": 1.1,
        },
        # Measured in one run only: the other two count in neither column.
        {
            "target": RESTART,
            "passed": 1,
            "measured": 1,
            "lowest": 0.4,
            "median": 0.4,
            "highest": 0.4,
        },
    ]


def _write(tmp_path: Path, reports: list[dict[str, Any]]) -> list[str]:
    paths = []
    for i, report in enumerate(reports):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(report))
        paths.append(str(path))
    return paths


def test_the_tables_group_by_jar_and_say_what_was_not_measured(tmp_path: Path, capsys: Any) -> None:
    paths = _write(tmp_path, [_w1(400, True), _w1(550, False, jar="b" * 64), _w1(450, True)])
    assert pass_rates.main(["--by-jar", *paths]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "**W1 full, jar aaaaaaaaaa**, 2 runs",
        "",
        "| target | passed | value / limit: lowest | median | highest |",
        "|---|---|---|---|---|",
        f"| {SPIKES} | 2 of 2 | 0.80 | 0.85 | 0.90 |",
        f"| {RESTART} | not measured | | | |",
        "",
        "**W1 full, jar bbbbbbbbbb**, 1 run",
        "",
        "| target | passed | value / limit: lowest | median | highest |",
        "|---|---|---|---|---|",
        f"| {SPIKES} | 0 of 1 | 1.10 | 1.10 | 1.10 |",
        f"| {RESTART} | not measured | | | |",
    ]
    # Without --by-jar the three runs are one table.
    pass_rates.main(paths)
    assert f"| {SPIKES} | 2 of 3 | 0.80 | 0.90 | 1.10 |" in capsys.readouterr().out


def test_a_report_without_targets_is_refused_by_name(tmp_path: Path, capsys: Any) -> None:
    paths = _write(tmp_path, [_w1(400, True), {"benchmark": "W3", "results": []}])
    with pytest.raises(SystemExit):
        pass_rates.main(paths)
    assert f"{paths[1]}: a W3 report; only W1 and W5 set targets" in capsys.readouterr().err
    not_json = tmp_path / "broken.json"
    not_json.write_text("{")
    with pytest.raises(SystemExit, match="broken.json: not a readable JSON report"):
        pass_rates.main([str(not_json)])
