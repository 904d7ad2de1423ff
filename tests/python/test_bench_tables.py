"""The benchmarks' results table rows (``bench/results_table.py``) and the README's performance
tables (``bench/report.py``), from small hand-written reports, and the checks in ``bench/_common.py``
that keep a stale jar or a skipped full GC out of the figures: no Spark, exact figures."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common  # bench/ is a folder of scripts, put on the path above
import report
import results_table
from _common import pyspark_submit_args

W1: dict[str, Any] = {
    "benchmark": "W1",
    "timestamp": "20260101-120000",
    "size": "small",
    "params": {"keys": 100, "payload": 8, "updates": 10, "batches": 2, "seed": 1},
    "git": {"commit": "0123456789abcdef", "dirty": False},
    "environment": {"spark_version": "4.2.0", "java_version": "17.0.15", "python": "3.11.7"},
    "host": {"machine": "x86_64", "cpus": 2, "cpu_model": "Test CPU", "memory_bytes": 8 * 2**30},
    "maintenance_interval": {"hdfs": "5s", "heapstate": "5s"},
    "restart_mode": "same-process",
    "driver_memory": "1g",
    "summary": {
        "hdfs": {"trigger_ms_median": 100.0, "memory_used_bytes": 2_000_000, "gc_pauses": None},
        "heapstate": {"trigger_ms_median": 50.0, "memory_used_bytes": 3_000_000},
    },
    "runs": {
        "hdfs": {
            "batches": [
                {
                    "batch": 0,
                    "trigger_ms": 900,
                    "commit_ms": None,
                    "state_bytes_total_by_kind": {"journal": 10, "snapshot": 0},
                    "duration_ms": {"addBatch": 5},
                    "custom_metrics": {},
                }
            ],
            "restart": {"batch": 2, "trigger_ms": 70, "mode": "same-process"},
            "heap_after": {"used": 5},
            "gc_pauses": [{"end_epoch_ms": 1, "kind": "Pause Young", "pause_ms": 2.0}],
        }
    },
    "targets": [
        {
            "target": "memoryUsedBytes <= HDFS",
            "value": 3_000_000,
            "limit": 2_000_000.0,
            "pass": False,
        }
    ],
}


def figures(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """The rows' figures, each with its scale point: (scope, provider, keys, cardinality, mode,
    writes_per_key, batch, metric, value). The rows of one report are all different."""
    keys = ("scope", "provider", "keys", "cardinality", "mode", "writes_per_key", "batch")
    found = [(*(r[k] for k in keys), r["metric"], r["value"]) for r in rows]
    assert len(set(found)) == len(found), "a figure appears twice"
    return set(found)


def test_w1_rows() -> None:
    rows = results_table.rows_from_report(W1, Path("w1-20260101-120000.json"))
    assert {tuple(r) for r in rows} == {results_table.COLUMNS}
    assert {
        (r["run_id"], r["benchmark"], r["timestamp"], r["size"], r["git_commit"], r["git_dirty"])
        for r in rows
    } == {
        (
            "w1-20260101-120000",
            "W1",
            dt.datetime(2026, 1, 1, 12),
            "small",
            W1["git"]["commit"],
            False,
        )
    }
    assert {r["spark_version"] for r in rows} == {"4.2.0"}
    assert {r["round"] for r in rows} == {1}  # a report of one round
    assert figures(rows) == {
        ("summary", "hdfs", 100, None, None, None, None, "trigger_ms_median", 100.0),
        ("summary", "hdfs", 100, None, None, None, None, "memory_used_bytes", 2e6),
        ("summary", "heapstate", 100, None, None, None, None, "trigger_ms_median", 50.0),
        ("summary", "heapstate", 100, None, None, None, None, "memory_used_bytes", 3e6),
        ("batch", "hdfs", 100, None, None, None, 0, "trigger_ms", 900.0),
        ("batch", "hdfs", 100, None, None, None, 0, "state_bytes_total_by_kind.journal", 10.0),
        ("batch", "hdfs", 100, None, None, None, 0, "state_bytes_total_by_kind.snapshot", 0.0),
        ("batch", "hdfs", 100, None, None, None, 0, "duration_ms.addBatch", 5.0),
        ("restart", "hdfs", 100, None, None, None, 2, "trigger_ms", 70.0),
        ("summary", "hdfs", 100, None, None, None, None, "heap_after.used", 5.0),
    }


def test_w2_w3_rows_take_the_timestamp_from_the_file_name() -> None:
    w2 = {
        "benchmark": "W2",
        "size": "small",
        "keys": 1000,
        "spark": "4.3.0",
        "results": [{"provider": "heapstate", "m": 10, "version_bytes": 1761}],
    }
    w3 = {
        "benchmark": "W3",
        "spark": "4.3.0",
        "results": [{"provider": "hdfs", "keys": 10_000, "get_ops_per_ms": 3321.5}],
    }
    rows2 = results_table.rows_from_report(w2, Path("results/w2-20261121-144633.json"))
    rows3 = results_table.rows_from_report(w3, Path("w3-20261121-144826.json"))
    assert [(r["run_id"], r["spark_version"], r["git_commit"]) for r in rows2 + rows3] == [
        ("w2-20261121-144633", "4.3.0", None),
        ("w3-20261121-144826", "4.3.0", None),
    ]
    assert figures(rows2) == {
        ("result", "heapstate", 1000, None, None, 10, None, "version_bytes", 1761.0)
    }
    assert figures(rows3) == {
        ("result", "hdfs", 10_000, None, None, None, None, "get_ops_per_ms", 3321.5)
    }
    assert {r["round"] for r in rows2 + rows3} == {1}
    # W3's --rounds 3: each result is a median over the rounds, so of no one round.
    pooled = results_table.rows_from_report({**w3, "rounds": 3}, Path("w3-20261121-144826.json"))
    assert [(r["metric"], r["round"]) for r in pooled] == [("get_ops_per_ms", None)]
    with pytest.raises(ValueError, match="no 'timestamp' and its name holds none"):
        results_table.rows_from_report(w3, Path("w3.json"))


def test_w4_w5_rows() -> None:
    w4 = {
        "benchmark": "W4",
        "timestamp": "20261121-145515",
        "results": [
            {
                "cardinality": 20,
                "mode": "unbuffered",
                "provider": None,
                "provider_label": "unbuffered",
                "rows_downstream": 120,
                "matches_unbuffered": None,
                "mismatches": [],
                "batches": [{"batch": 0, "rows_merged": 20, "merged": True}],
            },
            {
                "cardinality": 20,
                "mode": "buffered",
                "provider": "heapstate",
                "rows_downstream": 40,
                "matches_unbuffered": True,
                "batches": [],
            },
        ],
    }
    assert figures(results_table.rows_from_report(w4, Path("w4.json"))) == {
        ("result", None, None, 20, "unbuffered", None, None, "rows_downstream", 120.0),
        ("batch", None, None, 20, "unbuffered", None, 0, "rows_merged", 20.0),
        ("batch", None, None, 20, "unbuffered", None, 0, "merged", 1.0),
        ("result", "heapstate", None, 20, "buffered", None, None, "rows_downstream", 40.0),
        ("result", "heapstate", None, 20, "buffered", None, None, "matches_unbuffered", 1.0),
    }
    w5 = {
        "benchmark": "W5",
        "timestamp": "20261121-144231",
        "summary": {"hdfs": {"5000": {"keys": 5000, "trigger_ms_median": 698.0}}},
        "runs": {"hdfs@5000": {"batches": [{"batch": 3, "commit_ms": 228}]}},
        "growth": {"hdfs": {"from_keys": 5000, "to_keys": 10000, "trigger_ratio": 0.87}},
    }
    w5_rows = results_table.rows_from_report(w5, Path("w5.json"))
    assert {r["round"] for r in w5_rows} == {1}  # a report from before --repeat
    assert figures(w5_rows) == {
        ("summary", "hdfs", 5000, None, None, None, None, "trigger_ms_median", 698.0),
        ("batch", "hdfs", 5000, None, None, None, 3, "commit_ms", 228.0),
        ("growth", "hdfs", 10000, None, None, None, None, "from_keys", 5000.0),
        ("growth", "hdfs", 10000, None, None, None, None, "trigger_ratio", 0.87),
    }


def _w5_rounds_report(with_round: bool) -> dict[str, Any]:
    """A W5 report of ``--repeat 3``: hdfs@5000 ran three rounds; hdfs@10000 failed in rounds 1
    and 2. Each later run carries its ``round`` unless ``with_round`` is false, as in reports
    written before it did."""

    def later(r: int, batches: list[dict[str, Any]]) -> dict[str, Any]:
        return {"batches": batches, **({"round": r} if with_round else {})}

    return {
        "benchmark": "W5",
        "timestamp": "20261130-101500",
        "repeat": 3,
        "summary": {"hdfs": {"5000": {"keys": 5000, "rounds": 3, "commit_ms_median": 21.0}}},
        "runs": {
            "hdfs@5000": {"batches": [{"batch": 2, "commit_ms": 10}], "heap_after": {"used": 7}}
        },
        "repeat_runs": {
            "hdfs@5000": [
                later(2, [{"batch": 2, "commit_ms": 20}]),
                later(3, [{"batch": 2, "commit_ms": 30}]),
            ],
            "hdfs@10000": [later(3, [{"batch": 2, "commit_ms": 40}])],
        },
        "growth": {},
        "failures": {"hdfs@10000": "exit 1", "hdfs@10000#2": "exit 1"},
    }


@pytest.mark.parametrize("with_round", [True, False])
def test_w5_rows_keep_every_rounds_batches_with_their_round(with_round: bool) -> None:
    """A run's rows carry the round they were measured in; the summary, which pools the rounds,
    has none. Without the runs' own ``round``, the rounds ``failures`` names are skipped."""
    rows = results_table.rows_from_report(_w5_rounds_report(with_round), Path("w5.json"))
    found = {(r["scope"], r["keys"], r["batch"], r["round"], r["metric"], r["value"]) for r in rows}
    assert len(found) == len(rows)
    assert found == {
        ("summary", 5000, None, None, "rounds", 3.0),
        ("summary", 5000, None, None, "commit_ms_median", 21.0),
        ("batch", 5000, 2, 1, "commit_ms", 10.0),
        ("summary", 5000, None, 1, "heap_after.used", 7.0),
        ("batch", 5000, 2, 2, "commit_ms", 20.0),
        ("batch", 5000, 2, 3, "commit_ms", 30.0),
        ("batch", 10000, 2, 3, "commit_ms", 40.0),
    }
    assert {r["provider"] for r in rows} == {"hdfs"}


@pytest.mark.parametrize("with_round", [True, False])
def test_cpu_by_batch_cuts_at_the_batches_of_the_chosen_round(
    tmp_path: Path, with_round: bool
) -> None:
    """A recording is of one worker JVM, which ran one round of a run: ``--round`` picks it, and
    a round that the run does not have is named with those it has."""
    import cpu_by_batch

    path = tmp_path / "w5.json"
    path.write_text(json.dumps(_w5_rounds_report(with_round)))
    assert cpu_by_batch.run_batches(path, "hdfs@5000") == [{"batch": 2, "commit_ms": 10}]
    assert cpu_by_batch.run_batches(path, "hdfs@5000", in_round=1) == [
        {"batch": 2, "commit_ms": 10}
    ]
    assert cpu_by_batch.run_batches(path, "hdfs@5000", in_round=3) == [
        {"batch": 2, "commit_ms": 30}
    ]
    assert cpu_by_batch.run_batches(path, "hdfs@10000", in_round=3) == [
        {"batch": 2, "commit_ms": 40}
    ]
    with pytest.raises(SystemExit) as missing:
        cpu_by_batch.run_batches(path, "hdfs@5000", in_round=4)
    assert str(missing.value) == f"run 'hdfs@5000' of {path} has no round 4; its rounds: 1, 2, 3"
    with pytest.raises(SystemExit) as failed:
        cpu_by_batch.run_batches(path, "hdfs@10000")
    assert str(failed.value) == f"run 'hdfs@10000' of {path} has no round 1; its rounds: 3"
    with pytest.raises(SystemExit, match=r"no run 'hdfs@5000#2'.*: hdfs@10000, hdfs@5000$"):
        cpu_by_batch.run_batches(path, "hdfs@5000#2")


def test_cpu_by_batch_report_cuts_at_the_round_its_command_line_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``report --round`` reaches the batches it names: a round the run lacks is refused before
    the recording is read (any file stands in for the JDK's jfr tool and the recording)."""
    import cpu_by_batch

    path = tmp_path / "w5.json"
    path.write_text(json.dumps(_w5_rounds_report(True)))
    recording = tmp_path / "worker.jfr"
    recording.write_bytes(b"")
    monkeypatch.setattr(cpu_by_batch.shutil, "which", lambda _: sys.executable)
    args = ["report", "--recording", str(recording), "--report", str(path), "--run", "hdfs@10000"]
    with pytest.raises(SystemExit) as missing:
        cpu_by_batch.main([*args, "--round", "2"])
    assert str(missing.value) == f"run 'hdfs@10000' of {path} has no round 2; its rounds: 3"
    with pytest.raises(SystemExit) as default:
        cpu_by_batch.main(args)
    assert str(default.value) == f"run 'hdfs@10000' of {path} has no round 1; its rounds: 3"


def test_unknown_benchmark_is_refused() -> None:
    with pytest.raises(ValueError, match=r"x\.json: 'benchmark' is 'W9'; expected one of W1"):
        results_table.rows_from_report({"benchmark": "W9"}, Path("x.json"))


def test_w1_section() -> None:
    assert report.w1_section(W1, Path("w1-20260101-120000.json")) == [
        (
            "**W1, incremental checkpoint** (`bench/w1.py --size small`, "
            "`w1-20260101-120000.json`): K=100 keys, 8-character payloads, 10 keys updated per "
            "batch, 2 batches, maintenance interval 5s, driver heap 1g, restart in the same JVM. "
            "Ratios are against HDFS; every figure is lower-is-better."
        ),
        "",
        "| figure | HDFS | heapstate |",
        "|---|---|---|",
        "| median trigger, batches >= 2 | 100 ms | **50 ms (0.50x)** |",
        "| memoryUsedBytes | 2.00 MB | 3.00 MB (1.50x) |",
        "",
        "heapstate's W1 targets in this run:",
        "",
        "- FAIL: memoryUsedBytes <= HDFS (3.00 MB against 2.00 MB)",
        "",
        (
            "Where heapstate is not the lowest in this run: memoryUsedBytes (HDFS 2.00 MB, "
            "heapstate 3.00 MB)."
        ),
    ]


def test_render_and_replace_block(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "w1_latency.png").write_bytes(b"")
    block = report.render((W1, Path("w1.json")), None, tmp_path / "docs", tmp_path)
    lines = block.splitlines()
    machine = lines.index("- Machine: Test CPU, 2 cores, 8 GiB RAM")
    assert lines[machine : machine + 4] == [
        "- Machine: Test CPU, 2 cores, 8 GiB RAM",
        "- Java 17.0.15, Spark 4.2.0 (pyspark), Python 3.11.7",
        "- heapstate at commit `0123456789`",
        "",
    ]
    assert lines[-1] == "![W1: trigger and commit time per batch](docs/w1_latency.png)"
    assert max(len(line) for line in lines if not line.startswith("|")) <= 100
    readme = f"# x\n\ntext\n{report.BEGIN}\nold table\n{report.END}\nmore\n"
    once = report.replace_block(readme, block, "README.md")
    assert once == f"# x\n\ntext\n{report.BEGIN}\n{block}{report.END}\nmore\n"
    assert report.replace_block(once, block, "README.md") == once
    with pytest.raises(SystemExit, match="README.md: needs exactly one"):
        report.replace_block("no markers", block, "README.md")


def test_the_results_table_reads_a_gzipped_report_and_names_a_damaged_one(tmp_path: Path) -> None:
    zipped = tmp_path / "w1-20260101-120000.json.gz"
    zipped.write_bytes(gzip.compress(json.dumps(W1).encode()))
    assert results_table.load_report(zipped) == W1
    # The same rows, but for the ``source`` column, which names the file.
    from_zipped = results_table.rows_from_report(results_table.load_report(zipped), zipped)
    from_plain = results_table.rows_from_report(W1, Path("w1-20260101-120000.json"))
    assert {row["source"] for row in from_zipped} == {str(zipped)}
    assert [{**row, "source": None} for row in from_zipped] == [
        {**row, "source": None} for row in from_plain
    ]
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(zipped.read_bytes()[:-12])
    with pytest.raises(ValueError, match=r"cut\.json\.gz: not a readable JSON report"):
        results_table.load_report(cut)


def test_newest_picks_by_size_and_timestamp(tmp_path: Path) -> None:
    for name, size, stamp in (
        ("w1-a.json", "default", "20260101-000000"),
        ("w1-b.json", "default", "20260102-000000"),
        ("w1-c.json", "small", "20260103-000000"),
    ):
        (tmp_path / name).write_text(
            f'{{"benchmark": "W1", "size": "{size}", "timestamp": "{stamp}"}}'
        )
    (tmp_path / "w1-partial.json").write_text('{"benchmark": "W1", "si')
    assert report.newest(tmp_path, "W1", "default") == tmp_path / "w1-b.json"
    assert report.newest(tmp_path, "W1", "small") == tmp_path / "w1-c.json"
    assert report.newest(tmp_path, "W5", "full") is None
    # A gzipped report (bench/evidence/'s) counts as the same report would; a damaged one is
    # passed over as a partial one is.
    (tmp_path / "w1-d.json.gz").write_bytes(
        gzip.compress(b'{"benchmark": "W1", "size": "small", "timestamp": "20260104-000000"}')
    )
    (tmp_path / "w1-e.json.gz").write_bytes(b"not gzip")
    assert report.newest(tmp_path, "W1", "small") == tmp_path / "w1-d.json.gz"
    assert report.newest(tmp_path, "W1", "default") == tmp_path / "w1-b.json"


def test_w5_heading_names_the_jvm_options() -> None:
    w5: dict[str, Any] = {
        "benchmark": "W5",
        "size": "full",
        "params": {"keys": [1000, 4000], "payload": 64, "updates": 10, "batches": 3},
        "driver_memory": "12g",
        "summary": {},
    }
    path = Path("w5.json")
    before = "driver heap 12g, JVM options none (for every provider)."
    assert before in report.w5_section(w5, path)[0]  # a report from before they were recorded
    w5["java_options"] = ["-XX:+AlwaysPreTouch"]
    after = "driver heap 12g, JVM options `-XX:+AlwaysPreTouch` (for every provider)."
    assert after in report.w5_section(w5, path)[0]
    w5["warmup_batches"] = 30
    warm = (
        "JVM options `-XX:+AlwaysPreTouch` (for every provider), 30 warm-up batches in each "
        "run's JVM first. Figures"
    )
    assert warm in report.w5_section(w5, path)[0]
    w5["warmup_data"] = {"1000": {"keys": 100, "updates": 1}, "4000": {"keys": 400, "updates": 1}}
    tenth = (
        "30 warm-up batches in each run's JVM first, on data of a tenth of the run's keys and "
        "updates. Figures"
    )
    assert tenth in report.w5_section(w5, path)[0]
    w5["repeat"] = 1
    assert report.w5_section(w5, path)[0].endswith("updates. Figures over batches 2 and later.")
    w5["repeat"] = 3
    rounds = (
        "Figures over batches 2 and later of 3 rounds, each running every provider at every K "
        "once in a JVM of its own."
    )
    assert rounds in report.w5_section(w5, path)[0]


def test_w1_heading_names_the_warmup() -> None:
    warm = {**W1, "warmup_batches": 30}
    heading = report.w1_section(warm, Path("w1.json"))[0]
    assert heading.endswith(
        "driver heap 1g, restart in the same JVM, 30 warm-up batches in each run's JVM first. "
        "Ratios are against HDFS; every figure is lower-is-better."
    )
    tenth = report.w1_section({**warm, "warmup_data": {"keys": 100, "updates": 1}}, Path("w"))[0]
    assert tenth.endswith(
        "30 warm-up batches in each run's JVM first, on data of a tenth of the run's keys and "
        "updates. Ratios are against HDFS; every figure is lower-is-better."
    )
    assert (
        report.w1_section({**W1, "warmup_batches": 0}, Path("w1.json"))[0]
        == (report.w1_section(W1, Path("w1.json"))[0])
    )


def test_w1_heading_names_the_lead_in_before_the_restart() -> None:
    led = {**W1, "restart_mode": "fresh-process", "restart_journals": 9, "warmup_batches": 30}
    assert report.w1_section(led, Path("w1.json"))[0].endswith(
        "driver heap 1g, restart in a fresh JVM after lead-in batches until a restart reads 9 "
        "journals in some store, 30 warm-up batches in each run's JVM first. "
        "Ratios are against HDFS; every figure is lower-is-better."
    )
    none = report.w1_section({**led, "restart_journals": 0}, Path("w1.json"))[0]
    assert (
        none
        == report.w1_section(
            {**W1, "restart_mode": "fresh-process", "warmup_batches": 30}, Path("w1.json")
        )[0]
    )
    assert "lead-in" not in none


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--size", "full"], 90),
        (["--size", "small"], 0),
        (["--size", "full", "--jvm", "shared", "--restart", "none"], 0),
        (["--size", "full", "--warmup-batches", "5"], 5),
        (["--size", "small", "--warmup-batches", "5"], 5),
    ],
)
def test_warmup_batches_default_to_90_in_a_jvm_per_provider(argv: list[str], expected: int) -> None:
    import w1
    import w5

    assert w1.parse_args(argv).warmup_batches == expected
    w5_argv = [a for a in argv if a != "--restart" and a != "none"]
    assert w5.parse_args(w5_argv).warmup_batches == expected


@pytest.mark.parametrize(
    ("keys", "updates", "expected"),
    [
        (1_000_000, 10_000, {"keys": 100_000, "updates": 1_000}),
        (4_000_000, 10_000, {"keys": 400_000, "updates": 1_000}),
        (5_000, 1_000, {"keys": 500, "updates": 100}),
        (5, 5, {"keys": 1, "updates": 1}),
    ],
)
def test_the_warmup_data_set_is_a_tenth_of_the_runs_scale(
    keys: int, updates: int, expected: dict[str, int]
) -> None:
    import w1

    assert w1.warmup_shape({"keys": keys, "updates": updates, "payload": 64}) == expected


def test_negative_warmup_batches_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    import w1

    with pytest.raises(SystemExit):
        w1.parse_args(["--warmup-batches", "-1"])
    assert "--warmup-batches must be 0 or more" in capsys.readouterr().err


def test_pyspark_submit_args_quote_the_java_options_as_one_argument() -> None:
    args = pyspark_submit_args(
        "4g", gc_log=Path("/tmp/gc.log"), java_options=["-XX:+AlwaysPreTouch"]
    )
    assert shlex.split(args) == [
        "--driver-memory",
        "4g",
        "--driver-java-options",
        "-XX:+AlwaysPreTouch -Xlog:gc,gc+phases,gc+heap,gc+cpu,safepoint:file=/tmp/gc.log:timemillis:filecount=0",
        "pyspark-shell",
    ]
    assert shlex.split(pyspark_submit_args("4g")) == ["--driver-memory", "4g", "pyspark-shell"]
    with pytest.raises(SystemExit, match="each must be one word"):
        pyspark_submit_args("4g", java_options=["-Xms1g -Xmx2g"])


def test_a_jar_older_than_the_scala_sources_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmarks measure the installed jar, which only ``bin/setup`` rebuilds: after a change
    to the sources it must be refused, naming the jar and the newest source; sbt's own output
    under ``project/`` and ``target/`` does not count."""
    monkeypatch.setattr(_common, "REPO_DIR", tmp_path)
    files = {
        "build.sbt": 100,
        "scala/src/main/scala/heapstate/A.scala": 300,
        "scala/src/main/scala/heapstate/B.scala": 200,
        "project/build.properties": 100,
        "project/target/streams/x": 900,
        "project/project/target/y": 900,
        "scala/target/z.class": 900,
    }
    for name, mtime in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
        os.utime(path, (mtime, mtime))
    jar = tmp_path / "heapstate.jar"
    jar.write_bytes(b"jar")
    os.utime(jar, (150, 150))

    newer = _common.newer_sources(jar)
    assert [f.relative_to(tmp_path).as_posix() for f in newer] == [
        "scala/src/main/scala/heapstate/A.scala",
        "scala/src/main/scala/heapstate/B.scala",
    ]
    with pytest.raises(SystemExit) as refused:
        _common._refuse_stale(jar)
    assert str(refused.value) == (
        f"the heapstate jar {jar} is older than the sources it is built from (2 newer, the "
        "newest scala/src/main/scala/heapstate/A.scala): run bin/setup to rebuild and reinstall "
        "it, or pass --jar to measure that jar anyway"
    )
    os.utime(jar, (400, 400))
    assert _common.newer_sources(jar) == []
    _common._refuse_stale(jar)  # a jar newer than every source is measured


def test_heap_after_gc_counts_only_when_a_full_collection_ran() -> None:
    """While a thread sits in a JNI critical region, G1 drops a requested full collection; a heap
    figure read then counts garbage and must not be reported."""
    assert _common.heap_after_full_gcs({"used": 450, "full_gcs": 3}) == 450
    assert _common.heap_after_full_gcs({"used": 450, "full_gcs": 1}) == 450
    assert _common.heap_after_full_gcs({"used": 1170, "full_gcs": 0}) is None
    assert _common.heap_after_full_gcs({"used": 450}) == 450  # recorded before the check existed
    assert _common.heap_after_full_gcs({"used": None, "full_gcs": 3}) is None
    assert _common.heap_after_full_gcs(None) is None
    assert [_common.is_full_collector(n) for n in ("G1 Old Generation", "G1 Young Generation")] == [
        True,
        False,
    ]


def _w5_summary(
    trigger: float, cpu: float, faulting: int, marking_ms: float = 0.0, marking_batches: int = 0
) -> dict[str, Any]:
    return {
        "trigger_ms_median": trigger,
        "commit_ms_median": 20.0,
        "minor_faults_median": 300.0,
        "jvm_cpu_ms_median": cpu,
        "faulting_batches": faulting,
        "faults_counted_batches": 10,
        "gc_marking_ms_total": marking_ms,
        "gc_marking_batches": marking_batches,
    }


def test_w5_counts_the_steady_batches_that_fault() -> None:
    import w5

    faults = [900_000, 19_000, 18_700, 19_000, 4_999, 5_000, 120, 80, 60, 700, 90, 100]
    batches = [{"batch": i, "minor_faults": f} for i, f in enumerate(faults)]
    assert w5.faulting_batches(batches) == (3, 10)  # batches 2, 3 and 5 (not 0 and 1)
    assert w5.faulting_batches([{"batch": 2}, {"batch": 3, "minor_faults": None}]) == (None, 0)


@pytest.mark.parametrize(("faulting_at_4m", "noted"), [(4, True), (1, True), (0, False)])
def test_w5_report_shows_faulting_batches_and_notes_first_touches(
    faulting_at_4m: int, noted: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    import w5

    summaries = {
        "heapstate": {
            1_000_000: _w5_summary(250.0, 300.0, 1),
            4_000_000: _w5_summary(400.0, 540.0, faulting_at_4m),
        }
    }
    growths = {name: w5.growth(by_k) for name, by_k in summaries.items()}
    assert growths["heapstate"]["trigger_ratio"] == 1.6
    assert growths["heapstate"]["jvm_cpu_ratio"] == 1.8
    w5.print_report("W5", summaries, growths, w5.targets(summaries, growths))
    out = capsys.readouterr().out
    heapstate_growth = next(line for line in out.splitlines() if "1,000,000 -> 4,000,000" in line)
    assert heapstate_growth.split()[-10:] == [
        *("1.80x", "-"),  # JVM CPU, then the machine probe, which these summaries lack
        *("1", "->", str(faulting_at_4m)),
        *("0", "ms", "->", "0", "ms"),  # no G1 marking at either K
    ]
    at_4m = next(
        line for line in out.splitlines() if line.split()[:2] == ["heapstate", "4,000,000"]
    )
    assert at_4m.split()[-6:] == ["300", f"{faulting_at_4m}/10", "0", "ms", "540", "ms"]
    assert "  FAIL  median trigger at K=4,000,000 <= 1.2x K=1,000,000  (1.60 vs limit 1.20)" in out
    note = (
        f"  note: {faulting_at_4m} of heapstate's steady batches at K=4,000,000 took at least "
        "5,000 minor page faults (1 at K=1,000,000): the JVM's first touches of heap it took on "
        "in batch 0, which slowed some runs' batches at K=4M (see PRETOUCH and --pretouch)"
    )
    assert (note in out) == noted
    assert ("note:" in out) == noted


@pytest.mark.parametrize(("marking_at_4m", "noted"), [(4_400.0, True), (0.0, False)])
def test_w5_report_shows_g1_marking_and_notes_it(
    marking_at_4m: float, noted: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    import w5

    summaries = {
        "heapstate": {
            1_000_000: _w5_summary(250.0, 300.0, 0, marking_ms=350.0, marking_batches=1),
            4_000_000: _w5_summary(
                400.0, 540.0, 0, marking_at_4m, marking_batches=9 if marking_at_4m else 0
            ),
        }
    }
    growths = {name: w5.growth(by_k) for name, by_k in summaries.items()}
    w5.print_report("W5", summaries, growths, w5.targets(summaries, growths))
    out = capsys.readouterr().out
    lines = out.splitlines()
    at_1m = next(line for line in lines if line.split()[:2] == ["heapstate", "1,000,000"])
    at_4m = next(line for line in lines if line.split()[:2] == ["heapstate", "4,000,000"])
    assert at_1m.split()[-6:] == ["0/10", "350", "ms", "(1)", "300", "ms"]
    marked = ["4,400", "ms", "(9)"] if marking_at_4m else ["0", "ms"]
    assert at_4m.split()[-3 - len(marked) :] == ["0/10", *marked, "540", "ms"]
    growth_line = next(line for line in lines if "1,000,000 -> 4,000,000" in line)
    to = "4,400" if marking_at_4m else "0"
    assert growth_line.split()[-5:] == ["350", "ms", "->", to, "ms"]
    note = (
        "  note: G1's concurrent marking ran 4,400 ms beside heapstate's steady batches at "
        "K=4,000,000 (350 ms at K=1,000,000): a marking thread takes one of the cores the tasks "
        "run on (see bench/README.md, W5)"
    )
    assert (note in out) == noted
    assert ("note:" in out) == noted


def _w5_run(start_ms: int, commits: list[int], pause_ms: float) -> dict[str, Any]:
    """A W5 run of len(commits) batches, 1 s apart from start_ms, one GC pause in its batch 3."""
    batches = [
        {
            "batch": i,
            "start_epoch_ms": start_ms + 1000 * i,
            "end_epoch_ms": start_ms + 1000 * i + 900,
            "trigger_ms": 200 + c,
            "commit_ms": c,
            "memory_used_bytes": 1000,
            "state_bytes_total": 10 * i,
            "state_bytes_new": 10,
            "custom_metrics": {"heapstateCommitStoreCpuMicros": 1000 * c},
            "minor_faults": 9000 if c >= 30 else 100,
        }
        for i, c in enumerate(commits)
    ]
    pause = {"end_epoch_ms": start_ms + 3500, "kind": "Pause Young", "pause_ms": pause_ms}
    return {"batches": batches, "gc_pauses": [pause], "gc_mark_cycles": []}


def test_w5_rounds_pool_the_steady_batches_of_every_round() -> None:
    import w5

    first = _w5_run(0, [900, 900, 10, 11, 12], 5.0)  # batches 0 and 1 are not steady
    second = _w5_run(100_000, [900, 900, 30, 31, 32], 40.0)
    one = w5.summarize(1000, first)
    assert (one["commit_ms_median"], one["gc_pause_ms_max"], one["gc_pauses"]) == (11, 5.0, 1)
    both = w5.summarize(1000, first, [second])
    # Steady commits 10, 11, 12, 30, 31, 32: the median of six; each run's pause in its own batch.
    assert both["commit_ms_median"] == 21.0  # (12 + 30) / 2
    assert both["commit_store_cpu_ms_median"] == 21.0
    assert (both["gc_pause_ms_max"], both["gc_pauses"], both["gc_pause_ms_total"]) == (
        40.0,
        2,
        45.0,
    )
    assert (one["faults_counted_batches"], both["faults_counted_batches"]) == (3, 6)
    assert (one["faulting_batches"], both["faulting_batches"]) == (0, 3)
    assert w5.pooled(first, []) is first
    assert [b["commit_ms"] for b in first["batches"]] == [900, 900, 10, 11, 12]  # not changed
    assert (one["rounds"], both["rounds"]) == (1, 2)
    assert "trigger_ms_max_round" not in one
    # The longest pause is the second round's, in its batch 3 (both rounds' pauses are in a batch 3).
    assert (both["gc_pause_max_batch"], both["gc_pause_max_round"]) == (3, 2)
    assert both["gc_pause_max_described"] == "Pause Young 40.0 ms"
    assert (one["gc_pause_max_batch"], "gc_pause_max_round" in one) == (3, False)
    first_longer = w5.summarize(1000, _w5_run(0, [900, 900, 10, 11, 12], 50.0), [second])
    assert (first_longer["gc_pause_max_batch"], first_longer["gc_pause_max_round"]) == (3, 1)


def test_w5_rounds_keep_each_rounds_snapshot_batches_and_name_the_slowest_round() -> None:
    import w5

    first = _w5_run(0, [900, 900, 10, 11, 12, 13], 5.0)
    first["batches"][3]["new_snapshot_versions"] = [3]  # batch 3 ran beside a snapshot
    second = _w5_run(100_000, [900, 900, 30, 31, 32, 33], 5.0)
    second["batches"][5]["new_snapshot_versions"] = [5]  # batch 5 did, in this round
    second["batches"][4]["trigger_ms"] = 999
    s = w5.summarize(1000, first, [second])
    assert s["compaction_batches"] == [[3], [5]]
    # Beside a snapshot: round 1's batch 3 (11) and round 2's batch 5 (33); pooled by batch number
    # they would also take round 1's batch 5 (13) and round 2's batch 3 (31).
    assert (s["commit_ms_median_compaction"], s["commit_ms_max_compaction"]) == (22.0, 33)
    assert s["commit_ms_median_other"] == 21.5  # 10, 12, 13, 30, 31, 32
    assert (s["trigger_ms_max_batch"], s["trigger_ms_max_round"]) == (4, 2)


def test_w5_rounds_run_every_spec_once_a_round_under_names_of_their_own() -> None:
    import w5

    specs = [
        {"run_name": f"{p}@{k}", "work_dir": f"/w/{p}-{k}", "keys": k, "provider": p}
        for k in (1, 4)
        for p in ("hdfs", "heapstate")
    ]
    assert w5.round_specs(specs, 1) == specs
    rounds = w5.round_specs(specs, 3)
    assert [s["run_name"] for s in rounds] == [
        "hdfs@1", "heapstate@1", "hdfs@4", "heapstate@4",
        "hdfs@1#2", "heapstate@1#2", "hdfs@4#2", "heapstate@4#2",
        "hdfs@1#3", "heapstate@1#3", "hdfs@4#3", "heapstate@4#3",
    ]  # fmt: skip
    assert rounds[7]["work_dir"] == "/w/heapstate-4-2"
    assert rounds[7]["first_run_name"] == "heapstate@4" and rounds[7]["round"] == 2
    assert len({s["work_dir"] for s in rounds}) == 12


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--repeat", "2", "--jvm", "shared"], "not with --jvm shared"),
    ],
)
def test_w5_refuses_a_bad_repeat(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import w5

    with pytest.raises(SystemExit):
        w5.parse_args(argv)
    assert error in capsys.readouterr().err


def test_w5_pools_the_later_rounds_when_the_first_round_of_a_run_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``w5.main`` with ``--repeat 3``, the workers replaced by hand-written runs: hdfs@1000's
    first round fails, so its rounds 2 and 3 are pooled, round 2 as the base; hdfs@2000 pools
    all three rounds. A later run keeps its round, so the slowest batch is named in round 3."""
    import w1
    import w5

    environment = {"spark_version": "4.2.0"}
    made = {
        "hdfs@1000#2": _w5_run(100_000, [900, 900, 30, 31, 32], 40.0),
        "hdfs@1000#3": _w5_run(200_000, [900, 900, 50, 51, 52], 5.0),
        "hdfs@2000": _w5_run(300_000, [900, 900, 10, 11, 12], 1.0),
        "hdfs@2000#2": _w5_run(400_000, [900, 900, 10, 11, 12], 2.0),
        "hdfs@2000#3": _w5_run(500_000, [900, 900, 10, 11, 12], 3.0),
    }
    for i, run in enumerate(made.values()):  # the heap after the run is the base round's
        run["heap_baseline"] = {"used": 1_000, "full_gcs": 3}
        run["heap_after"] = {"used": 1_000 + 100_000 * (i + 1), "full_gcs": 3}
    ran: list[str] = []

    def run_provider(python: str, spec: dict[str, Any], *rest: Any) -> dict[str, Any]:
        ran.append(spec["run_name"])
        if spec["run_name"] == "hdfs@1000":
            raise RuntimeError("worker exited with 1")
        return {**made[spec["run_name"]], "environment": environment}

    monkeypatch.setattr(w1, "run_provider", run_provider)
    monkeypatch.setattr(w5, "run_worker", lambda *args, **kwargs: None)  # no data generated
    monkeypatch.setattr(w1, "_git_state", lambda: {"commit": "0123", "dirty": False})
    out = tmp_path / "w5.json"
    argv = ["--keys", "1000,2000", "--batches", "5", "--providers", "hdfs", "--jvm"]
    argv += ["per-provider", "--repeat", "3", "--warmup-batches", "0", "--python", sys.executable]
    argv += ["--work-dir", str(tmp_path / "work"), "--out", str(out), "--no-probe"]
    assert w5.main(argv) == 1  # a run failed
    capsys.readouterr()
    assert ran == [f"hdfs@{k}{r}" for r in ("", "#2", "#3") for k in (1000, 2000)]

    rep = json.loads(out.read_text())
    assert rep["failures"] == {"hdfs@1000": "worker exited with 1"}
    assert list(rep["runs"]) == ["hdfs@2000"]
    assert rep["repeat_runs"] == {
        "hdfs@1000": [
            {**made["hdfs@1000#2"], "environment": environment, "round": 2},
            {**made["hdfs@1000#3"], "environment": environment, "round": 3},
        ],
        "hdfs@2000": [
            {**made["hdfs@2000#2"], "environment": environment, "round": 2},
            {**made["hdfs@2000#3"], "environment": environment, "round": 3},
        ],
    }
    low, high = rep["summary"]["hdfs"]["1000"], rep["summary"]["hdfs"]["2000"]
    assert (low["rounds"], high["rounds"]) == (2, 3)
    # Steady commits of rounds 2 and 3 (30, 31, 32, 50, 51, 52); each round's pause in its batch 3.
    assert (low["commit_ms_median"], low["commit_ms_max_compaction"]) == (41.0, None)
    assert (low["trigger_ms_median"], low["trigger_ms_max"]) == (241.0, 252)
    assert (low["gc_pauses"], low["gc_pause_ms_total"], low["gc_pause_ms_max"]) == (2, 45.0, 40.0)
    assert (low["trigger_ms_max_batch"], low["trigger_ms_max_round"]) == (4, 3)
    assert (low["faulting_batches"], low["faults_counted_batches"]) == (6, 6)  # 9,000 faults each
    assert (low["heap_retained_over_baseline_bytes"], low["heap_retained_per_key"]) == (
        100_000,
        100,
    )
    assert (high["heap_retained_over_baseline_bytes"], high["heap_retained_per_key"]) == (
        300_000,
        150,
    )
    assert (high["commit_ms_median"], high["gc_pause_ms_total"]) == (11.0, 6.0)
    assert (high["trigger_ms_max_batch"], high["trigger_ms_max_round"]) == (4, 1)


def test_w5_report_splits_the_jvm_cpu_by_thread(capsys: pytest.CaptureFixture[str]) -> None:
    import w5

    kinds = ("task", "driver", "jit", "gc", "store background", "other", "ended")
    at_1m = dict(zip(kinds, (300.0, 150.0, 200.0, 10.0, 100.0, 80.0, 0.0), strict=True))
    at_4m = dict(zip(kinds, (330.0, 150.0, 300.0, 40.0, 250.0, 80.0, 0.4), strict=True))
    summaries = {
        "heapstate": {
            1_000_000: {**_w5_summary(500.0, 840.0, 0), "jvm_cpu_ms_by_thread_median": at_1m},
            4_000_000: {**_w5_summary(600.0, 1150.0, 0), "jvm_cpu_ms_by_thread_median": at_4m},
        },
        # A provider whose runs recorded no split (a report before stop 63) has no rows in it.
        "hdfs": {1_000_000: _w5_summary(900.0, 900.0, 0), 4_000_000: _w5_summary(1e4, 2e3, 0)},
    }
    growths = {name: w5.growth(by_k) for name, by_k in summaries.items()}
    w5.print_report("W5", summaries, growths, w5.targets(summaries, growths))
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("JVM CPU a steady batch by"))
    table = [" ".join(line.split()) for line in lines[start + 2 : start + 8]]
    assert table == [
        "provider K task driver jit gc store background other ended",
        "--------- --------- ------ ------ ------ ----- ---------------- ----- -----",
        "heapstate 1,000,000 300 ms 150 ms 200 ms 10 ms 100 ms 80 ms 0 ms",
        "heapstate 4,000,000 330 ms 150 ms 300 ms 40 ms 250 ms 80 ms 0 ms",
        # An "ended" of under 1 ms at the smaller K has no growth.
        "heapstate growth 1.10x 1.00x 1.50x 4.00x 2.50x 1.00x -",
        (
            "(task: Spark's task threads; driver: the query's thread; jit and gc: the compilers, "
            "the collector's and the VM's threads; store background: heapstate's snapshot thread "
            "and Spark's maintenance; ended: threads that ended within the batch)"
        ),
    ]
    assert not any(line.startswith("HDFS") for line in lines[start : start + 8])
    # With no split at all, no table.
    for by_k in summaries.values():
        for s in by_k.values():
            s.pop("jvm_cpu_ms_by_thread_median", None)
    w5.print_report("W5", summaries, growths, w5.targets(summaries, growths))
    assert "by thread" not in capsys.readouterr().out
