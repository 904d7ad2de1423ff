"""heapstate's configuration helpers: ``configure``, its options, the live-session toggle and
``checkpoint_provider``, and the runnable examples in the package's docstrings.

The builder tests need no JVM: they read the options a builder collected. The toggle tests use
the suite's session and start real queries, whose checkpoints must pin the provider the toggle
chose. Every test puts the session's provider confs back as they were.
"""

from __future__ import annotations

import doctest
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import heapstate
import heapstate._checkpoint
import heapstate._config
import heapstate._inspection
import heapstate._migration
import heapstate._session
import heapstate.cli
import pytest
from conftest import (
    HDFS_PROVIDER,
    HEAPSTATE_PROVIDER,
    PROVIDER_CONF,
    SHUFFLE_PARTITIONS,
    assert_checkpoint_written_by,
    copy_checkpoint,
    run_count_per_key,
)
from heapstate._session import require_provider_class
from pyspark.sql import SparkSession

PREFIX = "spark.sql.streaming.stateStore.heapstate."
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def builder_options(builder: Any) -> dict[str, str]:
    return dict(builder._options)


# --------------------------------------------------------------------------------------------
# configure() and its options


@pytest.fixture
def no_plugins_elsewhere(monkeypatch: pytest.MonkeyPatch, no_spark_defaults: None) -> None:
    """No ``spark.plugins`` anywhere but the builder: no running JVM to ask (the suite's own
    session is up), no ``PYSPARK_SUBMIT_ARGS``, and no ``spark-defaults.conf``."""
    monkeypatch.setattr(heapstate._config, "_running_jvm_conf", lambda key: None)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)


def test_configure_sets_jar_provider_and_options(no_plugins_elsewhere: None) -> None:
    builder = heapstate.configure(
        SparkSession.builder.master("local[1]"),
        compaction_interval=5,
        codec="lz4",
        undo_versions=0,
    )
    assert builder_options(builder) == {
        "spark.master": "local[1]",
        "spark.jars": heapstate.jar_path(),
        "spark.plugins": heapstate.PLUGIN_CLASS,
        PROVIDER_CONF: HEAPSTATE_PROVIDER,
        PREFIX + "compactionInterval": "5",
        PREFIX + "compressionCodec": "lz4",
        PREFIX + "undoVersions": "0",
    }


def test_configure_without_options_sets_jar_plugin_and_provider_only(
    no_plugins_elsewhere: None,
) -> None:
    builder = heapstate.configure(SparkSession.builder)
    assert builder_options(builder) == {
        "spark.jars": heapstate.jar_path(),
        "spark.plugins": "heapstate.TaskActivityPlugin",
        PROVIDER_CONF: HEAPSTATE_PROVIDER,
    }
    builder = heapstate.configure(SparkSession.builder, task_plugin=False)
    assert builder_options(builder) == {
        "spark.jars": heapstate.jar_path(),
        PROVIDER_CONF: HEAPSTATE_PROVIDER,
    }


def test_configure_appends_to_jars_and_plugins_already_set_and_only_once() -> None:
    builder = SparkSession.builder.config("spark.jars", "/opt/a.jar, /opt/b.jar").config(
        "spark.plugins", "com.example.APlugin"
    )
    heapstate.configure(heapstate.configure(builder))
    assert builder_options(builder)["spark.jars"] == f"/opt/a.jar,/opt/b.jar,{heapstate.jar_path()}"
    assert (
        builder_options(builder)["spark.plugins"]
        == "com.example.APlugin,heapstate.TaskActivityPlugin"
    )


def test_configure_keeps_the_plugins_of_spark_defaults(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_plugins_elsewhere: None,
) -> None:
    # The builder's spark.plugins replaces the one spark-defaults.conf gives; configure() lists
    # both, so that setting heapstate's plugin does not drop the user's.
    (tmp_path / "spark-defaults.conf").write_text(
        "# a comment\n! spark.plugins com.example.Commented\nspark.plugins com.example.Old\n"
        "spark.plugins:  com.example.APlugin,com.example.BPlugin\nspark.executor.memory 2g\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    expected = "com.example.APlugin,com.example.BPlugin,heapstate.TaskActivityPlugin"
    builder = heapstate.configure(SparkSession.builder)
    assert builder_options(builder)["spark.plugins"] == expected
    assert heapstate.cli.main(["submit-args"]) == 0
    assert f"--conf spark.plugins={expected} " in capsys.readouterr().out


def test_configure_keeps_the_plugins_of_pyspark_submit_args_over_spark_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_plugins_elsewhere: None
) -> None:
    (tmp_path / "spark-defaults.conf").write_text("spark.plugins com.example.FromDefaults\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setenv(
        "PYSPARK_SUBMIT_ARGS",
        "--conf spark.plugins=com.example.First --driver-memory 2g "
        "--conf 'spark.plugins=com.example.C, com.example.D' pyspark-shell",
    )
    builder = heapstate.configure(SparkSession.builder)
    assert builder_options(builder)["spark.plugins"] == (
        "com.example.C,com.example.D,heapstate.TaskActivityPlugin"
    )


def test_a_running_jvm_is_asked_for_the_plugins_it_started_with(session: SparkSession) -> None:
    # A session of this Python started already (the suite's, with configure()): the JVM's system
    # properties hold what it was launched with, which a new session in it would start with.
    assert heapstate._config._running_jvm_conf("spark.plugins") == "heapstate.TaskActivityPlugin"
    assert heapstate._config._plugins_elsewhere() == "heapstate.TaskActivityPlugin"


def test_configure_rejects_a_task_plugin_that_is_not_a_bool() -> None:
    with pytest.raises(
        ValueError, match="heapstate option task_plugin must be True or False, not 'no'"
    ):
        heapstate.configure(SparkSession.builder, task_plugin="no")  # type: ignore[arg-type]


def test_the_suite_session_counts_its_tasks_with_heapstates_plugin(session: SparkSession) -> None:
    # The session conftest builds with configure() runs heapstate's plugin: a running task is
    # counted in the JVM that background snapshots pace themselves in, and none once it ended.
    import threading
    import time

    engine = session.sparkContext._jvm.heapstate.engine.StateEngine
    assert heapstate.PLUGIN_CLASS in session.sparkContext.getConf().get("spark.plugins", "")
    assert engine.taskCoresInUse() == 0
    seen: list[int] = []
    done = threading.Event()

    def job() -> None:
        try:
            session.sparkContext.parallelize([3.0], 1).foreach(time.sleep)
        finally:
            done.set()

    runner = threading.Thread(target=job)
    runner.start()
    while not done.is_set():
        seen.append(engine.taskCoresInUse())
        time.sleep(0.02)
    runner.join()
    assert set(seen) <= {0, 1} and seen.count(1) >= 50, (
        f"a 3-second task, polled every 20 ms: {seen}"
    )
    assert engine.taskCoresInUse() == 0


def test_conf_entries_lists_provider_then_options() -> None:
    assert heapstate.conf_entries(undo_versions=3, codec="none") == {
        PROVIDER_CONF: HEAPSTATE_PROVIDER,
        PREFIX + "compressionCodec": "none",
        PREFIX + "undoVersions": "3",
    }
    assert heapstate.conf_entries() == {PROVIDER_CONF: HEAPSTATE_PROVIDER}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"compaction_interval": "5"},
            "heapstate option compaction_interval must be an integer >= 1, not '5' (str)",
        ),
        (
            {"compaction_interval": True},
            "heapstate option compaction_interval must be an integer >= 1, not True (bool)",
        ),
        (
            {"compaction_interval": 2.0},
            "heapstate option compaction_interval must be an integer >= 1, not 2.0 (float)",
        ),
        (
            {"compaction_interval": 0},
            "heapstate option compaction_interval must be an integer >= 1, not 0",
        ),
        (
            {"undo_versions": -1},
            "heapstate option undo_versions must be an integer >= 0, not -1",
        ),
        (
            {"undo_versions": False},
            "heapstate option undo_versions must be an integer >= 0, not False (bool)",
        ),
        (
            {"snapshot_bucket_bytes": 63},
            "heapstate option snapshot_bucket_bytes must be an integer from 64 to 16777216, not 63",
        ),
        (
            {"snapshot_bucket_bytes": 16777217},
            "heapstate option snapshot_bucket_bytes must be an integer from 64 to 16777216, not 16777217",
        ),
        (
            {"bulk_load_snapshot_bytes": -1},
            (
                "heapstate option bulk_load_snapshot_bytes must be an integer from 0 to "
                "2147483647, not -1"
            ),
        ),
        (
            {"bulk_load_snapshot_bytes": 1 << 31},
            (
                "heapstate option bulk_load_snapshot_bytes must be an integer from 0 to "
                "2147483647, not 2147483648"
            ),
        ),
        (
            {"snapshot_bucket_bytes": "4096"},
            (
                "heapstate option snapshot_bucket_bytes must be an integer from 64 to 16777216, "
                "not '4096' (str)"
            ),
        ),
        (
            {"local_copy_dir": "relative/dir"},
            (
                "heapstate option local_copy_dir must be '', 'none' or absolute local paths "
                "separated by commas, not 'relative/dir'"
            ),
        ),
        (
            {"local_copy_dir": "/a,,/b"},
            (
                "heapstate option local_copy_dir must be '', 'none' or absolute local paths "
                "separated by commas, not '/a,,/b'"
            ),
        ),
        (
            {"local_copy_dir": "/a,"},
            (
                "heapstate option local_copy_dir must be '', 'none' or absolute local paths "
                "separated by commas, not '/a,'"
            ),
        ),
        (
            {"local_copy_dir": ","},
            (
                "heapstate option local_copy_dir must be '', 'none' or absolute local paths "
                "separated by commas, not ','"
            ),
        ),
        (
            {"local_copy_dir": "None"},
            (
                "heapstate option local_copy_dir must be '', 'none' or absolute local paths "
                "separated by commas, not 'None'"
            ),
        ),
        (
            {"local_copy_dir": 5},
            (
                "heapstate option local_copy_dir must be '', 'none' or absolute local paths "
                "separated by commas, not 5 (int)"
            ),
        ),
        (
            {"codec": "gzip"},
            "heapstate option codec must be one of zstd, lz4, snappy, none, not 'gzip'",
        ),
        (
            {"codec": "ZSTD"},
            "heapstate option codec must be one of zstd, lz4, snappy, none, not 'ZSTD'",
        ),
        (
            {"codec": 1},
            "heapstate option codec must be one of zstd, lz4, snappy, none, not 1",
        ),
        (
            {"compaction_intervall": 3},
            (
                "unknown heapstate option 'compaction_intervall' (did you mean "
                "'compaction_interval'?); the options are compaction_interval, codec, undo_versions, "
                "snapshot_bucket_bytes, bulk_load_snapshot_bytes, local_copy_dir"
            ),
        ),
        (
            {"compactionInterval": 3},
            (
                "unknown heapstate option 'compactionInterval' (the conf key "
                "spark.sql.streaming.stateStore.heapstate.compactionInterval is the option "
                "'compaction_interval'); the options are compaction_interval, codec, undo_versions, "
                "snapshot_bucket_bytes, bulk_load_snapshot_bytes, local_copy_dir"
            ),
        ),
        (
            {"spark.sql.shuffle.partitions": 3},
            (
                "unknown heapstate option 'spark.sql.shuffle.partitions'; the options are "
                "compaction_interval, codec, undo_versions, snapshot_bucket_bytes, "
                "bulk_load_snapshot_bytes, local_copy_dir"
            ),
        ),
    ],
)
def test_bad_options_raise_value_error_naming_them(options: dict[str, Any], message: str) -> None:
    builder = SparkSession.builder.master("local[1]")
    with pytest.raises(ValueError) as raised:
        heapstate.configure(builder, **options)
    assert str(raised.value) == message
    # Nothing was set: a failed configure leaves the builder as it was.
    assert builder_options(builder) == {"spark.master": "local[1]"}
    with pytest.raises(ValueError) as raised_again:
        heapstate.conf_entries(**options)
    assert str(raised_again.value) == message


def test_boundary_values_are_accepted() -> None:
    assert heapstate.conf_entries(compaction_interval=1, undo_versions=0) == {
        PROVIDER_CONF: HEAPSTATE_PROVIDER,
        PREFIX + "compactionInterval": "1",
        PREFIX + "undoVersions": "0",
    }
    for size in (64, 16777216):
        assert heapstate.conf_entries(snapshot_bucket_bytes=size) == {
            PROVIDER_CONF: HEAPSTATE_PROVIDER,
            PREFIX + "snapshotBucketBytes": str(size),
        }
    for size in (0, 2147483647):
        assert heapstate.conf_entries(bulk_load_snapshot_bytes=size) == {
            PROVIDER_CONF: HEAPSTATE_PROVIDER,
            PREFIX + "bulkLoadSnapshotBytes": str(size),
        }
    for dirs in ("", "none", " none ", "/mnt/a", "/mnt/a,/mnt/b", " /mnt/a , /mnt/b "):
        assert heapstate.conf_entries(local_copy_dir=dirs) == {
            PROVIDER_CONF: HEAPSTATE_PROVIDER,
            PREFIX + "localCopyDir": dirs,
        }
    assert heapstate.conf_entries(local_copy_dir=Path("/mnt/a")) == {
        PROVIDER_CONF: HEAPSTATE_PROVIDER,
        PREFIX + "localCopyDir": "/mnt/a",
    }


# --------------------------------------------------------------------------------------------
# checkpoint_provider()


def write_offsets(checkpoint: Path, batch_id: int, conf: dict[str, str] | None) -> Path:
    """An offset log entry as Spark writes it: version line, metadata, one source offset."""
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    metadata: dict[str, Any] = {"batchWatermarkMs": 0, "batchTimestampMs": 1}
    if conf is not None:
        metadata["conf"] = conf
    path = offsets / str(batch_id)
    path.write_text(f'v1\n{json.dumps(metadata)}\n{{"logOffset":{batch_id}}}')
    return path


def test_checkpoint_provider_reads_the_newest_offset_log_entry(tmp_path: Path) -> None:
    cp = tmp_path / "cp"
    write_offsets(cp, 2, {PROVIDER_CONF: HDFS_PROVIDER})
    write_offsets(cp, 10, {PROVIDER_CONF: ROCKSDB_PROVIDER})  # newer: 10 > 2, not "10" < "2"
    (cp / "offsets" / ".11.crc").write_text("not an entry")
    (cp / "offsets" / "11.tmp").write_text("not an entry")
    assert heapstate.checkpoint_provider(cp) == ROCKSDB_PROVIDER
    assert heapstate.checkpoint_provider(str(cp)) == ROCKSDB_PROVIDER
    assert heapstate.checkpoint_provider(f"file://{cp}") == ROCKSDB_PROVIDER


def test_checkpoint_provider_is_none_while_nothing_is_pinned(tmp_path: Path) -> None:
    assert heapstate.checkpoint_provider(tmp_path / "does-not-exist") is None
    (tmp_path / "empty" / "offsets").mkdir(parents=True)
    assert heapstate.checkpoint_provider(tmp_path / "empty") is None
    write_offsets(tmp_path / "old", 0, None)
    assert heapstate.checkpoint_provider(tmp_path / "old") is None


def test_checkpoint_provider_names_an_unreadable_entry(tmp_path: Path) -> None:
    entry = write_offsets(tmp_path, 0, {PROVIDER_CONF: HDFS_PROVIDER})
    entry.write_text("v1\n{not json\n")
    with pytest.raises(ValueError) as raised:
        heapstate.checkpoint_provider(tmp_path)
    assert str(raised.value) == (
        f"{entry}: line 2 is not the JSON metadata of an offset log: '{{not json'"
    )
    entry.write_text("")
    with pytest.raises(ValueError) as raised:
        heapstate.checkpoint_provider(tmp_path)
    assert str(raised.value) == (
        f"{entry} is not an offset log entry: expected a version line such as 'v1' and a "
        "metadata line, found []"
    )


def test_checkpoint_provider_refuses_remote_locations() -> None:
    with pytest.raises(ValueError) as raised:
        heapstate.checkpoint_provider("s3a://bucket/cp")
    assert str(raised.value) == (
        "s3a://bucket/cp: heapstate reads local checkpoints only (a path or a file: URI)"
    )


def test_configure_warns_about_a_checkpoint_of_another_provider(tmp_path: Path) -> None:
    hdfs_cp = tmp_path / "hdfs"
    write_offsets(hdfs_cp, 4, {PROVIDER_CONF: HDFS_PROVIDER})
    heap_cp = tmp_path / "heap"
    write_offsets(heap_cp, 0, {PROVIDER_CONF: HEAPSTATE_PROVIDER})
    with pytest.warns(heapstate.ProviderMismatchWarning) as caught:
        heapstate.configure(SparkSession.builder, checkpoint=[hdfs_cp, heap_cp, tmp_path / "new"])
    assert [str(w.message) for w in caught] == [
        (
            f"checkpoint {hdfs_cp} was made with {HDFS_PROVIDER} (pinned in offsets/4): "
            f"configure() sets {HEAPSTATE_PROVIDER} for new queries, but a query restarted from "
            "this checkpoint keeps using HDFSBackedStateStoreProvider. To run that query on "
            f"heapstate with its state, stop it and run `heapstate migrate {hdfs_cp} --to "
            "heapstate`; or start it with a new checkpoint location (its state then starts empty)."
        )
    ]


def test_configure_is_silent_for_its_own_and_new_checkpoints(tmp_path: Path) -> None:
    write_offsets(tmp_path / "heap", 0, {PROVIDER_CONF: HEAPSTATE_PROVIDER})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        heapstate.configure(SparkSession.builder, checkpoint=tmp_path / "heap")
        heapstate.configure(SparkSession.builder, checkpoint=str(tmp_path / "new"))


# --------------------------------------------------------------------------------------------
# The toggle on a live session


@pytest.fixture
def session(spark: SparkSession) -> Iterator[SparkSession]:
    """The suite's session, with its provider and heapstate confs put back afterwards."""
    keys = [PROVIDER_CONF] + [PREFIX + o.key for o in heapstate._config.OPTIONS.values()]
    saved = {k: spark.conf.get(k, None) for k in keys}
    heapstate._session._before_enable.pop(spark, None)
    yield spark
    for key, value in saved.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)
    heapstate._session._before_enable.pop(spark, None)


def conf(spark: SparkSession, key: str) -> str | None:
    return spark.conf.get(key, None)


def test_disable_and_enable_switch_the_provider_of_new_queries(session: SparkSession) -> None:
    assert heapstate.is_enabled(session)  # the suite's session was built with configure()
    assert heapstate.disable(session) == HDFS_PROVIDER
    assert conf(session, PROVIDER_CONF) is None  # unset: Spark's default applies
    assert not heapstate.is_enabled(session)
    assert heapstate.disable(session) == HDFS_PROVIDER  # a second disable changes nothing

    session.conf.set(PROVIDER_CONF, ROCKSDB_PROVIDER)
    heapstate.enable(session, codec="snappy", undo_versions=1)
    assert conf(session, PROVIDER_CONF) == HEAPSTATE_PROVIDER
    assert conf(session, PREFIX + "compressionCodec") == "snappy"
    assert conf(session, PREFIX + "undoVersions") == "1"
    heapstate.enable(session)  # already on: still remembers RocksDB, not heapstate
    assert heapstate.disable(session) == ROCKSDB_PROVIDER
    assert conf(session, PROVIDER_CONF) == ROCKSDB_PROVIDER


def test_enabled_restores_every_conf_it_set(session: SparkSession) -> None:
    session.conf.set(PROVIDER_CONF, ROCKSDB_PROVIDER)
    session.conf.unset(PREFIX + "compressionCodec")
    before_interval = conf(session, PREFIX + "compactionInterval")
    with heapstate.enabled(session, codec="lz4", compaction_interval=7) as inside:
        assert inside is session
        assert conf(session, PROVIDER_CONF) == HEAPSTATE_PROVIDER
        assert conf(session, PREFIX + "compressionCodec") == "lz4"
        assert conf(session, PREFIX + "compactionInterval") == "7"
    assert conf(session, PROVIDER_CONF) == ROCKSDB_PROVIDER
    assert conf(session, PREFIX + "compressionCodec") is None
    assert conf(session, PREFIX + "compactionInterval") == before_interval


def test_enabled_restores_even_when_the_block_raises(session: SparkSession) -> None:
    heapstate.disable(session)
    with pytest.raises(KeyError), heapstate.enabled(session):
        assert heapstate.is_enabled(session)
        raise KeyError("inside")
    assert conf(session, PROVIDER_CONF) is None


def test_disabled_restores_heapstate(session: SparkSession) -> None:
    assert heapstate.is_enabled(session)
    with heapstate.disabled(session):
        assert conf(session, PROVIDER_CONF) is None
    assert conf(session, PROVIDER_CONF) == HEAPSTATE_PROVIDER


def test_enable_rejects_bad_options_before_changing_anything(session: SparkSession) -> None:
    heapstate.disable(session)
    with pytest.raises(ValueError) as raised:
        heapstate.enable(session, codec="brotli")
    assert str(raised.value) == (
        "heapstate option codec must be one of zstd, lz4, snappy, none, not 'brotli'"
    )
    assert conf(session, PROVIDER_CONF) is None


def test_a_class_the_session_cannot_load_is_a_clear_error(session: SparkSession) -> None:
    with pytest.raises(RuntimeError) as raised:
        require_provider_class(session, "heapstate.NoSuchProvider")
    jars = session.sparkContext.getConf().get("spark.jars")
    assert str(raised.value) == (
        "heapstate.NoSuchProvider cannot be loaded in this session's JVM: the heapstate jar "
        f"is not on its classpath (spark.jars = {jars!r}). A jar can only be added when the "
        "session starts: build the session with heapstate.configure(SparkSession.builder), or "
        "pass the flags of `heapstate submit-args` to spark-submit. The jar: "
        f"{heapstate.jar_path()}"
    )
    require_provider_class(session)  # heapstate's own class loads


def test_new_queries_follow_the_toggle(session: SparkSession, tmp_path: Path) -> None:
    expected = [(0, [("a", 1), ("b", 1)]), (1, [("a", 2)])]
    with heapstate.disabled(session):
        off = run_count_per_key(session, tmp_path / "off", [["a", "b"], ["a"]])
    with heapstate.enabled(session):
        on = run_count_per_key(session, tmp_path / "on", [["a", "b"], ["a"]])
    assert off == expected
    assert on == expected
    assert heapstate.checkpoint_provider(tmp_path / "off" / "checkpoint") == HDFS_PROVIDER
    assert heapstate.checkpoint_provider(tmp_path / "on" / "checkpoint") == HEAPSTATE_PROVIDER
    assert_checkpoint_written_by(tmp_path / "off" / "checkpoint", HDFS_PROVIDER)
    assert_checkpoint_written_by(tmp_path / "on" / "checkpoint", HEAPSTATE_PROVIDER)
    assert SHUFFLE_PARTITIONS == 2

    # The toggle warns for a checkpoint of the other provider, and says what will happen.
    off_cp, on_cp = tmp_path / "off" / "checkpoint", tmp_path / "on" / "checkpoint"
    heapstate.disable(session)
    with pytest.warns(heapstate.ProviderMismatchWarning) as caught:
        heapstate.enable(session, checkpoint=[off_cp, on_cp])
    assert [str(w.message) for w in caught] == [
        (
            f"checkpoint {off_cp} was made with {HDFS_PROVIDER} (pinned in offsets/1): "
            f"heapstate.enable() sets {HEAPSTATE_PROVIDER} for new queries, but a query restarted "
            "from this checkpoint keeps using HDFSBackedStateStoreProvider. To run that query on "
            f"heapstate with its state, stop it and run `heapstate migrate {off_cp} --to "
            "heapstate`; or start it with a new checkpoint location (its state then starts empty)."
        )
    ]
    with pytest.warns(heapstate.ProviderMismatchWarning) as caught:
        heapstate.disable(session, checkpoint=[off_cp, on_cp])
    assert [str(w.message) for w in caught] == [
        (
            f"checkpoint {on_cp} was made with {HEAPSTATE_PROVIDER} (pinned in offsets/1): "
            f"heapstate.disable() sets {HDFS_PROVIDER} for new queries, but a query restarted "
            "from this checkpoint keeps using HeapStateStoreProvider. It stays on "
            "HeapStateStoreProvider, so that provider's jar must stay on the classpath for it."
        )
    ]

    # Restarted with heapstate on, the HDFS checkpoint keeps HDFS: that is what was warned.
    with heapstate.enabled(session):
        more = run_count_per_key(session, tmp_path / "off", [["b"]], first=2)
    assert more == [(2, [("b", 2)])]
    assert heapstate.checkpoint_provider(off_cp) == HDFS_PROVIDER


# --------------------------------------------------------------------------------------------
# The examples in the docstrings run


@pytest.fixture(scope="module")
def heapstate_checkpoint(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("doc-checkpoint")
    saved = spark.conf.get(PROVIDER_CONF, None)
    spark.conf.set(PROVIDER_CONF, HEAPSTATE_PROVIDER)
    try:
        run_count_per_key(spark, workdir, [["x"]])
    finally:
        if saved is None:
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, saved)
    return workdir / "checkpoint"


@pytest.mark.parametrize(
    "module",
    [
        heapstate._config,
        heapstate._checkpoint,
        heapstate._session,
        heapstate._inspection,
        heapstate._migration,
        heapstate.cli,
    ],
    ids=lambda m: m.__name__,
)
def test_docstring_examples_run(
    module: Any, session: SparkSession, heapstate_checkpoint: Path, tmp_path: Path
) -> None:
    copy = copy_checkpoint(heapstate_checkpoint, tmp_path / "checkpoint")
    result = doctest.testmod(
        module,
        extraglobs={"spark": session, "checkpoint": str(copy)},
        optionflags=doctest.ELLIPSIS,
        raise_on_error=False,
        verbose=False,
    )
    assert result.attempted > 0, f"{module.__name__} has no examples"
    assert result.failed == 0, f"{result.failed} example(s) of {module.__name__} failed"


def test_configure_under_spark_submit_keeps_its_plugins(tmp_path: Path) -> None:
    # Under spark-submit the JVM starts first, with --conf in its system properties; the builder's
    # spark.plugins would replace them, so configure() asks that JVM. No session starts here.
    import os
    import subprocess
    import sys

    import pyspark

    script = tmp_path / "job.py"
    script.write_text(
        "import heapstate\n"
        "from pyspark.sql import SparkSession\n"
        "builder = heapstate.configure(SparkSession.builder)\n"
        "print('plugins=' + builder._options['spark.plugins'])\n"
    )
    spark_submit = Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"
    env = {
        k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS")
    }
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    done = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[1]",
            "--conf",
            "spark.plugins=com.example.Mine",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "plugins=com.example.Mine,heapstate.TaskActivityPlugin" in done.stdout.splitlines(), (
        done.stdout
    )
