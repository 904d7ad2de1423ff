"""Where the bundled jar is, heapstate's options, and how a SparkSession builder is pointed at them.

Every option is checked here, before Spark starts, so that a typo fails at the call that made it.
The Scala provider checks the same keys again when a store starts (``HeapStateConf``), since
confs can also arrive through ``spark-defaults.conf`` or ``--conf``.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from heapstate._checkpoint import Checkpoints

PROVIDER_CLASS = "heapstate.HeapStateStoreProvider"
"""The class name to give ``spark.sql.streaming.stateStore.providerClass``."""

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
"""The SQL conf that chooses the state store provider of new streaming queries."""

CONF_PREFIX = "spark.sql.streaming.stateStore.heapstate."
"""Every heapstate conf key starts with this."""

SPARK_DEFAULT_PROVIDER = (
    "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
)
"""The provider Spark uses when ``spark.sql.streaming.stateStore.providerClass`` is not set."""

PLUGIN_CLASS = "heapstate.TaskActivityPlugin"
"""heapstate's Spark plugin, for ``spark.plugins``: it counts every task an executor runs, so
that background snapshots wait while tasks run on every core, not only while stores are written.
Without it heapstate works the same, with snapshots that compete with stateless stages."""

PLUGINS_CONF = "spark.plugins"
"""Spark's list of plugins, read once when the session's SparkContext starts."""

CODECS = ("zstd", "lz4", "snappy", "none")
"""The values ``codec`` allows."""


class _Builder(Protocol):
    """What :func:`configure` needs of a builder: ``SparkSession.Builder`` has it."""

    def config(self, key: str, value: str) -> Any: ...


B = TypeVar("B", bound=_Builder)


def jar_path() -> str:
    """Return the absolute path of the heapstate jar bundled in this package.

    >>> import heapstate, os
    >>> os.path.isfile(heapstate.jar_path())
    True
    >>> heapstate.jar_path().endswith("heapstate.jar")
    True
    """
    jar = Path(__file__).resolve().parent / "jars" / "heapstate.jar"
    if not jar.is_file():
        raise FileNotFoundError(
            f"the heapstate jar is missing at {jar}: this installation of spark-heapstate was "
            "built without it (build it with bin/setup, or install a released wheel)"
        )
    return str(jar)


# --------------------------------------------------------------------------------------------
# Options


def _int_in(minimum: int, maximum: int | None = None) -> Callable[[object], str | None]:
    """A check of an integer option from ``minimum`` to ``maximum`` (no bound when None)."""
    wanted = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def check(value: object) -> str | None:
        # bool is an int subclass; True is never meant as a version count.
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer {wanted}, not {value!r} ({type(value).__name__})"
        if value < minimum or (maximum is not None and value > maximum):
            return f"must be an integer {wanted}, not {value!r}"
        return None

    return check


def _one_of(allowed: tuple[str, ...]) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if not isinstance(value, str) or value not in allowed:
            return f"must be one of {', '.join(allowed)}, not {value!r}"
        return None

    return check


def _copy_dirs(value: object) -> str | None:
    """The check of ``local_copy_dir``: empty (Spark's local directories), ``"none"``, or
    absolute paths separated by commas (a ``str`` or a path object), as the provider takes it."""
    wanted = "must be '', 'none' or absolute local paths separated by commas"
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        return f"{wanted}, not {value!r} ({type(value).__name__})"
    if value.strip() in ("", "none"):
        return None
    if any(not os.path.isabs(d.strip()) for d in value.split(",")):
        return f"{wanted}, not {value!r}"
    return None


@dataclass(frozen=True)
class _Option:
    key: str
    """The conf key, after :data:`CONF_PREFIX`."""
    check: Callable[[object], str | None]


OPTIONS: Mapping[str, _Option] = {
    "compaction_interval": _Option("compactionInterval", _int_in(1)),
    "codec": _Option("compressionCodec", _one_of(CODECS)),
    "undo_versions": _Option("undoVersions", _int_in(0)),
    "snapshot_bucket_bytes": _Option("snapshotBucketBytes", _int_in(64, 1 << 24)),
    "bulk_load_snapshot_bytes": _Option("bulkLoadSnapshotBytes", _int_in(0, (1 << 31) - 1)),
    "local_copy_dir": _Option("localCopyDir", _copy_dirs),
}
"""heapstate's options by Python name. The README's configuration table says what each does."""


def _unknown_option(name: str) -> ValueError:
    by_key = {o.key: n for n, o in OPTIONS.items()}
    hint = ""
    if name in by_key:
        hint = f" (the conf key {CONF_PREFIX}{name} is the option {by_key[name]!r})"
    else:
        close = difflib.get_close_matches(name, list(OPTIONS), n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
    return ValueError(
        f"unknown heapstate option {name!r}{hint}; the options are {', '.join(OPTIONS)}"
    )


def conf_entries(
    *,
    compaction_interval: int | None = None,
    codec: str | None = None,
    undo_versions: int | None = None,
    snapshot_bucket_bytes: int | None = None,
    bulk_load_snapshot_bytes: int | None = None,
    local_copy_dir: str | os.PathLike[str] | None = None,
    **more: Any,
) -> dict[str, str]:
    """Return the Spark confs that turn heapstate on with these options (``spark.jars`` aside).

    Options left at ``None`` are not set, so heapstate's defaults apply. An unknown option, or a
    value of the wrong type or out of range, raises ``ValueError`` naming the option and value.

    >>> import heapstate
    >>> for key, value in heapstate.conf_entries(compaction_interval=5, codec="lz4").items():
    ...     print(f"{key}={value}")
    spark.sql.streaming.stateStore.providerClass=heapstate.HeapStateStoreProvider
    spark.sql.streaming.stateStore.heapstate.compactionInterval=5
    spark.sql.streaming.stateStore.heapstate.compressionCodec=lz4
    >>> heapstate.conf_entries(compaction_interval="5")
    Traceback (most recent call last):
    ...
    ValueError: heapstate option compaction_interval must be an integer >= 1, not '5' (str)
    """
    if more:
        raise _unknown_option(next(iter(more)))
    given = {
        "compaction_interval": compaction_interval,
        "codec": codec,
        "undo_versions": undo_versions,
        "snapshot_bucket_bytes": snapshot_bucket_bytes,
        "bulk_load_snapshot_bytes": bulk_load_snapshot_bytes,
        "local_copy_dir": local_copy_dir,
    }
    entries = {PROVIDER_CONF: PROVIDER_CLASS}
    for name, value in given.items():
        if value is None:
            continue
        option = OPTIONS[name]
        problem = option.check(value)
        if problem:
            raise ValueError(f"heapstate option {name} {problem}")
        entries[CONF_PREFIX + option.key] = (
            os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        )
    return entries


# --------------------------------------------------------------------------------------------
# The builder


def _append_listed(existing: str | None, item: str) -> str:
    """``existing`` (a comma-separated list, or None) with ``item`` at its end, once."""
    items = [i.strip() for i in (existing or "").split(",") if i.strip()]
    if item not in items:
        items.append(item)
    return ",".join(items)


def _spark_conf_dir() -> Path | None:
    """The folder whose ``spark-defaults.conf`` ``spark-submit`` reads: ``SPARK_CONF_DIR``, else
    ``SPARK_HOME/conf``, else the ``conf`` folder of the installed pyspark; None without any."""
    if os.environ.get("SPARK_CONF_DIR"):
        return Path(os.environ["SPARK_CONF_DIR"])
    home = os.environ.get("SPARK_HOME")
    if not home:
        try:
            import pyspark
        except ImportError:
            return None
        home = str(Path(pyspark.__file__).parent)
    return Path(home) / "conf"


def _spark_defaults(key: str) -> str | None:
    """``key``'s value in the ``spark-defaults.conf`` of :func:`_spark_conf_dir`; None where there
    is no such file or key. Lines are read as ``key value``, ``key=value`` or ``key: value``;
    ``#`` and ``!`` start comments; a line continued with a backslash is not joined."""
    conf_dir = _spark_conf_dir()
    if conf_dir is None:
        return None
    try:
        lines = (conf_dir / "spark-defaults.conf").read_text().splitlines()
    except OSError:
        return None
    value = None
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        parts = re.split(r"\s*[=:]\s*|\s+", line, maxsplit=1)
        if parts[0] == key:
            value = parts[1].strip() if len(parts) == 2 else ""
    return value


def _submit_args_conf(key: str) -> str | None:
    """``key``'s value among the ``--conf`` flags of ``PYSPARK_SUBMIT_ARGS`` (the last one wins,
    as in ``spark-submit``); None where it has none."""
    try:
        words = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    except ValueError:
        return None
    value = None
    for i, word in enumerate(words):
        if word in ("--conf", "-c") and i + 1 < len(words):
            setting = words[i + 1]
        elif word.startswith("--conf="):
            setting = word[len("--conf=") :]
        else:
            continue
        name, sep, given = setting.partition("=")
        if sep and name.strip() == key:
            value = given
    return value


def _running_jvm_conf(key: str) -> str | None:
    """``key``'s value in the JVM this Python already talks to, where there is one: the JVM of
    ``spark-submit`` that started this Python (``PYSPARK_GATEWAY_PORT``), or that of an earlier
    SparkContext. Its system properties hold what ``spark-submit`` was given, ``--conf`` and
    ``spark-defaults.conf`` alike. None without such a JVM: starting one here would start it
    without the builder's confs."""
    try:
        from pyspark import SparkConf, SparkContext
    except ImportError:
        return None
    if SparkContext._jvm is None:
        if not os.environ.get("PYSPARK_GATEWAY_PORT"):
            return None
        # Connects to spark-submit's JVM (the port says where), as the session would; SparkConf
        # without a connection would read nothing of it.
        SparkContext._ensure_initialized()
    return SparkConf().get(key, None)


def _plugins_elsewhere() -> str | None:
    """The ``spark.plugins`` a session would start with if the builder set none (Spark's order:
    ``spark-submit``'s ``--conf`` over ``spark-defaults.conf``)."""
    for found in (_running_jvm_conf, _submit_args_conf, _spark_defaults):
        value = found(PLUGINS_CONF)
        if value is not None:
            return value
    return None


def configure(
    builder: B,
    *,
    compaction_interval: int | None = None,
    codec: str | None = None,
    undo_versions: int | None = None,
    checkpoint: Checkpoints | None = None,
    task_plugin: bool = True,
    **more: Any,
) -> B:
    """Point a ``SparkSession.Builder`` at heapstate and return the builder.

    - Appends the bundled jar to ``spark.jars``, keeping the jars already set. It works before
      or after Delta's ``configure_spark_with_delta_pip``, which sets ``spark.jars.packages``.
    - Appends heapstate's plugin (:data:`PLUGIN_CLASS`) to ``spark.plugins``, keeping the plugins
      listed already: the builder's, or else those the session would start with (``--conf`` of
      ``spark-submit`` or ``PYSPARK_SUBMIT_ARGS``, then ``spark-defaults.conf``), since the
      builder's value replaces them. ``task_plugin=False`` leaves it out. Spark reads
      ``spark.plugins`` once, when the session starts: a ``spark.plugins`` the builder is given
      after this call replaces heapstate's.
    - Sets ``spark.sql.streaming.stateStore.providerClass`` to heapstate, so new queries use it.
    - Passes the options through as ``spark.sql.streaming.stateStore.heapstate.*`` (see
      :func:`conf_entries`); an unknown option, or a bad value, raises ``ValueError`` naming it.
    - ``checkpoint``: a checkpoint location, or a list of them, that queries of this session
      will restart from. Each one made with another provider gets a
      :class:`~heapstate.ProviderMismatchWarning`, since Spark keeps that provider for it.

    >>> from pyspark.sql import SparkSession
    >>> import heapstate
    >>> builder = heapstate.configure(SparkSession.builder.master("local[1]"), compaction_interval=5)
    >>> builder._options["spark.sql.streaming.stateStore.heapstate.compactionInterval"]
    '5'
    >>> builder._options["spark.jars"] == heapstate.jar_path()
    True
    >>> builder._options["spark.plugins"]
    'heapstate.TaskActivityPlugin'
    """
    if not isinstance(task_plugin, bool):
        # ValueError, as for every other bad option (see conf_entries).
        problem = f"must be True or False, not {task_plugin!r}"
        raise ValueError(f"heapstate option task_plugin {problem}")  # noqa: TRY004
    entries = conf_entries(
        compaction_interval=compaction_interval, codec=codec, undo_versions=undo_versions, **more
    )
    options = getattr(builder, "_options", {})
    builder.config("spark.jars", _append_listed(options.get("spark.jars"), jar_path()))
    if task_plugin:
        plugins = options[PLUGINS_CONF] if PLUGINS_CONF in options else _plugins_elsewhere()
        builder.config(PLUGINS_CONF, _append_listed(plugins, PLUGIN_CLASS))
    for key, value in entries.items():
        builder.config(key, value)
    if checkpoint is not None:
        from heapstate._checkpoint import warn_if_pinned_elsewhere

        warn_if_pinned_elsewhere(checkpoint, PROVIDER_CLASS, "configure()")
    return builder
