"""``bench/pass_rates.py``: how often each target passed over many reports, from hand-written
reports: exact counts, shares and table text, no Spark."""

from __future__ import annotations

import gzip
import json
import sys
import zlib
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


def test_gzipped_reports_are_read_and_a_cut_one_is_refused_by_name(
    tmp_path: Path, capsys: Any
) -> None:
    """The reports kept in bench/evidence/ are gzipped: they count as the same report would."""
    plain = _write(tmp_path, [_w1(400, True), _w1(550, False)])
    zipped = []
    for path in plain:
        target = Path(path + ".gz")
        target.write_bytes(gzip.compress(Path(path).read_bytes()))
        zipped.append(str(target))
    pass_rates.main(plain)
    from_plain = capsys.readouterr().out
    pass_rates.main(zipped)
    assert capsys.readouterr().out == from_plain
    assert f"| {SPIKES} | 1 of 2 | 0.80 | 0.95 | 1.10 |" in from_plain

    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(Path(zipped[0]).read_bytes()[:-12])
    with pytest.raises(SystemExit, match=r"cut\.json\.gz: not a readable JSON report"):
        pass_rates.main([str(cut)])
    not_gzip = tmp_path / "plain.json.gz"
    not_gzip.write_bytes(Path(plain[0]).read_bytes())
    with pytest.raises(SystemExit, match=r"plain\.json\.gz: not a readable JSON report"):
        pass_rates.main([str(not_gzip)])

    # One byte changed inside the compressed data: zlib's own error for some bytes (the case
    # checked to be among them), a checksum's or the stream's end for others; each is refused.
    good = Path(zipped[0]).read_bytes()
    zlib_errors = 0
    for at in range(10, len(good) - 8):
        changed = good[:at] + bytes([good[at] ^ 0x5A]) + good[at + 1 :]
        try:
            gzip.decompress(changed)
        except zlib.error:
            zlib_errors += 1
        except (OSError, EOFError):
            pass
        else:
            continue  # still a valid stream (the change hit nothing that is checked)
        flipped = tmp_path / f"flipped-{at}.json.gz"
        flipped.write_bytes(changed)
        with pytest.raises(SystemExit, match=rf"flipped-{at}\.json\.gz: not a readable JSON"):
            pass_rates.main([str(flipped)])
    assert zlib_errors > 0


def _summary(**ratios: tuple[float, float]) -> dict[str, Any]:
    """A W1 report's summary: each provider's slowest and median steady trigger."""
    return {
        name: {"trigger_ms_max": mx, "trigger_ms_median": md} for name, (mx, md) in ratios.items()
    }


def test_the_spikes_bar_is_applied_to_every_provider_of_runs_of_more_than_one(
    tmp_path: Path, capsys: Any
) -> None:
    both = {**_w1(400, True), "summary": _summary(hdfs=(1200, 1000), heapstate=(300, 250))}
    four = {
        **_w1(550, False),
        "summary": _summary(
            hdfs=(1800, 1000), **{"rocksdb-changelog": (600, 500)}, heapstate=(420, 250)
        ),
    }
    alone = {**_w1(450, True), "summary": _summary(heapstate=(500, 250))}  # heapstate only
    older = _w1(450, True)  # no summary
    runs, rows = pass_rates.spike_rates([both, four, alone, older])
    assert runs == 2
    assert [(r["target"], r["passed"], r["measured"]) for r in rows] == [
        ("hdfs", 1, 2),  # 1.2x passes, 1.8x does not
        ("heapstate", 1, 2),  # 1.2x passes, 1.68x does not; the run alone is not counted
        ("rocksdb-changelog", 1, 1),
    ]
    assert rows[0]["lowest"] == pytest.approx(1.2 / 1.5)
    assert rows[0]["highest"] == pytest.approx(1.8 / 1.5)
    assert pass_rates.spike_rates([alone, older]) == (0, [])
    # Runs that share no provider are each counted: two runs, whatever each measured.
    other = {
        **_w1(450, True),
        "summary": _summary(rocksdb=(700, 500), **{"rocksdb-changelog": (600, 500)}),
    }
    assert pass_rates.spike_rates([both, other])[0] == 2

    pass_rates.main(_write(tmp_path, [both, four, alone]))
    out = capsys.readouterr().out.splitlines()
    at = out.index(
        "**W1 full, the spikes bar for every provider in runs of more than one**, 2 runs"
    )
    assert out[at + 1 : at + 6] == [
        "",
        "| provider | passed | value / limit: lowest | median | highest |",
        "|---|---|---|---|---|",
        "| hdfs | 1 of 2 | 0.80 | 1.00 | 1.20 |",
        "| heapstate | 1 of 2 | 0.80 | 0.96 | 1.12 |",
    ]
    # Reports without a second provider print no such table.
    pass_rates.main(_write(tmp_path, [alone]))
    assert "spikes bar for every provider" not in capsys.readouterr().out


TRIGGER_GROWTH = "median trigger at K=4,000,000 <= 1.2x K=1,000,000"
COMMIT_GROWTH = "median commit at K=4,000,000 <= 1.2x K=1,000,000"


def _w5(
    marked_1m: int | None, marked_4m: int, trigger: float, commit: float, repeat: int = 1
) -> dict[str, Any]:
    """A W5 report with heapstate's growth ratios and how many of its steady batches at 1M and 4M
    ran beside G1 marking (``marked_1m`` None: a report that did not record it); 12 batches a
    round, steady from batch 2, so ten steady batches a round."""
    at_1m: dict[str, Any] = {"trigger_ms_median": 250.0}
    if marked_1m is not None:
        at_1m["gc_marking_batches"] = marked_1m
    return {
        "benchmark": "W5",
        "size": "full",
        "params": {"keys": [100000, 1000000, 4000000], "batches": 12},
        "steady_from_batch": 2,
        "repeat": repeat,
        "summary": {
            "heapstate": {
                "100000": {"gc_marking_batches": 10},
                "1000000": at_1m,
                "4000000": {"gc_marking_batches": marked_4m},
            },
            "hdfs": {"1000000": {"gc_marking_batches": 10}, "4000000": {"gc_marking_batches": 0}},
        },
        "growth": {"heapstate": {"trigger_ratio": trigger, "commit_ratio": commit}},
        "targets": [
            {"target": TRIGGER_GROWTH, "value": trigger, "limit": 1.2, "pass": trigger <= 1.2},
            {"target": COMMIT_GROWTH, "value": commit, "limit": 1.2, "pass": commit <= 1.2},
            {
                "target": "longest GC pause at K=4,000,000 < 50 ms",
                "value": 9.0,
                "limit": 50.0,
                "pass": True,
            },
        ],
    }


def test_marking_rates_split_the_growth_targets_by_where_g1_marked_back_to_back() -> None:
    reports = [
        _w5(3, 11, 1.25, 1.28, repeat=2),  # w5-stop73a: 11 of 20 at 4M, both fail
        _w5(0, 11, 1.10, 1.16, repeat=2),  # w5-stop72a: 11 of 20 at 4M, both pass
        _w5(10, 1, 0.81, 0.53),  # w5-hs68-2: at 1M only
        _w5(9, 4, 1.02, 1.89, repeat=2),  # 9 of 20 and 4 of 20: under half at both, neither
        _w5(0, 0, 0.95, 0.95),  # 10 of 10 at 100K does not count: only the two largest K do
        _w5(5, 5, 1.0, 1.0),  # half of ten at both: at the bar, so at both
        _w5(None, 10, 1.5, 1.5),  # the smaller K's marking not recorded: left out
        {"benchmark": "W1", "size": "full", "targets": []},
    ]

    rows = pass_rates.marking_rates(reports)

    assert [(r["class"], r["runs"], r["trigger"], r["commit"], r["ratios"]) for r in rows] == [
        ("at neither K", 2, 2, 1, [1.89, 0.95]),
        ("at the smaller K only", 1, 1, 1, [0.53]),
        ("at the larger K only", 2, 1, 1, [1.28, 1.16]),
        ("at both", 1, 1, 1, [1.0]),
    ]
    assert pass_rates.render_marking("W5 full", rows) == [
        (
            "**W5 full, the growth targets by where G1 marked beside at least 50% of heapstate's "
            "steady batches**, 6 runs"
        ),
        "",
        (
            "| marking | runs | trigger growth passed | commit growth passed "
            "| commit growth: lowest | median | highest |"
        ),
        "|---|---|---|---|---|---|---|",
        "| at neither K | 2 | 2 | 1 | 0.95x | 1.42x | 1.89x |",
        "| at the smaller K only | 1 | 1 | 1 | 0.53x | 0.53x | 0.53x |",
        "| at the larger K only | 2 | 1 | 1 | 1.16x | 1.22x | 1.28x |",
        "| at both | 1 | 1 | 1 | 1.00x | 1.00x | 1.00x |",
    ]


def test_main_prints_the_marking_table_under_w5s_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w5.json"
    path.write_text(json.dumps(_w5(3, 11, 1.25, 1.28, repeat=2)))

    assert pass_rates.main([str(path)]) == 0

    out = capsys.readouterr().out
    assert out.index("| median commit at K=4,000,000") < out.index("**W5 full, the growth targets")
    assert "| at the larger K only | 1 | 0 | 0 | 1.28x | 1.28x | 1.28x |" in out
