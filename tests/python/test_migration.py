"""``heapstate migrate``: a stopped query moves between Spark's HDFS provider and heapstate and
continues exactly where it stopped.

For each operator family (aggregation, dropDuplicates, session window, stream-stream join,
flatMapGroupsWithState through ``applyInPandasWithState``):

- the reference runs on the HDFS provider: 3 input files, stop, 3 more files, restart;
- the migrated query runs the same 3 files on HDFS, stops, is migrated to heapstate, and runs
  the 3 more files. The session still names the HDFS provider when it restarts, so only the
  migrated checkpoint can make the query run on heapstate.

The two must produce the same micro-batches and end with the same state, read through Spark's
state data source (``statestore``), store by store. The reference stops at the same point as the
migrated query rather than running all 6 files at once: under ``Trigger.AvailableNow`` Spark ends
each run with a no-data batch when the watermark moved, which shifts batch ids on any provider.
(For aggregation, whose runs have no such batch, the output is also checked against the model of
an uninterrupted run.) The reverse direction, heapstate to HDFS, is checked the same way.

The refusals (active query, uncommitted batch, RocksDB, already migrated, a conversion that fails)
must leave every file of the checkpoint as it was, and so must ``--dry-run``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    HDFS_PROVIDER,
    HEAPSTATE_PROVIDER,
    PROVIDER_CONF,
    SHUFFLE_PARTITIONS,
    Build,
    PipelineRun,
    Rows,
    Source,
    committed_batches,
    copy_checkpoint,
    offset_log_metadata,
    read_stream,
    run_available_now,
    run_with_restart,
    sorted_rows,
    state_store_dirs,
    store_files,
    write_input_file,
)
from heapstate._migration import BACKUP_DIR, STAGING_DIR, MigrationRefused, migrate
from heapstate.cli import main
from pyspark.sql import SparkSession
from test_operators import (
    AGG_BATCHES,
    DEDUP_BATCHES,
    SESSION_BATCHES,
    TIMEOUT_BATCHES,
    aggregation_model,
    build_aggregation,
    build_count_until_timeout,
    build_drop_duplicates,
    build_join,
    build_session_window,
    join_sources,
    rows_of,
)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FIRST_BATCHES = 3
JOIN_STORES = (
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
)


# --------------------------------------------------------------------------------------------
# The operator families


@dataclass(frozen=True)
class Family:
    """One stateful pipeline, its input and the stores each of its partitions has."""

    sources: Mapping[str, Source]
    build: Build
    output_mode: str
    stores: tuple[str, ...] = ("default",)


# The pipelines and inputs of test_operators.py, so that a migrated run is held to the same
# operators as an unmigrated one.
FAMILIES: dict[str, Family] = {
    "aggregation": Family(
        {"in": Source("k STRING, v INT", rows_of(AGG_BATCHES))}, build_aggregation, "update"
    ),
    "drop_duplicates": Family(
        {"in": Source("k STRING, v INT", rows_of(DEDUP_BATCHES))}, build_drop_duplicates, "append"
    ),
    "session_window": Family(
        {"in": Source("k STRING, v INT, t INT", rows_of(SESSION_BATCHES))},
        build_session_window,
        "append",
    ),
    "stream_stream_join": Family(join_sources(), build_join("left_outer"), "append", JOIN_STORES),
    "flat_map_groups_with_state": Family(
        {"in": Source("k STRING, v INT, t INT", rows_of(TIMEOUT_BATCHES))},
        build_count_until_timeout,
        "update",
    ),
}

EXPECTED_AFTER_RESTART: dict[str, Rows] = {
    # Rows after the restart that only state from before it can produce.
    "aggregation": [("a", 4, 15)],
    "drop_duplicates": [],  # checked below: a and b are not emitted again
    "session_window": [("a", 0, 14, 4)],
    "stream_stream_join": [("b", 1, None), ("d", 4, None)],
    "flat_map_groups_with_state": [("a", 4, "update"), ("a", 4, "timeout")],
}


# --------------------------------------------------------------------------------------------
# Running, migrating and reading back


def _source_dirs(workdir: Path, family: Family) -> dict[str, tuple[Path, str]]:
    return {name: (workdir / "input" / name, src.schema) for name, src in family.sources.items()}


def _feed(workdir: Path, family: Family, indexes: range) -> None:
    for name, src in family.sources.items():
        for i in indexes:
            write_input_file(workdir / "input" / name, i, src.batches[i])


@dataclass
class MigratedRun:
    run: PipelineRun
    report: dict[str, Any]
    offsets_before: str
    """The newest offset log entry as the first run left it."""


def run_migrated(
    spark: SparkSession, workdir: Path, family: Family, start: str, to: str
) -> MigratedRun:
    """First 3 files on ``start``, stop, migrate to ``to``, then the rest; the session keeps
    naming ``start``, so the second run is on ``to`` only if the checkpoint says so."""
    checkpoint = workdir / "checkpoint"
    dirs = _source_dirs(workdir, family)
    total = len(next(iter(family.sources.values())).batches)
    _feed(workdir, family, range(FIRST_BATCHES))
    first = run_available_now(spark, start, family.build, dirs, checkpoint, family.output_mode)
    newest = committed_batches(checkpoint)[-1]
    offsets_before = (checkpoint / "offsets" / str(newest)).read_text()
    report = migrate(checkpoint, to, idle_seconds=0)
    _feed(workdir, family, range(FIRST_BATCHES, total))
    second = run_available_now(spark, start, family.build, dirs, checkpoint, family.output_mode)
    return MigratedRun(PipelineRun(start, checkpoint, first, second), report, offsets_before)


def final_state(spark: SparkSession, checkpoint: Path, stores: Sequence[str]) -> dict[str, Rows]:
    """Every store's rows (key, value, partition) as Spark's state data source reads them."""
    return {
        store: sorted_rows(
            spark.read.format("statestore")
            .option("storeName", store)
            .load(str(checkpoint))
            .collect()
        )
        for store in stores
    }


_references: dict[str, PipelineRun] = {}


@pytest.fixture(autouse=True)
def _keep_session_provider(spark: SparkSession) -> Iterator[None]:
    """The runs here set the session's provider; later test modules expect it as it was."""
    saved = spark.conf.get(PROVIDER_CONF, None)
    yield
    if saved is None:
        spark.conf.unset(PROVIDER_CONF)
    else:
        spark.conf.set(PROVIDER_CONF, saved)


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference")


def reference(spark: SparkSession, reference_dir: Path, name: str) -> PipelineRun:
    """The family's run on the HDFS provider, stopped and restarted where the migrated one is."""
    if name not in _references:
        family = FAMILIES[name]
        _references[name] = run_with_restart(
            spark,
            reference_dir / name,
            HDFS_PROVIDER,
            family.sources,
            family.build,
            family.output_mode,
            FIRST_BATCHES,
        )
    return _references[name]


def tree(directory: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``directory`` (hidden ones included) with its size and SHA-256."""
    return {
        str(p.relative_to(directory)): (
            p.stat().st_size,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def assert_continues_as_reference(
    spark: SparkSession, migrated: MigratedRun, ref: PipelineRun, family: Family
) -> None:
    """The migrated query's output before and after the migration, and its final state, equal
    the unmigrated reference's."""
    assert migrated.run.first_run == ref.first_run
    assert migrated.run.second_run == ref.second_run
    assert final_state(spark, migrated.run.checkpoint, family.stores) == final_state(
        spark, ref.checkpoint, family.stores
    )


def assert_migrated_checkpoint(
    migrated: MigratedRun, source: str, target: str, stores_per_partition: int
) -> None:
    """The report, the provider pins, the state files and the backup of a migrated checkpoint."""
    checkpoint = migrated.run.checkpoint
    first_batches = [b for b, _ in migrated.run.first_run]
    n = first_batches[-1]
    version = n + 1
    report = migrated.report
    assert (report["source"], report["target"]) == (source, target)
    assert (report["batch"], report["version"]) == (n, version)
    assert len(report["stores"]) == SHUFFLE_PARTITIONS * stores_per_partition
    assert all(s["verified"] for s in report["stores"])

    # Pins: the batches before the last committed one keep the source provider, so Spark's
    # state data source reads them with it; the last one and every later batch pin the target.
    batches = committed_batches(checkpoint)
    assert batches == list(range(len(batches))) and batches[-1] > n
    for b in batches:
        pinned = offset_log_metadata(checkpoint, b)["conf"][PROVIDER_CONF]
        assert pinned == (source if b < n else target), f"offsets/{b} pins {pinned}"

    # Files: the source's files up to the migrated version, the target's snapshot of it, then
    # the target's files for every later version, and nothing of the target's before it.
    last = batches[-1] + 1
    src_delta, tgt_delta, tgt_snapshot = (
        ("delta", "hs-journal", "hs-snapshot")
        if target == HEAPSTATE_PROVIDER
        else ("hs-journal", "delta", "snapshot")
    )
    dirs = state_store_dirs(checkpoint)
    assert len(dirs) == SHUFFLE_PARTITIONS * stores_per_partition
    written = []
    for d in dirs:
        files = store_files(d)
        assert files.of(src_delta) == frozenset(range(1, version + 1)), d
        assert files.of(tgt_delta) == frozenset(range(version + 1, last + 1)), d
        assert version in files.of(tgt_snapshot), d
        assert min(files.of(tgt_snapshot)) == version, d
        written.append(str(d / f"{version}.{tgt_snapshot}"))
    newest = checkpoint / "offsets" / str(n)
    assert sorted(report["written"]) == sorted([*written, str(newest)])

    # The backup holds the offset log entry as it was, and the manifest says what was done.
    backup = Path(report["backup"])
    assert backup.parent == checkpoint / BACKUP_DIR
    assert (backup / "offsets" / str(n)).read_text() == migrated.offsets_before
    assert json.loads(migrated.offsets_before.split("\n")[1])["conf"][PROVIDER_CONF] == source
    manifest = json.loads((backup / "MIGRATION.json").read_text())
    assert (manifest["from"], manifest["to"], manifest["batch"]) == (source, target, n)
    assert manifest["offsetLogEntry"] == f"offsets/{n}"
    assert sorted(manifest["stateFilesAdded"]) == sorted(
        str(Path(w).relative_to(checkpoint)) for w in written
    )
    assert not (checkpoint / STAGING_DIR).exists()


# --------------------------------------------------------------------------------------------
# HDFS to heapstate, every family


@pytest.mark.parametrize("name", list(FAMILIES))
def test_migrate_to_heapstate_continues_where_it_stopped(
    spark: SparkSession, tmp_path: Path, reference_dir: Path, name: str
) -> None:
    family = FAMILIES[name]
    ref = reference(spark, reference_dir, name)
    migrated = run_migrated(spark, tmp_path, family, HDFS_PROVIDER, "heapstate")

    assert_continues_as_reference(spark, migrated, ref, family)
    assert any(rows for _, rows in ref.second_run), "no output after the restart"
    after = ref.rows_after_restart()
    for row in EXPECTED_AFTER_RESTART[name]:
        assert row in after, f"{row} (from restored state) missing after the restart: {after}"
    if name == "aggregation":
        assert migrated.run.batches == aggregation_model(AGG_BATCHES)
    if name == "drop_duplicates":
        assert not {k for k, _ in after} & {"a", "b"}, after
    assert sum(s["rows"] for s in migrated.report["stores"]) > 0
    assert_migrated_checkpoint(migrated, HDFS_PROVIDER, HEAPSTATE_PROVIDER, len(family.stores))


# --------------------------------------------------------------------------------------------
# heapstate back to HDFS


@pytest.mark.parametrize("name", ["aggregation", "stream_stream_join", "session_window"])
def test_migrate_back_to_hdfs_continues_where_it_stopped(
    spark: SparkSession, tmp_path: Path, reference_dir: Path, name: str
) -> None:
    family = FAMILIES[name]
    ref = reference(spark, reference_dir, name)
    migrated = run_migrated(spark, tmp_path, family, HEAPSTATE_PROVIDER, "hdfs")

    assert_continues_as_reference(spark, migrated, ref, family)
    assert_migrated_checkpoint(migrated, HEAPSTATE_PROVIDER, HDFS_PROVIDER, len(family.stores))


def test_round_trip_hdfs_heapstate_hdfs(
    spark: SparkSession, tmp_path: Path, reference_dir: Path
) -> None:
    """Two batches on each provider in turn: each migration starts from the other's files."""
    family = FAMILIES["aggregation"]
    checkpoint = tmp_path / "checkpoint"
    dirs = _source_dirs(tmp_path, family)
    out = []
    for phase, (provider, to) in enumerate(
        [(HDFS_PROVIDER, "heapstate"), (HDFS_PROVIDER, "hdfs"), (HDFS_PROVIDER, None)]
    ):
        _feed(tmp_path, family, range(2 * phase, 2 * phase + 2))
        out += run_available_now(spark, provider, family.build, dirs, checkpoint, "update")
        if to is not None:
            migrate(checkpoint, to, idle_seconds=0)

    assert out == aggregation_model(AGG_BATCHES)
    pins = [offset_log_metadata(checkpoint, b)["conf"][PROVIDER_CONF] for b in range(6)]
    assert pins == [
        HDFS_PROVIDER,
        HEAPSTATE_PROVIDER,
        HEAPSTATE_PROVIDER,
        HDFS_PROVIDER,
        HDFS_PROVIDER,
        HDFS_PROVIDER,
    ]
    for d in state_store_dirs(checkpoint):
        files = store_files(d)
        assert files.of("delta") == {1, 2, 5, 6}, d
        assert files.of("hs-journal") == {3, 4}, d
        assert 2 in files.of("hs-snapshot") and 4 in files.of("snapshot"), d
    assert len(list((checkpoint / BACKUP_DIR).iterdir())) == 2
    ref = reference(spark, reference_dir, "aggregation")
    assert final_state(spark, checkpoint, family.stores) == final_state(
        spark, ref.checkpoint, family.stores
    )


# --------------------------------------------------------------------------------------------
# Dry run, refusals and failures: nothing changes


@pytest.fixture
def stopped_hdfs_checkpoint(spark: SparkSession, reference_dir: Path, tmp_path: Path) -> Path:
    """A copy of the aggregation reference's checkpoint: HDFS, stopped, every batch committed."""
    return copy_checkpoint(
        reference(spark, reference_dir, "aggregation").checkpoint, tmp_path / "cp"
    )


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_shows_the_plan_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], stopped_hdfs_checkpoint: Path
) -> None:
    cp = stopped_hdfs_checkpoint
    before = tree(cp)
    newest = committed_batches(cp)[-1]
    code, out, err = run_cli(
        capsys, "migrate", str(cp), "--to", "heapstate", "--dry-run", "--idle-seconds", "0"
    )
    assert (code, err) == (0, "")
    assert tree(cp) == before
    lines = out.splitlines()
    assert lines[:4] == [
        f"checkpoint  {cp}",
        f"from        {HDFS_PROVIDER}",
        f"to          {HEAPSTATE_PROVIDER}",
        f"state       batch {newest} (the last committed), version {newest + 1}",
    ]
    # Every key's count and sum, over the two partitions: a, b, c, d.
    assert lines[4] == "stores      2, 4 rows read"
    assert [line.split(": ")[0] for line in lines[5:7]] == [
        "  operator 0 (stateStoreSave), partition 0, store default",
        "  operator 0 (stateStoreSave), partition 1, store default",
    ]
    assert lines[8:12] == [
        "would write 3 files:",
        f"  {cp}/state/0/0/{newest + 1}.hs-snapshot",
        f"  {cp}/state/0/1/{newest + 1}.hs-snapshot",
        f"  {cp}/offsets/{newest}",
    ]
    assert lines[-1] == "dry run: nothing was written"


def test_refuses_while_the_query_looks_active(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spark.conf.set(PROVIDER_CONF, HDFS_PROVIDER)
    write_input_file(tmp_path / "in", 0, [{"k": "a", "v": 1}])
    query = (
        read_stream(spark, tmp_path / "in", "k STRING, v INT")
        .groupBy("k")
        .count()
        .writeStream.outputMode("update")
        .format("memory")
        .queryName("migration_active")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not committed_batches(tmp_path / "cp") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert committed_batches(tmp_path / "cp"), "the query committed no batch within 120 s"
        assert query.isActive
        code, out, err = run_cli(capsys, "migrate", str(tmp_path / "cp"), "--to", "heapstate")
    finally:
        query.stop()
    assert (code, out) == (2, "")
    assert err.startswith(
        f"heapstate migrate: error: the query of {tmp_path / 'cp'} looks active: "
    )
    assert "Stop the query" in err
    # The running query keeps writing, so the files cannot be compared; what the tool would
    # have written can be: no backup, no staging, every offset log entry still on HDFS.
    assert not (tmp_path / "cp" / BACKUP_DIR).exists()
    assert not (tmp_path / "cp" / STAGING_DIR).exists()
    for b in committed_batches(tmp_path / "cp"):
        assert offset_log_metadata(tmp_path / "cp", b)["conf"][PROVIDER_CONF] == HDFS_PROVIDER


def test_refuses_an_uncommitted_batch(stopped_hdfs_checkpoint: Path) -> None:
    cp = stopped_hdfs_checkpoint
    newest = committed_batches(cp)[-1]
    (cp / "commits" / str(newest)).unlink()
    (cp / "commits" / f".{newest}.crc").unlink(missing_ok=True)
    before = tree(cp)
    with pytest.raises(MigrationRefused) as refused:
        migrate(cp, "heapstate", idle_seconds=0)
    assert str(refused.value) == (
        f"{cp} has uncommitted batches: offsets/{newest} was started but batch {newest - 1} is "
        "the last committed. Restart the query on its current provider until it has committed "
        "that batch, stop it, then migrate."
    )
    assert tree(cp) == before


def test_refuses_a_rocksdb_checkpoint(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    family = FAMILIES["aggregation"]
    _feed(tmp_path, family, range(1))
    run_available_now(
        spark,
        ROCKSDB_PROVIDER,
        family.build,
        _source_dirs(tmp_path, family),
        tmp_path / "run",
        family.output_mode,
    )
    # A copy: RocksDB's maintenance thread may still upload and delete files in the original.
    cp = copy_checkpoint(tmp_path / "run", tmp_path / "cp")
    before = tree(cp)
    code, out, err = run_cli(capsys, "migrate", str(cp), "--to", "heapstate", "--idle-seconds", "0")
    assert (code, out) == (2, "")
    assert err == (
        f"heapstate migrate: error: {cp} was made with {ROCKSDB_PROVIDER} (pinned in "
        f"{cp / 'offsets' / '0'}): --to heapstate migrates from {HDFS_PROVIDER} "
        "only. heapstate migrate converts between Spark's HDFS provider and heapstate; it does "
        "not read other providers' state.\n"
    )
    assert tree(cp) == before


def test_refuses_a_checkpoint_already_on_the_target(stopped_hdfs_checkpoint: Path) -> None:
    cp = stopped_hdfs_checkpoint
    newest = committed_batches(cp)[-1]
    with pytest.raises(MigrationRefused) as refused:
        migrate(cp, "hdfs", idle_seconds=0)
    assert str(refused.value) == (
        f"{cp} already uses {HDFS_PROVIDER} (pinned in {cp / 'offsets' / str(newest)}); "
        "nothing to do"
    )


def test_a_failed_conversion_names_the_store_and_changes_nothing(
    stopped_hdfs_checkpoint: Path,
) -> None:
    cp = stopped_hdfs_checkpoint
    version = committed_batches(cp)[-1] + 1
    store = cp / "state" / "0" / "1"
    # Partition 1 can only come from its newest delta, overwritten with bytes that are no
    # compressed stream: the HDFS provider cannot load it.
    (store / f"{version}.snapshot").unlink(missing_ok=True)
    (store / f".{version}.snapshot.crc").unlink(missing_ok=True)
    delta = store / f"{version}.delta"
    delta.write_bytes(b"\0" * 64)
    (store / f".{version}.delta.crc").unlink(missing_ok=True)
    before = tree(cp)
    with pytest.raises(RuntimeError) as failed:
        migrate(cp, "heapstate", idle_seconds=0)
    message = str(failed.value)
    assert message.startswith(
        "nothing was changed: operator 0 (stateStoreSave), partition 1, store default "
        f"({store}): could not convert version {version} from HDFSBackedStateStoreProvider "
        "to HeapStateStoreProvider: "
    ), message
    # The HDFS provider's own error, down to its cause (the default lz4 codec's).
    assert message.endswith("; caused by java.io.IOException: Stream is corrupted"), message
    assert tree(cp) == before
