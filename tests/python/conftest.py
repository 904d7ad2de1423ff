"""The shared SparkSession and the harness that runs one pipeline on two state store providers.

Every end-to-end test follows the same plan:

- Input arrives as JSON-lines files, one file per micro-batch and per source, read with
  ``maxFilesPerTrigger=1``. Each file's modification time is set explicitly, so the file source
  orders them the same way in every run.
- The query runs with ``Trigger.AvailableNow`` over the first files, stops, gets more files and
  restarts from the same checkpoint. A ``foreachBatch`` sink brings every micro-batch's output
  (batch id and sorted rows) back to the driver.
- The identical pipeline runs on Spark's HDFSBackedStateStoreProvider and on heapstate, each with
  a fresh checkpoint, since Spark pins the provider class in a checkpoint's offset log.
- The outputs must be equal batch by batch, and each checkpoint must show that its own provider
  wrote the state (offset log conf and state file names), so a run that silently fell back to
  another provider cannot pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import heapstate
import pytest
from job_jvm import (  # noqa: F401  (the tests import them from here)
    bench_java_option_args,
    job_submit_args,
    subprocess_java_options,
)
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
HEAPSTATE_PROVIDER = heapstate.PROVIDER_CLASS
PROVIDER_CONF = heapstate.PROVIDER_CONF
PROVIDERS: dict[str, str] = {"hdfs": HDFS_PROVIDER, "heapstate": HEAPSTATE_PROVIDER}

SHUFFLE_PARTITIONS = 2
COMPACTION_INTERVAL = 2
"""Small, so that heapstate writes snapshots during the tests and recovery reads snapshot plus
journals rather than journals alone."""

EPOCH_2024 = 1_704_067_200
"""2024-01-01T00:00:00Z. Test inputs give event times as minutes after it (column ``t``)."""

QUERY_TIMEOUT_S = 240

STATE_FILE = re.compile(r"^(\d+)\.(hs-journal|hs-snapshot|delta|snapshot|changelog|zip)$")
"""State files of heapstate (``hs-*``), of the HDFS provider (``delta``, ``snapshot``) and of
RocksDB (``changelog``, ``zip``): every name a store of any provider would write."""

Rows = list[tuple[Any, ...]]
BatchOutput = tuple[int, Rows]


# --------------------------------------------------------------------------------------------
# Test order

LONGEST_FIRST = (
    "test_kill.py",
    "test_notebooks.py",
    "test_executor_loss.py",
    "test_task_failure.py",
    "test_delta.py",
    "test_soak.py",
)
"""The test files that take longest (one to eight minutes each, run alone), longest first. ``bin/test`` runs
pytest with two xdist workers that take whole files in collection order (``--dist loadfile
--no-loadscope-reorder``): started first, these do not leave one worker running the kill test
alone at the end."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Moves the files of :data:`LONGEST_FIRST` to the front, in that order; the rest keep theirs."""

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: tests keep their order within a file and among the rest


# --------------------------------------------------------------------------------------------
# The session


def _check_jar_holds_provider(jar: str) -> None:
    entry = HEAPSTATE_PROVIDER.replace(".", "/") + ".class"
    with zipfile.ZipFile(jar) as zf:
        names = set(zf.namelist())
    if entry not in names:
        raise RuntimeError(
            f"{jar} does not contain {entry}: the bundled jar predates the provider. Build it "
            "(bin/sbt package) and reinstall the package (bin/setup)."
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session with the heapstate jar loaded and heapstate as the default provider.

    The maintenance interval is short so that snapshots are really written while queries run.
    ``minDeltasForSnapshot`` does the same for the HDFS provider, which the tests use as the
    reference.
    """
    jar = heapstate.jar_path()
    _check_jar_holds_provider(jar)
    # Python workers (applyInPandasWithState) need this venv's pandas and pyarrow.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("heapstate-pytest")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
        .config("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
    )
    session = heapstate.configure(builder, compaction_interval=COMPACTION_INTERVAL).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


# --------------------------------------------------------------------------------------------
# Input files


@dataclass(frozen=True)
class Source:
    """One streaming input: its schema (DDL) and the rows of each micro-batch, in order."""

    schema: str
    batches: Sequence[Sequence[Mapping[str, Any]]]


@pytest.fixture
def no_spark_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``spark-defaults.conf`` for heapstate to read plugins from: ``SPARK_CONF_DIR`` names a
    folder that does not exist (unset, ``SPARK_HOME`` or pyspark's own ``conf`` would be read)."""
    monkeypatch.setenv("SPARK_CONF_DIR", "/nonexistent/heapstate-test-conf")


def write_input_file(directory: Path, index: int, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write batch ``index`` as one JSON-lines file whose modification time orders it.

    The file source sorts new files by modification time; setting it to a fixed, increasing
    value per index keeps the batch composition identical across runs and providers.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"batch-{index:03d}.json"
    tmp = directory / f".batch-{index:03d}.json.tmp"
    tmp.write_text("".join(json.dumps(dict(r), sort_keys=True) + "\n" for r in rows))
    mtime = EPOCH_2024 + index * 60
    os.utime(tmp, (mtime, mtime))
    tmp.rename(path)  # the source must never see a half-written file
    return path


def read_stream(spark: SparkSession, directory: Path, schema: str) -> DataFrame:
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(directory))


# --------------------------------------------------------------------------------------------
# Running a query


def plain(value: Any) -> Any:
    """A collected value as plain, comparable Python data (Rows become tuples)."""
    if isinstance(value, Row):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _null_safe_key(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_null_safe_key(v) for v in value)
    return (value is None, value if value is not None else 0)


def sorted_rows(rows: Sequence[Any]) -> Rows:
    """Rows as tuples in a total order that tolerates nulls."""
    return sorted((plain(r) for r in rows), key=_null_safe_key)


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """Copy a checkpoint's content to ``dst``.

    Spark's maintenance thread may still be writing a snapshot after the query stopped, and the
    temporary file of that atomic write (``.<name>.<uuid>.tmp``) can vanish mid-copy. Hidden
    files (those temporary files and Hadoop's ``.crc`` checksums) are not part of a checkpoint's
    content, so they are not copied.
    """
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".*"))
    return dst


def run_count_per_key(
    spark: SparkSession, workdir: Path, batches: Sequence[Sequence[str]], first: int = 0
) -> list[BatchOutput]:
    """A streaming count per key ``k`` with ``Trigger.AvailableNow``, on the session's current
    provider, after writing ``batches`` as input files ``first``, ``first + 1``, ... under
    ``workdir / "in"``; the checkpoint is ``workdir / "checkpoint"``. Returns every micro-batch's
    output (batch id, sorted rows)."""
    for i, keys in enumerate(batches, start=first):
        write_input_file(workdir / "in", i, [{"k": k} for k in keys])
    out: list[BatchOutput] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        out.append((batch_id, sorted_rows(df.collect())))

    query = (
        read_stream(spark, workdir / "in", "k STRING")
        .groupBy("k")
        .agg(F.count("*").alias("n"))
        .writeStream.outputMode("update")
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .foreachBatch(collect)
        .start()
    )
    try:
        assert query.awaitTermination(240), "the query did not finish within 240 s"
    finally:
        if query.isActive:
            query.stop()
    return out


Build = Callable[[Mapping[str, DataFrame]], DataFrame]


def run_available_now(
    spark: SparkSession,
    provider: str,
    build: Build,
    source_dirs: Mapping[str, tuple[Path, str]],
    checkpoint: Path,
    output_mode: str,
) -> list[BatchOutput]:
    """Run ``build`` over the sources with ``Trigger.AvailableNow`` until it ends by itself.

    The provider is set on the session just before the start; a restarted query keeps the
    provider its checkpoint was created with, whatever the session says.
    """
    spark.conf.set(PROVIDER_CONF, provider)
    streams = {name: read_stream(spark, d, schema) for name, (d, schema) in source_dirs.items()}
    collected: list[BatchOutput] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        collected.append((batch_id, sorted_rows(df.collect())))

    query = (
        build(streams)
        .writeStream.outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .foreachBatch(collect)
        .start()
    )
    try:
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        if query.isActive:
            query.stop()
    assert finished, f"the query on {provider} did not finish within {QUERY_TIMEOUT_S}s"
    return collected


@dataclass
class PipelineRun:
    """What one provider's two runs (before and after the restart) produced."""

    provider: str
    checkpoint: Path
    first_run: list[BatchOutput]
    second_run: list[BatchOutput]
    batches: list[BatchOutput] = field(init=False)

    def __post_init__(self) -> None:
        self.batches = self.first_run + self.second_run

    def non_empty(self) -> list[BatchOutput]:
        return [(b, rows) for b, rows in self.batches if rows]

    def rows_after_restart(self) -> Rows:
        return [r for _, rows in self.second_run for r in rows]


def run_with_restart(
    spark: SparkSession,
    workdir: Path,
    provider: str,
    sources: Mapping[str, Source],
    build: Build,
    output_mode: str,
    first_batches: int = 3,
) -> PipelineRun:
    """Feed ``first_batches`` files per source, run, feed the rest, restart and run again."""
    checkpoint = workdir / "checkpoint"
    dirs = {name: (workdir / "input" / name, src.schema) for name, src in sources.items()}
    counts = {len(src.batches) for src in sources.values()}
    assert len(counts) == 1, "every source needs the same number of batches"
    (total,) = counts
    assert 0 < first_batches < total

    for name, src in sources.items():
        for i in range(first_batches):
            write_input_file(dirs[name][0], i, src.batches[i])
    first = run_available_now(spark, provider, build, dirs, checkpoint, output_mode)

    for name, src in sources.items():
        for i in range(first_batches, total):
            write_input_file(dirs[name][0], i, src.batches[i])
    second = run_available_now(spark, provider, build, dirs, checkpoint, output_mode)
    return PipelineRun(provider, checkpoint, first, second)


def run_on_both_providers(
    spark: SparkSession,
    tmp_path: Path,
    sources: Mapping[str, Source],
    build: Build,
    output_mode: str,
    stores_per_partition: int = 1,
) -> PipelineRun:
    """Run the pipeline on the HDFS provider and on heapstate; return heapstate's run.

    Asserts that both produced exactly the same micro-batches, that the output is not empty
    in either run (so the restart really happened mid-stream), and that each checkpoint was
    written by its own provider.
    """
    hdfs = run_with_restart(spark, tmp_path / "hdfs", HDFS_PROVIDER, sources, build, output_mode)
    heap = run_with_restart(
        spark, tmp_path / "heapstate", HEAPSTATE_PROVIDER, sources, build, output_mode
    )
    assert_checkpoint_written_by(hdfs.checkpoint, HDFS_PROVIDER, stores_per_partition)
    assert_checkpoint_written_by(heap.checkpoint, HEAPSTATE_PROVIDER, stores_per_partition)

    assert hdfs.non_empty(), "the reference run produced no output at all"
    assert any(rows for _, rows in hdfs.first_run), "no output before the restart"
    assert any(rows for _, rows in hdfs.second_run), "no output after the restart"
    assert [b for b, _ in heap.first_run] == [b for b, _ in hdfs.first_run]
    assert heap.first_run == hdfs.first_run
    assert heap.second_run == hdfs.second_run
    return heap


# --------------------------------------------------------------------------------------------
# Reading a checkpoint


def committed_batches(checkpoint: Path) -> list[int]:
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return []
    return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())


@contextmanager
def session_confs(spark: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """Set ``confs`` on the session for the ``with`` block, then put back what each key had
    (unset when it had no value)."""
    saved = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def offset_log_metadata(checkpoint: Path, batch_id: int) -> dict[str, Any]:
    """The metadata line of ``offsets/<batch_id>``: watermark, batch timestamp, pinned confs."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    for line in lines[1:]:
        if line.startswith("{"):
            parsed = json.loads(line)
            if "conf" in parsed:
                return parsed
    raise AssertionError(f"offsets/{batch_id} of {checkpoint} has no metadata line: {lines}")


@dataclass(frozen=True)
class StoreFiles:
    """The state files of one store directory, by kind, as sets of versions."""

    directory: Path
    versions: Mapping[str, frozenset[int]]

    def of(self, kind: str) -> frozenset[int]:
        return self.versions.get(kind, frozenset())


def state_store_dirs(checkpoint: Path) -> list[Path]:
    """Every store directory: ``state/<op>/<partition>`` or ``state/<op>/<partition>/<name>``."""
    dirs: list[Path] = []
    state = checkpoint / "state"
    for op in sorted(p for p in state.iterdir() if p.name.isdigit()):
        for part in sorted(
            (p for p in op.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        ):
            named = sorted(p for p in part.iterdir() if p.is_dir() and not p.name.startswith("_"))
            dirs.extend(named if named else [part])
    return dirs


def store_files(directory: Path) -> StoreFiles:
    found: dict[str, set[int]] = {}
    for p in directory.iterdir():
        m = STATE_FILE.match(p.name)
        if m:
            found.setdefault(m.group(2), set()).add(int(m.group(1)))
    return StoreFiles(directory, {k: frozenset(v) for k, v in found.items()})


def assert_checkpoint_written_by(
    checkpoint: Path, provider: str, stores_per_partition: int = 1
) -> list[StoreFiles]:
    """Assert that ``provider`` ran every batch of ``checkpoint`` and wrote all of its state.

    - Every offset log entry pins ``provider``.
    - Every store directory holds exactly the file kinds of that provider, with one journal (or
      delta) per committed version, none missing: retention keeps far more than the tests make.
    """
    batches = committed_batches(checkpoint)
    assert batches == list(range(len(batches))) and batches, f"commits of {checkpoint}: {batches}"
    for b in batches:
        pinned = offset_log_metadata(checkpoint, b)["conf"].get(PROVIDER_CONF)
        assert pinned == provider, f"offsets/{b} of {checkpoint} pins {pinned}, not {provider}"

    versions = frozenset(range(1, len(batches) + 1))
    dirs = state_store_dirs(checkpoint)
    assert len(dirs) >= SHUFFLE_PARTITIONS * stores_per_partition, f"store dirs: {dirs}"
    assert len(dirs) % (SHUFFLE_PARTITIONS * stores_per_partition) == 0, f"store dirs: {dirs}"
    journal, snapshot = (
        ("delta", "snapshot") if provider == HDFS_PROVIDER else ("hs-journal", "hs-snapshot")
    )
    result = []
    for d in dirs:
        files = store_files(d)
        foreign = set(files.versions) - {journal, snapshot}
        assert not foreign, f"{d} holds {sorted(foreign)} files, foreign to {provider}"
        assert files.of(journal) == versions, (
            f"{d}: {journal} versions {sorted(files.of(journal))}, expected {sorted(versions)}"
        )
        assert files.of(snapshot) <= versions, f"{d}: snapshots {sorted(files.of(snapshot))}"
        result.append(files)
    return result


def minutes(col_name: str) -> str:
    """SQL for a timestamp column as whole minutes after ``EPOCH_2024``."""
    return f"CAST((unix_seconds({col_name}) - {EPOCH_2024}) / 60 AS INT)"


def event_time(col_name: str = "t") -> str:
    """SQL for the event timestamp of a row whose ``col_name`` holds minutes after 2024."""
    return f"timestamp_seconds({EPOCH_2024} + {col_name} * 60)"
