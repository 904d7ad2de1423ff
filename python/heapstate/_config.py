"""Where the bundled jar is, and how a SparkSession builder is pointed at it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

PROVIDER_CLASS = "heapstate.HeapStateStoreProvider"
"""The class name to give ``spark.sql.streaming.stateStore.providerClass``."""

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CONF_PREFIX = "spark.sql.streaming.stateStore.heapstate."

B = TypeVar("B")


def jar_path() -> str:
    """Return the absolute path of the heapstate jar bundled in this package.

    >>> import heapstate, os
    >>> os.path.isfile(heapstate.jar_path())
    True
    """
    jar = Path(__file__).resolve().parent / "jars" / "heapstate.jar"
    if not jar.is_file():
        raise FileNotFoundError(
            f"the heapstate jar is missing at {jar}: this installation of spark-heapstate was "
            "built without it (build it with bin/setup, or install a released wheel)"
        )
    return str(jar)


def _append_jar(existing: str | None, jar: str) -> str:
    jars = [j for j in (existing or "").split(",") if j.strip()]
    if jar not in jars:
        jars.append(jar)
    return ",".join(jars)


def configure(builder: B, **options: Any) -> B:
    """Point a ``SparkSession.Builder`` at heapstate and return the builder.

    Appends the bundled jar to ``spark.jars`` (keeping jars already set, such as Delta's),
    sets ``spark.sql.streaming.stateStore.providerClass`` and passes each keyword option through
    as ``spark.sql.streaming.stateStore.heapstate.<name>``.

    >>> from pyspark.sql import SparkSession
    >>> import heapstate
    >>> builder = heapstate.configure(SparkSession.builder.master("local[1]"), compactionInterval=5)
    """
    conf = getattr(builder, "_options", {})
    builder.config("spark.jars", _append_jar(conf.get("spark.jars"), jar_path()))  # type: ignore[attr-defined]
    builder.config(PROVIDER_CONF, PROVIDER_CLASS)  # type: ignore[attr-defined]
    for name, value in options.items():
        builder.config(CONF_PREFIX + name, str(value))  # type: ignore[attr-defined]
    return builder
