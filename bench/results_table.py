"""The benchmarks' results table: every JSON report of W1 to W5, in one Delta table, long format.

One row is one figure: which run it comes from, which provider and scale point it describes, and
its value. Runs of different days, commits and sizes sit side by side, so a query can compare
them (the notebooks in ``notebooks/`` do)::

    .venv/bin/python bench/results_table.py bench/results/w1-20261121-144048.json
    .venv/bin/python bench/results_table.py bench/results/w5-*.json --table /tmp/table

From Python (``bench/`` on ``sys.path``)::

    from _delta import delta_session
    import results_table

    spark = delta_session()
    results_table.ingest(spark, [Path("bench/results/w1-20261121-144048.json")])
    results_table.read(spark).where("metric = 'trigger_ms_median'").show()

The columns (``SCHEMA``):

- ``run_id``: the benchmark and its timestamp, e.g. ``w1-20261121-144048``. Ingesting a report
  again replaces that run's rows, in one Delta commit; it never duplicates them.
- ``benchmark`` (W1 to W5), ``timestamp`` (when the run started, local time), ``size`` (the
  ``--size`` it ran at), ``git_commit`` and ``git_dirty``, ``spark_version``: of the whole run.
  W2's and W3's reports (written by the Scala benchmarks) carry no timestamp or commit: the
  timestamp is taken from the file name (``w2-<timestamp>.json``) and the commit is null.
- ``provider``: a ``--providers`` name (``hdfs``, ``rocksdb-changelog``, ``rocksdb``,
  ``heapstate``); null for W4's unbuffered runs, which have no state.
- The scale point, null where it does not apply: ``keys`` (K in W1 and W5, the keys of W2's
  version and W3's store), ``cardinality`` and ``mode`` (W4: ``buffered`` or ``unbuffered``),
  ``writes_per_key`` (W2's m).
- ``scope``: what the figure describes. ``summary`` (a run's figure per provider and K, as the
  script's table prints it), ``batch`` (one micro-batch; ``batch`` holds its id), ``restart``
  (W1's first batch after the restart), ``growth`` (W5's ratios, largest K over the one before;
  ``keys`` is the largest K), ``result`` (one record of W2's, W3's or W4's ``results``).
- ``round``: the round the figure was measured in, counted from 1. ``w5.py --repeat N`` runs
  every provider at every K N times, each in a JVM of its own: the rows of each run (its
  batches, its heap figures) carry their round, so a run's batch appears once per round. The
  summary and growth figures of such a report pool every round, and have a null round (the
  summary's ``rounds`` figure says how many rounds it pools), as have W3's results with
  ``--rounds`` above 1 (medians over its rounds). Every other report ran once: its rows say 1.
  Rows ingested before this column existed read null until their report is ingested again.
  (In pandas, ``frame["round"]``: ``frame.round`` is a method.)
- ``metric`` and ``value``: the JSON field and its value as a double. Nested records are flattened
  with dots (``state_bytes_total_by_kind.journal``, ``duration_ms.addBatch``,
  ``custom_metrics.rocksdbGetCount``); booleans are 1.0 or 0.0; nulls, strings and lists are
  left out.
- ``params``: the report's parameters as JSON text (W2's and W3's reports have no ``params``:
  their other top-level figures, such as ``keys`` or ``ops_per_run``), and ``source``: the
  report's path.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from _common import read_report
from w5 import runs_by_round

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_TABLE = BENCH_DIR / "results" / "table"

SCHEMA = (
    "run_id STRING, benchmark STRING, timestamp TIMESTAMP, size STRING, git_commit STRING, "
    "git_dirty BOOLEAN, spark_version STRING, provider STRING, keys BIGINT, cardinality BIGINT, "
    "mode STRING, writes_per_key BIGINT, batch BIGINT, round BIGINT, scope STRING, "
    "metric STRING, value DOUBLE, params STRING, source STRING"
)
COLUMNS: tuple[str, ...] = tuple(part.strip().split(" ")[0] for part in SCHEMA.split(","))

_STAMP = re.compile(r"(\d{8}-\d{6})")
_STAMP_FORMAT = "%Y%m%d-%H%M%S"

Row = dict[str, Any]


def _stamp(report: Mapping[str, Any], source: Path) -> str:
    """The run's timestamp text: the report's own, else the one in its file name."""
    stamp = report.get("timestamp")
    if isinstance(stamp, str) and _STAMP.fullmatch(stamp):
        return stamp
    found = _STAMP.search(source.name)
    if found is None:
        raise ValueError(
            f"{source}: the report has no 'timestamp' and its name holds none "
            "(expected <benchmark>-YYYYmmdd-HHMMSS.json)"
        )
    return found.group(1)


def run_id(report: Mapping[str, Any], source: Path) -> str:
    """The run's id: the benchmark in lower case and its timestamp, e.g. ``w1-20261121-144048``."""
    return f"{str(report['benchmark']).lower()}-{_stamp(report, source)}"


def _figures(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in ``record`` as (dotted name, value); bools count as 0 or 1."""
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            yield name, 1.0 if value else 0.0
        elif isinstance(value, (int, float)):
            yield name, float(value)
        elif isinstance(value, Mapping):
            yield from _figures(value, name + ".")


_RUN_FIELDS = {"benchmark", "timestamp", "size", "spark", "java"}


def _params(report: Mapping[str, Any]) -> Any:
    """A report's parameters: its ``params``, else (W2, W3) its other top-level scalars."""
    if "params" in report:
        return report["params"]
    return {
        k: v
        for k, v in report.items()
        if k not in _RUN_FIELDS and isinstance(v, (str, int, float, bool))
    }


class _RowMaker:
    """Builds rows that share one report's run-wide columns."""

    def __init__(self, report: Mapping[str, Any], source: Path) -> None:
        git = report.get("git") or {}
        environment = report.get("environment") or {}
        stamp = _stamp(report, source)
        # W5's --repeat and W3's --rounds: a figure over several rounds is of none of them.
        rounds = report.get("repeat") or report.get("rounds") or 1
        self.common: Row = {
            "run_id": run_id(report, source),
            "benchmark": str(report["benchmark"]),
            "timestamp": dt.datetime.strptime(stamp, _STAMP_FORMAT),
            "size": report.get("size"),
            "git_commit": git.get("commit") or None,
            "git_dirty": git.get("dirty"),
            "spark_version": environment.get("spark_version") or report.get("spark"),
            "round": 1 if rounds == 1 else None,
            "params": json.dumps(_params(report), sort_keys=True),
            "source": str(source),
        }

    def rows(
        self,
        record: Mapping[str, Any],
        scope: str,
        *,
        skip: Iterable[str] = (),
        prefix: str = "",
        **point: Any,
    ) -> list[Row]:
        """One row per number in ``record`` (but the ``skip`` fields), at the scale ``point``."""
        skipped = set(skip)
        base = {**dict.fromkeys(COLUMNS), **self.common, **point, "scope": scope}
        return [
            {**base, "metric": prefix + name, "value": value}
            for name, value in _figures({k: v for k, v in record.items() if k not in skipped})
        ]


def _w1_rows(make: _RowMaker, report: Mapping[str, Any]) -> list[Row]:
    keys = report["params"]["keys"]
    rows: list[Row] = []
    for provider, summary in report.get("summary", {}).items():
        rows += make.rows(summary, "summary", provider=provider, keys=keys)
    for provider, run in report.get("runs", {}).items():
        rows += _run_rows(make, run, provider, keys)
    return rows


def _run_rows(
    make: _RowMaker, run: Mapping[str, Any], provider: str, keys: int, in_round: int = 1
) -> list[Row]:
    """A W1 run's per-batch records, its restart, and its heap figures (also each round's run of
    W5's), in round ``in_round``."""
    point = {"provider": provider, "keys": keys, "round": in_round}
    rows: list[Row] = []
    for rec in run.get("batches", []):
        rows += make.rows(rec, "batch", skip=["batch"], batch=rec["batch"], **point)
    restart = run.get("restart")
    if restart:
        rows += make.rows(restart, "restart", skip=["batch"], batch=restart["batch"], **point)
    for name in ("heap_baseline", "heap_after"):
        if run.get(name):
            rows += make.rows(run[name], "summary", prefix=f"{name}.", **point)
    return rows


def _w5_rows(make: _RowMaker, report: Mapping[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for provider, by_k in report.get("summary", {}).items():
        for k, summary in by_k.items():
            rows += make.rows(summary, "summary", skip=["keys"], provider=provider, keys=int(k))
    for name, by_round in runs_by_round(report).items():
        provider, _, k = name.rpartition("@")
        if not provider:
            raise ValueError(f"W5 run {name!r}: expected <provider>@<keys>")
        for in_round, run in sorted(by_round.items()):
            rows += _run_rows(make, run, provider, int(k), in_round)
    for provider, growth in report.get("growth", {}).items():
        rows += make.rows(
            growth, "growth", skip=["to_keys"], provider=provider, keys=growth["to_keys"]
        )
    return rows


def _w2_rows(make: _RowMaker, report: Mapping[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for rec in report.get("results", []):
        rows += make.rows(
            rec,
            "result",
            skip=["provider", "m"],
            provider=rec["provider"],
            keys=report.get("keys"),
            writes_per_key=rec["m"],
        )
    return rows


def _w3_rows(make: _RowMaker, report: Mapping[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for rec in report.get("results", []):
        rows += make.rows(
            rec, "result", skip=["provider", "keys"], provider=rec["provider"], keys=rec["keys"]
        )
    return rows


def _w4_rows(make: _RowMaker, report: Mapping[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for rec in report.get("results", []):
        point = {
            "provider": rec.get("provider"),
            "cardinality": rec["cardinality"],
            "mode": rec["mode"],
        }
        rows += make.rows(rec, "result", skip=["cardinality", "batches"], **point)
        for batch in rec.get("batches", []):
            rows += make.rows(batch, "batch", skip=["batch"], batch=batch["batch"], **point)
    return rows


_BY_BENCHMARK = {"W1": _w1_rows, "W2": _w2_rows, "W3": _w3_rows, "W4": _w4_rows, "W5": _w5_rows}


def rows_from_report(report: Mapping[str, Any], source: Path) -> list[Row]:
    """The table's rows for one benchmark report (the parsed JSON read from ``source``)."""
    benchmark = report.get("benchmark")
    if benchmark not in _BY_BENCHMARK:
        raise ValueError(
            f"{source}: 'benchmark' is {benchmark!r}; expected one of {', '.join(_BY_BENCHMARK)}"
        )
    return _BY_BENCHMARK[benchmark](_RowMaker(report, source), report)


def load_report(path: Path) -> dict[str, Any]:
    """Parse one JSON report, naming the file when it is not one (``ValueError``, from
    ``read_report``)."""
    report = read_report(path)
    if not isinstance(report, dict):
        raise TypeError(f"{path}: not a JSON object")
    return report


def ingest(
    spark: Any, reports: Sequence[Path], table: Path | str = DEFAULT_TABLE
) -> dict[str, int]:
    """Append ``reports`` to the Delta table at ``table`` (created when missing), replacing the
    rows of any run already in it, in one commit. Returns the rows written per run id. A table
    written before a column of SCHEMA existed takes the column (``mergeSchema``)."""
    rows_by_run: dict[str, list[Row]] = {}
    for path in reports:
        report = load_report(Path(path))
        rows_by_run[run_id(report, Path(path))] = rows_from_report(report, Path(path))
    if not rows_by_run:
        return {}
    rows = [tuple(row[c] for c in COLUMNS) for run in rows_by_run.values() for row in run]
    frame = spark.createDataFrame(rows, SCHEMA)
    quoted = ", ".join("'" + rid.replace("'", "''") + "'" for rid in rows_by_run)
    writer = frame.write.format("delta").option("mergeSchema", "true")
    if _is_delta_table(spark, str(table)):
        writer = writer.mode("overwrite").option("replaceWhere", f"run_id IN ({quoted})")
    else:
        writer = writer.mode("append")
    writer.save(str(table))
    return {rid: len(run) for rid, run in rows_by_run.items()}


def _is_delta_table(spark: Any, table: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, table))


def read(spark: Any, table: Path | str = DEFAULT_TABLE) -> Any:
    """The results table as a Spark DataFrame."""
    return spark.read.format("delta").load(str(table))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", type=Path, metavar="FILE.json")
    parser.add_argument(
        "--table",
        type=Path,
        default=DEFAULT_TABLE,
        help=f"the Delta table (default: {DEFAULT_TABLE})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in args.reports:  # fail on a bad file before starting Spark
        rows_from_report(load_report(path), path)
    from _delta import delta_session

    spark = delta_session("heapstate-results-table")
    try:
        written = ingest(spark, args.reports, args.table)
        total = read(spark, args.table).count()
    finally:
        spark.stop()
    for rid, count in written.items():
        print(f"{rid}: {count:,} rows")
    print(f"{args.table}: {total:,} rows in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
