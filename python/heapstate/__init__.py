"""heapstate: a heap state store for Apache Spark Structured Streaming.

Turn it on for a new session (the jar is added to ``spark.jars``)::

    from pyspark.sql import SparkSession
    import heapstate

    spark = heapstate.configure(SparkSession.builder.master("local[2]")).getOrCreate()

or for ``spark-submit``::

    spark-submit $(heapstate submit-args) my_job.py

On a live session that has the jar, turn it on and off for the queries started afterwards::

    heapstate.enable(spark)          # or: with heapstate.enabled(spark): ...
    heapstate.disable(spark)         # or: with heapstate.disabled(spark): ...

``buffered_output`` and ``drain`` (see :mod:`heapstate.buffered`) buffer a stream's output per key
in checkpointed state and emit it at most once per interval.

Spark pins the provider in each checkpoint; :func:`checkpoint_provider` reads it, and
``heapstate inspect CHECKPOINT`` shows what a checkpoint's stores hold.
"""

from __future__ import annotations

from heapstate._checkpoint import (
    NotACheckpointError,
    ProviderMismatchWarning,
    checkpoint_provider,
)
from heapstate._config import (
    CODECS,
    CONF_PREFIX,
    PLUGIN_CLASS,
    PROVIDER_CLASS,
    PROVIDER_CONF,
    SPARK_DEFAULT_PROVIDER,
    conf_entries,
    configure,
    jar_path,
)
from heapstate._session import disable, disabled, enable, enabled, is_enabled
from heapstate.buffered import buffered_output, drain

__all__ = [
    "CODECS",
    "CONF_PREFIX",
    "PLUGIN_CLASS",
    "PROVIDER_CLASS",
    "PROVIDER_CONF",
    "SPARK_DEFAULT_PROVIDER",
    "NotACheckpointError",
    "ProviderMismatchWarning",
    "buffered_output",
    "checkpoint_provider",
    "conf_entries",
    "configure",
    "disable",
    "disabled",
    "drain",
    "enable",
    "enabled",
    "is_enabled",
    "jar_path",
]
