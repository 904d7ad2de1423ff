"""The notebooks in ``notebooks/``, executed headless with papermill at the small size, and the
committed notebooks' hygiene.

Each notebook runs its benchmarks through ``bench/`` (W1 and W5, or W4), with its JSON reports,
its results table and its figures in a temporary folder. The checks: every expected figure is a
real PNG of a plot, the executed notebook shows each of them, and the results table holds exactly
the rows of the run's reports, which adding a report again does not duplicate. The committed
notebooks must hold no outputs (``bin/strip-notebooks`` strips them).

These tests need papermill, nbformat and matplotlib, which only ``.venv`` has; they import them
inside the tests, so that ``.venv-spark43``'s smoke run, which collects this file and deselects
everything not marked ``smoke43``, still collects it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from conftest import bench_java_option_args, job_submit_args

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
NOTEBOOKS = REPO / "notebooks"
CHECKPOINT_NOTEBOOK = NOTEBOOKS / "checkpoint_size_comparison.ipynb"
BUFFERED_NOTEBOOK = NOTEBOOKS / "buffered_output.ipynb"

CHECKPOINT_FIGURES = (
    "w1_bytes_per_batch.png",
    "w1_cumulative_bytes.png",
    "w1_bytes_by_kind.png",
    "w1_latency.png",
    "w1_memory.png",
    "w5_growth.png",
)
BUFFERED_FIGURES = ("w4_rows_downstream.png", "w4_throughput.png", "w4_latency.png")
ALL_PROVIDERS = {"hdfs", "rocksdb-changelog", "rocksdb", "heapstate"}
W5_KEYS = "--keys 5000,10000"
"""Two K values draw W5's curves as well as three do, in two thirds of the time."""


@pytest.fixture
def job_jvm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gives the notebook's own Spark session (the results table's Delta session, in the kernel)
    and the test's re-ingest the driver JVM options of the tests' jobs, C1 only and the class
    archive once it is written, through ``PYSPARK_SUBMIT_ARGS`` (``job_jvm.job_submit_args``).
    The bench workers set their own ``PYSPARK_SUBMIT_ARGS``: W1's, W5's and W4's get the same
    options from :func:`java_option_args`."""
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", job_submit_args())


def java_option_args() -> str:
    """The bench workers' ``--java-option`` arguments: they compile with C1 only and start from the
    class archive once it is written (``job_jvm.bench_java_option_args``). The small size's
    figures are not the point here."""
    return " ".join(bench_java_option_args())


W4_PROVIDERS = "hdfs,heapstate"
W4_ARGS = "--no-warmup --batches 4"
"""W4 runs a Delta MERGE per batch and run: two providers, four batches and no warm-up keep its
small size to a few minutes. The figures are not the point here; the plumbing is."""

Row = tuple[Any, ...]


def _results_table() -> Any:
    """``bench/results_table.py`` as a module (``bench/`` is a folder of scripts, not a package)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import results_table

    return results_table


def execute(notebook: Path, out: Path, parameters: dict[str, Any]) -> dict[str, Any]:
    """Run ``notebook`` with papermill from the repository root; return the executed notebook."""
    import papermill

    papermill.execute_notebook(
        str(notebook),
        str(out),
        parameters=parameters,
        cwd=str(REPO),
        kernel_name="python3",
        progress_bar=False,
    )
    return json.loads(out.read_text())


def png_outputs(executed: dict[str, Any]) -> int:
    """How many outputs of the executed notebook hold an image/png."""
    return sum(
        1
        for cell in executed["cells"]
        if cell["cell_type"] == "code"
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    )


def assert_plot_png(path: Path) -> None:
    """``path`` is a PNG of a real plot: decodable, at least 600 x 300 pixels, many colours."""
    from PIL import Image

    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    with Image.open(path) as image:
        image.load()
        width, height = image.size
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert width >= 600 and height >= 300, f"{path}: {width}x{height} pixels"
    # A blank or single-colour canvas has a handful of colours; lines, bars and text bring
    # hundreds (anti-aliasing).
    assert colours is not None and len(colours) >= 100, f"{path}: {len(colours or [])} colours"


def delta_rows(table: Path) -> list[dict[str, Any]]:
    """The rows of the Delta table at ``table``, read from its log and parquet files with pyarrow
    alone: this process's Spark session has no Delta. Every commit's JSON is replayed (the log
    keeps them for 30 days), so checkpoints are not needed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    live: dict[str, None] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                assert "deletionVector" not in action["add"] or not action["add"]["deletionVector"]
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    assert live, f"{table} has no live data files"
    return pa.concat_tables([pq.read_table(table / unquote(path)) for path in live]).to_pylist()


def figures_of(rows: list[dict[str, Any]]) -> Counter[Row]:
    """The table's figures, as a multiset of (run_id, scope, provider, keys, cardinality, mode,
    writes_per_key, batch, metric, value)."""
    return Counter(
        tuple(
            r[c]
            for c in (
                "run_id",
                "scope",
                "provider",
                "keys",
                "cardinality",
                "mode",
                "writes_per_key",
                "batch",
                "metric",
                "value",
            )
        )
        for r in rows
    )


def expected_figures(reports: list[Path]) -> Counter[Row]:
    """What ``bench/results_table.py`` makes of ``reports``, as ``figures_of`` counts it."""
    results_table = _results_table()
    rows = [
        row
        for path in reports
        for row in results_table.rows_from_report(results_table.load_report(path), path)
    ]
    return figures_of(rows)


def only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"{folder}: expected one {pattern}, found {[p.name for p in found]}"
    return found[0]


def test_committed_notebooks_hold_no_outputs() -> None:
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert {p.name for p in notebooks} >= {CHECKPOINT_NOTEBOOK.name, BUFFERED_NOTEBOOK.name}
    for path in notebooks:
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        with_outputs = [i for i, c in enumerate(code) if c["outputs"]]
        counted = [i for i, c in enumerate(code) if c["execution_count"] is not None]
        assert (with_outputs, counted) == ([], []), (
            f"{path}: code cells {with_outputs} hold outputs and {counted} execution counts; "
            "run bin/strip-notebooks before committing"
        )
        assert "papermill" not in nb["metadata"], f"{path}: papermill metadata; strip it"
        tagged = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
        assert len(tagged) == 1, f"{path}: {len(tagged)} cells tagged 'parameters', not 1"


@pytest.mark.usefixtures("job_jvm_env")
def test_checkpoint_size_comparison_notebook(tmp_path: Path) -> None:
    java_options = java_option_args()
    figures, reports, table = tmp_path / "figures", tmp_path / "reports", tmp_path / "table"
    executed = execute(
        CHECKPOINT_NOTEBOOK,
        tmp_path / "executed.ipynb",
        {
            "size": "small",
            "providers": "all",
            "w1_args": java_options,
            "w5_args": f"{W5_KEYS} {java_options}",
            "results_table": str(table),
            "figures_dir": str(figures),
            "reports_dir": str(reports),
        },
    )

    for name in CHECKPOINT_FIGURES:
        assert_plot_png(figures / name)
    assert sorted(p.name for p in figures.iterdir()) == sorted(CHECKPOINT_FIGURES)
    assert png_outputs(executed) == len(CHECKPOINT_FIGURES)

    w1_json, w5_json = only(reports, "w1-*.json"), only(reports, "w5-*.json")
    w1, w5 = json.loads(w1_json.read_text()), json.loads(w5_json.read_text())
    assert set(w1["summary"]) == ALL_PROVIDERS, w1.get("failures")
    assert set(w5["summary"]) == ALL_PROVIDERS, w5.get("failures")
    rows = delta_rows(table)
    assert {(r["run_id"], r["benchmark"]) for r in rows} == {
        (f"w1-{w1['timestamp']}", "W1"),
        (f"w5-{w5['timestamp']}", "W5"),
    }
    assert figures_of(rows) == expected_figures([w1_json, w5_json])
    # The split of checkpoint bytes by kind of file is in the table for every provider and batch.
    by_kind = Counter(
        r["provider"] for r in rows if r["metric"] == "state_bytes_total_by_kind.journal"
    )
    w1_batches, w5_runs = w1["params"]["batches"], len(w5["params"]["keys"])
    assert by_kind == {p: w1_batches + 1 + w5_runs * w5["params"]["batches"] for p in ALL_PROVIDERS}

    # Adding a report again replaces its run's rows rather than duplicating them.
    done = subprocess.run(
        [sys.executable, str(BENCH / "results_table.py"), str(w1_json), "--table", str(table)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"w1-{w1['timestamp']}: {len(expected_figures([w1_json])):,} rows" in done.stdout
    assert figures_of(delta_rows(table)) == expected_figures([w1_json, w5_json])


@pytest.mark.usefixtures("job_jvm_env")
def test_buffered_output_notebook(tmp_path: Path) -> None:
    figures, reports, table = tmp_path / "figures", tmp_path / "reports", tmp_path / "table"
    executed = execute(
        BUFFERED_NOTEBOOK,
        tmp_path / "executed.ipynb",
        {
            "size": "small",
            "providers": W4_PROVIDERS,
            "w4_args": f"{W4_ARGS} {java_option_args()}",
            "results_table": str(table),
            "figures_dir": str(figures),
            "reports_dir": str(reports),
        },
    )

    for name in BUFFERED_FIGURES:
        assert_plot_png(figures / name)
    assert sorted(p.name for p in figures.iterdir()) == sorted(BUFFERED_FIGURES)
    assert png_outputs(executed) == len(BUFFERED_FIGURES)

    w4_json = only(reports, "w4-*.json")
    w4 = json.loads(w4_json.read_text())
    cardinalities = set(w4["params"]["cardinalities"])
    assert {(r["cardinality"], r["mode"], r["provider"]) for r in w4["results"]} == {
        (c, *run)
        for c in cardinalities
        for run in [("unbuffered", None), ("buffered", "hdfs"), ("buffered", "heapstate")]
    }, w4.get("failures")
    rows = delta_rows(table)
    assert {(r["run_id"], r["benchmark"]) for r in rows} == {(f"w4-{w4['timestamp']}", "W4")}
    assert figures_of(rows) == expected_figures([w4_json])
    downstream = {
        (r["cardinality"], r["mode"], r["provider"]): r["value"]
        for r in rows
        if r["scope"] == "result" and r["metric"] == "rows_downstream"
    }
    assert downstream == {
        (r["cardinality"], r["mode"], r["provider"]): r["rows_downstream"] for r in w4["results"]
    }
