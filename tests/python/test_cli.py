"""The ``heapstate`` command line: ``submit-args`` and ``inspect``.

``inspect`` runs in this process (it then verifies through the suite's session) and once as a
separate process, which starts its own JVM. The checkpoints it inspects come from real queries:

- a streaming count on heapstate over three batches whose keys never repeat, so that every
  journal's record count, and every snapshot's, follows from the batches;
- the same on the HDFS provider, whose stores ``inspect`` lists without verifying.

Each is copied once its query has stopped, so that no maintenance task writes into the copy
while it is inspected. The expectations are worked out from the copy's own file listing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import heapstate
import pytest
from conftest import (
    HDFS_PROVIDER,
    HEAPSTATE_PROVIDER,
    PROVIDER_CONF,
    SHUFFLE_PARTITIONS,
    copy_checkpoint,
    run_count_per_key,
    state_store_dirs,
)
from heapstate._inspection import describe
from heapstate.cli import main
from pyspark.sql import SparkSession

BATCHES = [["a", "b", "c"], ["d", "e"], ["f", "g", "h", "i"]]
"""Keys of each batch; no key occurs twice, so every key is new when its batch runs."""


def make_checkpoint(spark: SparkSession, workdir: Path, provider: str) -> Path:
    """Run a streaming count over ``BATCHES`` on ``provider``; return a copy of its checkpoint."""
    saved = spark.conf.get(PROVIDER_CONF, None)
    spark.conf.set(PROVIDER_CONF, provider)
    try:
        run_count_per_key(spark, workdir, BATCHES)
    finally:
        if saved is None:
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, saved)
    return copy_checkpoint(workdir / "checkpoint", workdir / "copy")


@pytest.fixture(scope="module")
def heap_checkpoint(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(spark, tmp_path_factory.mktemp("heap"), HEAPSTATE_PROVIDER)


@pytest.fixture(scope="module")
def hdfs_checkpoint(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(spark, tmp_path_factory.mktemp("hdfs"), HDFS_PROVIDER)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def listing(directory: Path) -> dict[str, int]:
    """Every state file of a store directory with its size, as the test sees it."""
    return {
        p.name: p.stat().st_size
        for p in directory.iterdir()
        if p.is_file() and p.suffix in (".hs-journal", ".hs-snapshot", ".delta", ".snapshot")
    }


def versions_of(names: dict[str, int], suffix: str) -> list[int]:
    return sorted(int(n.split(".")[0]) for n in names if n.endswith(suffix))


# --------------------------------------------------------------------------------------------
# submit-args


def test_submit_args_prints_the_flags(
    capsys: pytest.CaptureFixture[str], no_spark_defaults: None
) -> None:
    code, out, err = run_cli(capsys, "submit-args")
    assert (code, err) == (0, "")
    assert shlex.split(out) == [
        "--jars",
        heapstate.jar_path(),
        "--conf",
        "spark.plugins=heapstate.TaskActivityPlugin",
        "--conf",
        f"{PROVIDER_CONF}={HEAPSTATE_PROVIDER}",
    ]
    code, out, err = run_cli(capsys, "submit-args", "--no-task-plugin")
    assert (code, err) == (0, "")
    assert shlex.split(out) == [
        "--jars",
        heapstate.jar_path(),
        "--conf",
        f"{PROVIDER_CONF}={HEAPSTATE_PROVIDER}",
    ]


def test_submit_args_passes_options(
    capsys: pytest.CaptureFixture[str], no_spark_defaults: None
) -> None:
    code, out, _ = run_cli(
        capsys,
        "submit-args",
        "--compaction-interval",
        "4",
        "--codec",
        "none",
        "--undo-versions",
        "0",
    )
    assert code == 0
    assert shlex.split(out) == [
        "--jars",
        heapstate.jar_path(),
        "--conf",
        "spark.plugins=heapstate.TaskActivityPlugin",
        "--conf",
        f"{PROVIDER_CONF}={HEAPSTATE_PROVIDER}",
        "--conf",
        "spark.sql.streaming.stateStore.heapstate.compactionInterval=4",
        "--conf",
        "spark.sql.streaming.stateStore.heapstate.compressionCodec=none",
        "--conf",
        "spark.sql.streaming.stateStore.heapstate.undoVersions=0",
    ]


def test_submit_args_rejects_a_bad_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "submit-args", "--compaction-interval", "0")
    assert (code, out) == (2, "")
    assert err == (
        "heapstate submit-args: error: heapstate option compaction_interval must be an "
        "integer >= 1, not 0\n"
    )


# --------------------------------------------------------------------------------------------
# inspect: a healthy heapstate checkpoint


def expected_heap_store(directory: Path, partition: int) -> dict[str, Any]:
    """What ``inspect --json`` must say of one heapstate store, from its files and BATCHES."""
    names = listing(directory)
    journals = versions_of(names, ".hs-journal")
    snapshots = versions_of(names, ".hs-snapshot")
    assert journals == [1, 2, 3], f"{directory}: {sorted(names)}"
    return {
        "operator": 0,
        "partition": partition,
        "store": "default",
        "path": str(directory),
        "providers": [HEAPSTATE_PROVIDER],
        "versionsPresent": [1, 2, 3],
        "bytesByKind": {
            k: v
            for k, v in {
                "journal": sum(b for n, b in names.items() if n.endswith(".hs-journal")),
                "snapshot": sum(b for n, b in names.items() if n.endswith(".hs-snapshot")),
            }.items()
            if k == "journal" or snapshots
        },
        "verified": True,
        "snapshots": snapshots,
    }


def test_inspect_json_verifies_every_file_and_gives_recovery_chains(
    capsys: pytest.CaptureFixture[str], heap_checkpoint: Path
) -> None:
    code, out, err = run_cli(capsys, "inspect", str(heap_checkpoint), "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["checkpoint"] == str(heap_checkpoint)
    assert report["provider"] == HEAPSTATE_PROVIDER
    assert report["providerPinnedIn"] == "offsets/2"
    assert report["verified"] is True
    assert report["problems"] == []

    dirs = state_store_dirs(heap_checkpoint)
    assert [s["path"] for s in report["stores"]] == [str(d) for d in dirs]
    assert len(dirs) == SHUFFLE_PARTITIONS
    journal_records = {1: 0, 2: 0, 3: 0}
    for partition, (store, directory) in enumerate(zip(report["stores"], dirs)):
        expected = expected_heap_store(directory, partition)
        snapshots = expected.pop("snapshots")
        assert {k: store[k] for k in expected} == expected

        names = listing(directory)
        assert [(f["name"], f["bytes"]) for f in store["files"]] == sorted(
            names.items(), key=lambda nb: (int(nb[0].split(".")[0]), nb[0])
        )
        records_so_far = 0
        for f in store["files"]:
            assert (f["status"], f["codec"]) == ("ok", "zstd"), f
            if f["kind"] == "journal":
                journal_records[f["version"]] += f["records"]
                records_so_far += f["records"]
            else:
                # Keys never repeat: a snapshot holds every key its partition's journals
                # wrote up to its version (journals come before the snapshot of a version).
                assert f["records"] == records_so_far, f

        assert store["versions"] == [
            {
                "version": v,
                "recoversFrom": f"{base}.hs-snapshot" if base else "empty",
                "journalChain": v - base,
                "recoverable": True,
            }
            for v in (1, 2, 3)
            for base in [max([s for s in snapshots if s <= v], default=0)]
        ]
    # Each batch's keys are spread over the partitions, each written once.
    assert journal_records == {v: len(keys) for v, keys in enumerate(BATCHES, start=1)}


def expected_recovery_lines(snapshots: list[int]) -> list[str]:
    """The recovery lines of a store with journals 1-3 and these snapshots, all intact:
    consecutive versions with the same base share a line."""
    runs: list[list[int]] = []  # [first, last, base]
    for v in (1, 2, 3):
        base = max([s for s in snapshots if s <= v], default=0)
        if runs and runs[-1][2] == base:
            runs[-1][1] = v
        else:
            runs.append([v, v, base])
    lines = []
    for first, last, base in runs:
        source = f"{base}.hs-snapshot" if base else "empty"
        if first == last:
            lines.append(f"    version {first}: from {source}, journal chain {first - base}")
        else:
            lines.append(
                f"    versions {first}-{last}: from {source}, "
                f"journal chain {first - base}-{last - base}"
            )
    return lines


def test_inspect_text_shows_each_store(
    capsys: pytest.CaptureFixture[str], heap_checkpoint: Path
) -> None:
    code, out, err = run_cli(capsys, "inspect", str(heap_checkpoint))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:3] == [
        f"checkpoint  {heap_checkpoint}",
        f"provider    {HEAPSTATE_PROVIDER} (pinned in offsets/2)",
        "stores      2 (heapstate files verified through the JVM)",
    ]
    assert lines[-1] == "problems    none"
    for partition, directory in enumerate(state_store_dirs(heap_checkpoint)):
        header = f"operator 0, partition {partition}, store default: HeapStateStoreProvider"
        start = lines.index(header)
        assert lines[start + 1 : start + 3] == [f"  path      {directory}", "  versions  1-3"]
        names = listing(directory)
        journal_bytes = sum(b for n, b in names.items() if n.endswith(".hs-journal"))
        assert lines[start + 3].startswith(f"  bytes     journal {journal_bytes:,} B")
        assert lines[start + 4] == "  files"
        file_lines = lines[start + 5 : start + 5 + len(names)]
        assert [line.split()[0] for line in file_lines] == sorted(
            names, key=lambda n: (int(n.split(".")[0]), n)
        )
        for line in file_lines:
            name = line.split()[0]
            assert f" {names[name]:,} B  ok, " in line, line
        assert lines[start + 5 + len(names)] == "  recovery"
        recovery = expected_recovery_lines(versions_of(names, ".hs-snapshot"))
        first = start + 6 + len(names)
        assert lines[first : first + len(recovery)] == recovery


def test_inspect_no_verify_only_lists(
    capsys: pytest.CaptureFixture[str], heap_checkpoint: Path
) -> None:
    def no_jvm(path: Path) -> dict[str, Any]:
        raise AssertionError(f"--no-verify must not use the JVM (asked for {path})")

    report = describe(heap_checkpoint, verify=False, jvm=no_jvm)
    assert report["verified"] is False
    for store, directory in zip(report["stores"], state_store_dirs(heap_checkpoint)):
        assert store["verified"] is False
        assert store["versions"] is None
        assert {f["name"]: f["bytes"] for f in store["files"]} == listing(directory)
        assert all(set(f) == {"name", "kind", "version", "bytes"} for f in store["files"])

    code, out, err = run_cli(capsys, "inspect", "--no-verify", str(heap_checkpoint))
    assert (code, err) == (0, "")
    assert "stores      2 (not verified)" in out.splitlines()
    assert "  recovery" not in out.splitlines()
    assert out.splitlines()[-1] == "problems    none found (not verified)"


# --------------------------------------------------------------------------------------------
# inspect: damaged and missing files


def test_inspect_reports_damaged_and_missing_journals(
    capsys: pytest.CaptureFixture[str], heap_checkpoint: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(heap_checkpoint, broken)
    p0, p1 = state_store_dirs(broken)
    for d in (p0, p1):  # recovery then needs every journal, so each fault shows
        for snapshot in d.glob("*.hs-snapshot"):
            snapshot.unlink()
    damaged = p0 / "2.hs-journal"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    (p1 / "2.hs-journal").unlink()

    code, out, err = run_cli(capsys, "inspect", str(broken), "--json")
    assert (code, err) == (1, "")
    report = json.loads(out)
    s0, s1 = report["stores"]

    bad = [f for f in s0["files"] if f["name"] == "2.hs-journal"]
    assert len(bad) == 1 and bad[0]["status"] == "corrupt", bad
    # The reason is the Scala reader's to give (scalatest covers it); it names file and version.
    assert bad[0]["problem"].startswith(
        f"heapstate: state file file:{damaged} (version 2) cannot be used: "
    ), bad
    assert [f["status"] for f in s0["files"] if f["name"] != "2.hs-journal"] == ["ok", "ok"]
    damaged_problem = "journal 2.hs-journal (version 2) is damaged"
    assert s0["versions"] == [
        {"version": 1, "recoversFrom": "empty", "journalChain": 1, "recoverable": True},
        {"version": 2, "recoverable": False, "problem": damaged_problem},
        {"version": 3, "recoverable": False, "problem": damaged_problem},
    ]
    assert [f["name"] for f in s1["files"]] == ["1.hs-journal", "3.hs-journal"]
    missing_problem = "journal 2.hs-journal (version 2) is missing"
    assert s1["versions"] == [
        {"version": 1, "recoversFrom": "empty", "journalChain": 1, "recoverable": True},
        {"version": 2, "recoverable": False, "problem": missing_problem},
        {"version": 3, "recoverable": False, "problem": missing_problem},
    ]
    assert report["problems"] == [
        f"{p0}/2.hs-journal is corrupt: {bad[0]['problem']}",
        f"{p0}: version 2 cannot be recovered: {damaged_problem}",
        f"{p0}: version 3 cannot be recovered: {damaged_problem}",
        f"{p1}: version 2 cannot be recovered: {missing_problem}",
        f"{p1}: version 3 cannot be recovered: {missing_problem}",
    ]

    code, out, err = run_cli(capsys, "inspect", str(broken))
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert "    version 1: from empty, journal chain 1" in lines
    assert f"    versions 2-3: NOT RECOVERABLE: {damaged_problem}" in lines
    assert f"    versions 2-3: NOT RECOVERABLE: {missing_problem}" in lines
    assert lines[lines.index("problems    5") + 1 :] == [f"  {p}" for p in report["problems"]]


# --------------------------------------------------------------------------------------------
# inspect: another provider's checkpoint


def test_inspect_lists_the_stores_of_another_provider(
    capsys: pytest.CaptureFixture[str], hdfs_checkpoint: Path
) -> None:
    code, out, err = run_cli(capsys, "inspect", str(hdfs_checkpoint), "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["provider"], report["providerPinnedIn"]) == (HDFS_PROVIDER, "offsets/2")
    assert report["verified"] is False  # only heapstate's files are verified
    assert report["problems"] == []
    dirs = state_store_dirs(hdfs_checkpoint)
    assert len(dirs) == SHUFFLE_PARTITIONS
    for partition, (store, directory) in enumerate(zip(report["stores"], dirs)):
        names = listing(directory)
        assert versions_of(names, ".delta") == [1, 2, 3]
        assert {k: store[k] for k in ("operator", "partition", "store", "providers")} == {
            "operator": 0,
            "partition": partition,
            "store": "default",
            "providers": [HDFS_PROVIDER],
        }
        assert store["versionsPresent"] == sorted({int(n.split(".")[0]) for n in names})
        assert store["bytesByKind"]["delta"] == sum(
            b for n, b in names.items() if n.endswith(".delta")
        )
        assert [(f["name"], f["kind"], f["bytes"]) for f in store["files"]] == [
            (n, n.split(".")[1], names[n])
            for n in sorted(names, key=lambda n: (int(n.split(".")[0]), n))
        ]
        assert store["versions"] is None
    text_code, text, _ = run_cli(capsys, "inspect", str(hdfs_checkpoint))
    assert text_code == 0
    assert "operator 0, partition 1, store default: HDFSBackedStateStoreProvider" in text


# --------------------------------------------------------------------------------------------
# inspect: errors


def test_inspect_refuses_what_is_not_a_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "file.txt").write_text("x")
    cases = {
        str(tmp_path / "plain"): f"{tmp_path / 'plain'} is not a streaming checkpoint: it has "
        "no offsets/ directory and no metadata file",
        str(tmp_path / "missing"): f"{tmp_path / 'missing'}: no such file or directory",
        str(tmp_path / "file.txt"): f"{tmp_path / 'file.txt'} is a file, not a checkpoint "
        "directory",
        "s3a://bucket/cp": "s3a://bucket/cp: heapstate reads local checkpoints only (a path or "
        "a file: URI)",
    }
    for path, message in cases.items():
        code, out, err = run_cli(capsys, "inspect", path)
        assert (code, out, err) == (2, "", f"heapstate inspect: error: {message}\n"), path


def test_inspect_names_a_broken_offset_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    entry = tmp_path / "offsets" / "0"
    entry.parent.mkdir()
    entry.write_text("v1\nnot json\n")
    code, out, err = run_cli(capsys, "inspect", str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"heapstate inspect: error: {entry}: line 2 is not the JSON metadata of an offset "
        "log: 'not json'\n"
    )


def test_inspect_of_a_checkpoint_without_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "metadata").write_text('{"id":"x"}')
    code, out, err = run_cli(capsys, "inspect", str(tmp_path))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"checkpoint  {tmp_path}",
        "provider    not pinned yet (no batch has started)",
        "stores      0 (not verified)",
        "            no state files (no stateful operator, or no batch committed)",
        "",
        "problems    none found (not verified)",
    ]


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["frobnicate"])
    assert raised.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# The installed console script, in its own process and JVM


def test_console_script_inspects_in_its_own_jvm(
    capsys: pytest.CaptureFixture[str], heap_checkpoint: Path
) -> None:
    script = Path(sys.executable).parent / "heapstate"
    assert script.is_file(), f"the console script is not installed at {script}"
    done = subprocess.run(
        [str(script), "inspect", str(heap_checkpoint), "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr
    code, out, _ = run_cli(capsys, "inspect", str(heap_checkpoint), "--json")
    assert code == 0
    assert json.loads(done.stdout) == json.loads(out)

    done = subprocess.run(
        [sys.executable, "-m", "heapstate", "inspect", str(heap_checkpoint / "state")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"heapstate inspect: error: {heap_checkpoint / 'state'} is not a streaming "
        "checkpoint: it has no offsets/ directory and no metadata file\n"
    )
