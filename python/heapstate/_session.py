"""Turning heapstate on and off on a live SparkSession, for the queries started afterwards.

``spark.sql.streaming.stateStore.providerClass`` is a runtime SQL conf: changing it affects only
queries started later. A query that is running keeps its provider, and so does every checkpoint:
Spark pins the provider in the offset log and a restart uses the pinned one. Only the provider
conf and heapstate's option confs are touched; the jar itself, and heapstate's plugin
(``spark.plugins``), can only be added when the session starts (:func:`heapstate.configure`, or
``heapstate submit-args`` for ``spark-submit``). Without the plugin heapstate works the same; its
background snapshots then wait only for the tasks that write a store.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from heapstate._checkpoint import Checkpoints, warn_if_pinned_elsewhere
from heapstate._config import (
    PROVIDER_CLASS,
    PROVIDER_CONF,
    SPARK_DEFAULT_PROVIDER,
    conf_entries,
    configure,
    jar_path,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_before_enable: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
"""Per session, the provider conf as it was before :func:`enable` switched to heapstate
(``None``: it was not set)."""


def _get(spark: SparkSession, key: str) -> str | None:
    value = spark.conf.get(key, None)
    return None if value is None else str(value)


def _restore(spark: SparkSession, key: str, value: str | None) -> None:
    if value is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, value)


def require_provider_class(spark: SparkSession, class_name: str = PROVIDER_CLASS) -> None:
    """Raise ``RuntimeError`` unless the session's driver JVM can load ``class_name``.

    A session without a py4j JVM (Spark Connect) is not checked: its server decides.
    """
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
    except AttributeError:  # Spark Connect: no local JVM to ask
        return
    if jvm is None:
        return
    try:
        jvm.org.apache.spark.util.Utils.classForName(class_name, False, False)
    except Exception as e:
        jars = spark.sparkContext.getConf().get("spark.jars", "")
        raise RuntimeError(
            f"{class_name} cannot be loaded in this session's JVM: the heapstate jar is not on "
            f"its classpath (spark.jars = {jars!r}). A jar can only be added when the session "
            "starts: build the session with heapstate.configure(SparkSession.builder), or pass "
            f"the flags of `heapstate submit-args` to spark-submit. The jar: {jar_path()}"
        ) from e


def is_enabled(spark: SparkSession) -> bool:
    """Whether new streaming queries of ``spark`` will use heapstate.

    >>> import heapstate
    >>> heapstate.is_enabled(spark)
    True
    """
    return _get(spark, PROVIDER_CONF) == PROVIDER_CLASS


def enable(
    spark: SparkSession,
    *,
    compaction_interval: int | None = None,
    codec: str | None = None,
    undo_versions: int | None = None,
    checkpoint: Checkpoints | None = None,
    **more: Any,
) -> None:
    """Make heapstate the state store of the streaming queries ``spark`` starts from now on.

    - Checks first that the session can load heapstate's class, and raises ``RuntimeError``
      saying how to add the jar if it cannot.
    - Sets the options given (see :func:`heapstate.conf_entries`); others keep their values.
    - Remembers the provider it replaces, for :func:`disable`.
    - ``checkpoint``: a location (or list) that a query will restart from. One made with
      another provider gets a :class:`~heapstate.ProviderMismatchWarning`: the restarted
      query keeps that provider.

    >>> import heapstate
    >>> heapstate.disable(spark)
    'org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider'
    >>> heapstate.enable(spark, compaction_interval=2)
    >>> heapstate.is_enabled(spark)
    True
    """
    entries = conf_entries(
        compaction_interval=compaction_interval, codec=codec, undo_versions=undo_versions, **more
    )
    require_provider_class(spark)
    if checkpoint is not None:
        warn_if_pinned_elsewhere(checkpoint, PROVIDER_CLASS, "heapstate.enable()")
    current = _get(spark, PROVIDER_CONF)
    if current != PROVIDER_CLASS:
        _before_enable[spark] = current
    for key, value in entries.items():
        spark.conf.set(key, value)


def disable(spark: SparkSession, *, checkpoint: Checkpoints | None = None) -> str:
    """Stop using heapstate for the streaming queries ``spark`` starts from now on.

    Puts back the provider that :func:`enable` replaced, or, when heapstate was on from the
    start (:func:`heapstate.configure`), Spark's default, HDFSBackedStateStoreProvider. Does
    nothing when heapstate is not on. Returns the provider new queries will use.

    ``checkpoint``: a location (or list) that a query will restart from. One made with heapstate
    gets a :class:`~heapstate.ProviderMismatchWarning`: the restarted query stays on heapstate.

    >>> import heapstate
    >>> heapstate.disable(spark)
    'org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider'
    >>> heapstate.is_enabled(spark)
    False
    >>> heapstate.enable(spark)
    """
    if is_enabled(spark):
        _restore(spark, PROVIDER_CONF, _before_enable.pop(spark, None))
    now = _get(spark, PROVIDER_CONF) or SPARK_DEFAULT_PROVIDER
    if checkpoint is not None:
        warn_if_pinned_elsewhere(checkpoint, now, "heapstate.disable()")
    return now


@contextmanager
def enabled(
    spark: SparkSession,
    *,
    compaction_interval: int | None = None,
    codec: str | None = None,
    undo_versions: int | None = None,
    checkpoint: Checkpoints | None = None,
    **more: Any,
) -> Iterator[SparkSession]:
    """Use heapstate for the queries started inside the ``with`` block; then restore the confs.

    Takes the same arguments as :func:`enable`. On exit, the provider conf and every option
    conf it set get back their previous values (or are unset if they were unset). Queries
    started inside keep heapstate after the block, as their checkpoints pin it.

    >>> import heapstate
    >>> heapstate.disable(spark)
    'org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider'
    >>> with heapstate.enabled(spark, codec="lz4"):
    ...     heapstate.is_enabled(spark)
    True
    >>> heapstate.is_enabled(spark)
    False
    >>> heapstate.enable(spark)
    """
    keys = conf_entries(
        compaction_interval=compaction_interval, codec=codec, undo_versions=undo_versions, **more
    )
    saved = {key: _get(spark, key) for key in keys}
    remembered = _before_enable.get(spark)
    had_memory = spark in _before_enable
    enable(
        spark,
        compaction_interval=compaction_interval,
        codec=codec,
        undo_versions=undo_versions,
        checkpoint=checkpoint,
    )
    try:
        yield spark
    finally:
        for key, value in saved.items():
            _restore(spark, key, value)
        if had_memory:
            _before_enable[spark] = remembered
        else:
            _before_enable.pop(spark, None)


@contextmanager
def disabled(
    spark: SparkSession, *, checkpoint: Checkpoints | None = None
) -> Iterator[SparkSession]:
    """Do not use heapstate for the queries started inside the ``with`` block.

    Takes the same arguments as :func:`disable`; on exit the provider conf gets its previous
    value back.

    >>> import heapstate
    >>> with heapstate.disabled(spark):
    ...     heapstate.is_enabled(spark)
    False
    >>> heapstate.is_enabled(spark)
    True
    """
    saved = _get(spark, PROVIDER_CONF)
    remembered = _before_enable.get(spark)
    had_memory = spark in _before_enable
    disable(spark, checkpoint=checkpoint)
    try:
        yield spark
    finally:
        _restore(spark, PROVIDER_CONF, saved)
        if had_memory:
            _before_enable[spark] = remembered


@contextmanager
def tool_session(app_name: str, tool_class: str, needs_pyspark: str) -> Iterator[SparkSession]:
    """The session a command-line tool runs its JVM half in (``tool_class``, called through
    py4j): the active SparkSession if there is one, else a local one (one core, no UI) with the
    bundled jar, which is stopped afterwards. ``needs_pyspark`` is the error message when pyspark
    is not installed."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise RuntimeError(needs_pyspark) from e
    active = SparkSession.getActiveSession()
    builder = (
        SparkSession.builder.master("local[1]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
    )
    spark = active or configure(builder).getOrCreate()
    try:
        require_provider_class(spark, tool_class)
        yield spark
    finally:
        if active is None:
            spark.stop()
