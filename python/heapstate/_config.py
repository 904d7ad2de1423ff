"""Where the bundled jar is, heapstate's options, and how a SparkSession builder is pointed at them.

Every option is checked here, before Spark starts, so that a typo fails at the call that made it.
The Scala provider checks the same keys again when a store starts (``HeapStateConf``), since
confs can also arrive through ``spark-defaults.conf`` or ``--conf``.
"""

from __future__ import annotations

import difflib
import os
import re
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
    }
    entries = {PROVIDER_CONF: PROVIDER_CLASS}
    for name, value in given.items():
        if value is None:
            continue
        option = OPTIONS[name]
        problem = option.check(value)
        if problem:
            raise ValueError(f"heapstate option {name} {problem}")
        entries[CONF_PREFIX + option.key] = str(value)
    return entries


# --------------------------------------------------------------------------------------------
# The builder


def _append_listed(existing: str | None, item: str) -> str:
    """``existing`` (a comma-separated list, or None) with ``item`` at its end, once."""
    items = [i.strip() for i in (existing or "").split(",") if i.strip()]
    if item not in items:
        items.append(item)
    return ",".join(items)


def _spark_defaults(key: str) -> str | None:
    """``key``'s value in the ``spark-defaults.conf`` that ``SPARK_CONF_DIR`` (or else
    ``SPARK_HOME``'s ``conf``) points at; None where there is no such file or key."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    if not conf_dir:
        return None
    path = Path(conf_dir) / "spark-defaults.conf"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    value = None
    for line in lines:
        parts = re.split(r"[\s=]+", line.strip(), maxsplit=1)
        if parts[0] == key and len(parts) == 2:
            value = parts[1].strip()
    return value


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
      the builder or ``spark-defaults.conf`` lists; ``task_plugin=False`` leaves it out. Spark
      reads ``spark.plugins`` once, when the session starts, and the builder's value wins over a
      ``--conf spark.plugins`` given to ``spark-submit`` or in ``PYSPARK_SUBMIT_ARGS``: list
      such plugins in the builder too.
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
        raise ValueError(f"heapstate option task_plugin must be True or False, not {task_plugin!r}")  # noqa: TRY004
    entries = conf_entries(
        compaction_interval=compaction_interval, codec=codec, undo_versions=undo_versions, **more
    )
    options = getattr(builder, "_options", {})
    builder.config("spark.jars", _append_listed(options.get("spark.jars"), jar_path()))
    if task_plugin:
        plugins = options.get(PLUGINS_CONF, _spark_defaults(PLUGINS_CONF))
        builder.config(PLUGINS_CONF, _append_listed(plugins, PLUGIN_CLASS))
    for key, value in entries.items():
        builder.config(key, value)
    if checkpoint is not None:
        from heapstate._checkpoint import warn_if_pinned_elsewhere

        warn_if_pinned_elsewhere(checkpoint, PROVIDER_CLASS, "configure()")
    return builder
