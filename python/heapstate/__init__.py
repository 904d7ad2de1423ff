"""heapstate: a heap state store for Apache Spark Structured Streaming.

Turn it on for a new session::

    from pyspark.sql import SparkSession
    import heapstate

    spark = heapstate.configure(SparkSession.builder.master("local[2]")).getOrCreate()

or for ``spark-submit``::

    spark-submit $(python -m heapstate submit-args) my_job.py
"""

from __future__ import annotations

from heapstate._config import (
    CONF_PREFIX,
    PROVIDER_CLASS,
    PROVIDER_CONF,
    configure,
    jar_path,
)

__all__ = ["CONF_PREFIX", "PROVIDER_CLASS", "PROVIDER_CONF", "configure", "jar_path"]
