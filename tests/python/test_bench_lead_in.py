"""W1's lead-in before its fresh-process restarts (``bench/w1.py``): batches run until a restart
would read ``--restart-journals`` journals above a snapshot in some store, and the restarts then
run the batches after them. Real state folders with the providers' file names stand in for the
query's; no Spark."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import w1  # bench/ is a folder of scripts, put on the path above

STORES = ("0/0", "0/1", "0/2", "0/3")


def _state(tmp_path: Path) -> Path:
    return tmp_path / "work" / "checkpoint" / "state"


def _commit(state: Path, version: int, snapshot_every: int) -> None:
    """Each store commits ``version`` with a journal (an HDFS delta), and a snapshot at the
    versions of its own phase in a cycle of ``snapshot_every`` (partition p at p * 3 mod it)."""
    for p, store in enumerate(STORES):
        folder = state / store
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{version}.delta").write_bytes(b"d")
        if version % snapshot_every == (p * 3) % snapshot_every:
            (folder / f"{version}.snapshot").write_bytes(b"s")


def _fake_batches(monkeypatch: pytest.MonkeyPatch, state: Path, snapshot_every: int) -> list[int]:
    """Replace the query's batch with one that commits the batch's version (batch + 1) in
    every store; returns the list the batch ids it ran go to."""
    ran: list[int] = []

    def run_one_batch(query: Any, spec: dict[str, Any], batch: int, files: Any, pid: int):
        ran.append(batch)
        _commit(state, batch + 1, snapshot_every)
        return {
            "batch": batch,
            "trigger_ms": 10,
            "commit_ms": 1,
            "state_bytes_new": 1,
            "state_bytes_total": 1,
            "memory_used_bytes": 1,
        }

    monkeypatch.setattr(w1, "_run_one_batch", run_one_batch)
    return ran


def _chains_longest(state: Path) -> int:
    return w1.longest_chain(w1.recovery_chains(state))


def test_lead_in_stops_at_the_first_batch_that_leaves_enough_journals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    for version in range(1, 31):  # the measured batches 0 to 29
        _commit(state, version, 10)
    before = _chains_longest(state)
    ran = _fake_batches(monkeypatch, state, 10)
    spec = {"work_dir": str(tmp_path / "work"), "restart_journals": 9, "provider": "hdfs"}

    records = w1._lead_in(None, spec, None, 0, 30)

    # Partition 1 snapshots at versions 3, 13, 23 and 33: 24 to 30 lie above 23, and batch 31
    # commits version 32, the ninth.
    assert before == 7  # the set-up's, not the code's: batches 30 and 31 are what it takes
    assert ran == [30, 31] and [r["batch"] for r in records] == [30, 31]
    assert [w1.longest_chain(r["recovery_chains"]) for r in records] == [8, 9]
    assert records[-1]["recovery_chains"] == w1.recovery_chains(state)


def test_no_lead_in_when_a_store_already_has_enough_journals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _state(tmp_path)
    for version in range(1, 31):
        _commit(state, version, 10)
    ran = _fake_batches(monkeypatch, state, 10)
    spec = {"work_dir": str(tmp_path / "work"), "restart_journals": 7, "provider": "hdfs"}

    assert w1._lead_in(None, spec, None, 0, 30) == []
    assert ran == []


def test_no_lead_in_for_a_provider_without_journals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state(tmp_path)
    for store in STORES:  # RocksDB without changelog: a zip each version
        (state / store).mkdir(parents=True)
        for version in range(1, 31):
            (state / store / f"{version}.zip").write_bytes(b"z")
    ran = _fake_batches(monkeypatch, state, 1)
    spec = {"work_dir": str(tmp_path / "work"), "restart_journals": 9, "provider": "rocksdb"}

    assert w1._lead_in(None, spec, None, 0, 30) == []
    assert ran == []
    assert "lead-in: none, the provider writes no journals" in capsys.readouterr().err


def test_lead_in_gives_up_after_its_most_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state(tmp_path)
    _commit(state, 1, 1)
    ran = _fake_batches(monkeypatch, state, 1)  # a snapshot every version: never a journal above
    spec = {"work_dir": str(tmp_path / "work"), "restart_journals": 9, "provider": "rocksdb"}

    records = w1._lead_in(None, spec, None, 0, 30)

    assert ran == list(range(30, 30 + w1.LEAD_IN_MAX))
    assert len(records) == w1.LEAD_IN_MAX
    assert "20 batches and no store with 9 journals above a snapshot" in capsys.readouterr().err


def _hdfs_maintenance(state: Path) -> list[int]:
    """What HDFS's maintenance pass does: snapshot the newest version of every store with more
    than 10 deltas above its snapshot. Returns the versions it snapshotted."""
    written = []
    for chain in w1.recovery_chains(state):
        if chain["journals_above"] > 10:
            (state / chain["store"] / f"{chain['version']}.snapshot").write_bytes(b"s")
            written.append(chain["version"])
    return written


def _measured_then_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_wait: Any, snapshot_every: int = 1000
) -> tuple[Path, list[int], list[float], dict[str, Any], Callable[[float], None]]:
    """The measured batches' versions 1 to 30 in four HDFS-like stores (see ``_commit``; at the
    default ``snapshot_every`` a snapshot at version 3p in partition p only, with 30, 27, 24 and 21
    deltas above them), the batch faked, and ``time.sleep`` replaced by one that records each wait
    and then calls ``on_wait(state)`` (a background snapshot, or nothing). Returns the state
    folder, the batches run, the waits and the spec."""
    state = _state(tmp_path)
    for version in range(1, 31):
        _commit(state, version, snapshot_every)
    ran = _fake_batches(monkeypatch, state, snapshot_every)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        on_wait(state)

    spec = {"work_dir": str(tmp_path / "work"), "restart_journals": 9, "provider": "hdfs"}
    return state, ran, waits, spec, sleep


def test_lead_in_reads_the_chains_again_after_a_maintenance_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """w1-stop72a: the measured batches leave chains of 11 and more, which HDFS's maintenance
    snapshots just after they were read. The lead-in waits, sees them shorten, and runs batches
    until chains long enough survive the wait (HDFS leaves 9 and 10 alone)."""
    snapshotted: list[list[int]] = []
    state, ran, waits, spec, sleep = _measured_then_waits(
        tmp_path, monkeypatch, lambda state: snapshotted.append(_hdfs_maintenance(state))
    )
    settles: list[dict[str, Any]] = []

    records = w1._lead_in(None, spec, None, 0, 30, settle_s=8.0, settles=settles, sleep=sleep)

    # Above snapshots at 0, 3, 6 and 9, the stores hold 30, 27, 24 and 21 deltas: the first wait
    # snapshots all four at version 30, and a read after the margin agrees; nine more batches
    # (versions 31 to 39) leave 9 each, which the second wait keeps.
    assert snapshotted == [[30, 30, 30, 30], [], [], []]
    assert waits == [8.0, w1.LEAD_IN_SETTLE_MARGIN_S, 8.0, w1.LEAD_IN_SETTLE_MARGIN_S]
    assert ran == list(range(30, 39))
    assert [c["journals_above"] for c in w1.recovery_chains(state)] == [9, 9, 9, 9]
    assert records[-1]["recovery_chains"] == w1.recovery_chains(state)
    assert "30 journals above a snapshot became 0 within 8 s" in capsys.readouterr().err
    assert [s["after_batches"] for s in settles] == [0, 9]
    assert [w1.longest_chain(s["before"]) for s in settles] == [30, 9]
    assert [w1.longest_chain(s["after"]) for s in settles] == [0, 9]


def test_lead_in_reads_again_until_a_maintenance_pass_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A maintenance pass that snapshots the stores one after another, one per wait: the lead-in
    does not stop at the first read after the interval, while a long chain is left."""

    def snapshot_one(state: Path) -> None:
        for chain in w1.recovery_chains(state):  # the first store with more than 10 deltas
            if chain["journals_above"] > 10:
                (state / chain["store"] / f"{chain['version']}.snapshot").write_bytes(b"s")
                return

    state, ran, waits, spec, sleep = _measured_then_waits(tmp_path, monkeypatch, snapshot_one)

    w1._lead_in(None, spec, None, 0, 30, settle_s=8.0, sleep=sleep)

    # Four stores over 10: snapshotted at the wait and the next three reads; the fifth read
    # agrees with the fourth. Then nine batches and a wait that changes nothing.
    margin = w1.LEAD_IN_SETTLE_MARGIN_S
    assert waits == [8.0, margin, margin, margin, margin, 8.0, margin]
    assert ran == list(range(30, 39))
    assert [c["journals_above"] for c in w1.recovery_chains(state)] == [9, 9, 9, 9]


def test_lead_in_with_waits_still_gives_up_after_its_most_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A provider that snapshots in the background whenever the lead-in waits never keeps a
    long chain: the lead-in still stops at LEAD_IN_MAX batches."""

    def snapshot_all(state: Path) -> None:
        for chain in w1.recovery_chains(state):  # every store, at its newest version
            (state / chain["store"] / f"{chain['version']}.snapshot").write_bytes(b"s")

    _, ran, waits, spec, sleep = _measured_then_waits(tmp_path, monkeypatch, snapshot_all)

    records = w1._lead_in(None, spec, None, 0, 30, settle_s=8.0, sleep=sleep)

    assert len(records) == w1.LEAD_IN_MAX and ran == list(range(30, 30 + w1.LEAD_IN_MAX))
    # A wait after the chains reach 9 (first from the measured batches, then at lead-in batches
    # 9 and 18): each undone at once, its next read agreeing.
    assert waits.count(8.0) == 3
    assert "20 batches and no store with 9 journals above a snapshot" in capsys.readouterr().err


def test_lead_in_without_a_background_snapshot_waits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, ran, waits, spec, sleep = _measured_then_waits(
        tmp_path, monkeypatch, lambda state: None, snapshot_every=10
    )

    records = w1._lead_in(None, spec, None, 0, 30, settle_s=4.5, sleep=sleep)

    assert ran == [30, 31] and len(records) == 2
    assert waits == [4.5, w1.LEAD_IN_SETTLE_MARGIN_S]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5s", 5.0),
        ("500ms", 0.5),
        ("1min", 60.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("2000000us", 2.0),
        ("60000", 60.0),  # no unit: milliseconds, as Spark gives this conf's default
        (" 5S ", 5.0),
        (None, 60.0),
    ],
)
def test_maintenance_seconds(value: str | None, seconds: float) -> None:
    assert w1.maintenance_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", "1.5s", "5 s", "5sec", "", "s"])
def test_maintenance_seconds_names_the_conf_on_a_value_spark_refuses(value: str) -> None:
    with pytest.raises(ValueError, match=rf"maintenanceInterval: not a time: '{value}'"):
        w1.maintenance_seconds(value)


def test_restarts_run_the_batches_after_the_lead_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restart i runs batch batches + (lead-in batches) + i: each restart's data file is the
    next one, never one a batch already took."""
    restart_batches: list[int] = []

    def run_worker(python: str, script: Path, argv: list[str], log: Path, env: Any) -> None:
        spec = json.loads(Path(argv[argv.index("--spec") + 1]).read_text())
        if argv[argv.index("--worker") + 1] == "run":
            result = {"batches": [{"batch": b} for b in range(30)], "lead_in": [{}, {}, {}]}
        else:
            restart_batches.append(spec["restart_batch"])
            result = {"restart": {"batch": spec["restart_batch"]}}
        Path(spec["out"]).write_text(json.dumps(result))

    monkeypatch.setattr(w1, "run_worker", run_worker)
    spec = {
        "provider": "hdfs",
        "batches": 30,
        "restart": "fresh-process",
        "restarts": 3,
        "spark_confs": {},
    }

    w1.run_provider("python", spec, tmp_path, tmp_path, "1g", [])

    assert restart_batches == [33, 34, 35]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--size", "full"], w1.RESTART_JOURNALS),
        (["--size", "full", "--restart-journals", "0"], 0),
        (["--size", "full", "--restart", "same-process", "--jvm", "shared"], 0),
        (["--size", "small"], 0),
    ],
)
def test_restart_journals_default_to_the_target_only_for_fresh_process_restarts(
    argv: list[str], expected: int
) -> None:
    assert w1.parse_args(argv).restart_journals == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--restart-journals", "-1"], "--restart-journals must be at least 0"),
        (["--restart-journals", "9"], "--restart-journals needs --restart fresh-process"),
    ],
)
def test_a_bad_restart_journals_is_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        w1.parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_run_generates_a_file_for_every_batch_it_can_drop() -> None:
    led = w1.parse_args(["--size", "full", "--batches", "30", "--restarts", "3"])
    assert w1.data_files(led) == 30 + w1.LEAD_IN_MAX + 3
    plain = w1.parse_args(["--size", "full", "--batches", "30", "--restart-journals", "0"])
    assert w1.data_files(plain) == 31


def test_the_restart_target_names_the_journals_each_restart_read() -> None:
    hs = {
        "restart_trigger_ms": 900.0,
        "restart_journals_asked": 9,
        "restart_journals_read": [9, 10],
    }
    hdfs = {"restart_trigger_ms": 3000.0, "restart_journals_asked": 9, "restart_journals_read": [8]}
    target = next(
        t for t in w1.targets({"heapstate": hs, "hdfs": hdfs}) if "restart" in t["target"]
    )
    assert target["pass"] is True
    assert target["detail"] == (
        "; the most journals a restart read in one store: heapstate 9, 10; HDFS 8"
        " (the lead-in asked for 9); SHORT of it: HDFS"
    )
    old = {"restart_trigger_ms": 900.0, "restart_journals_read": [3]}
    detail = w1.restart_detail(old, {"restart_trigger_ms": 3000.0})
    assert detail == "; the most journals a restart read in one store: heapstate 3"
