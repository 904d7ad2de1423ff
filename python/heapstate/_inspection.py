"""``heapstate inspect``: what a checkpoint holds, per operator, partition and store.

Python lists the files and their sizes. Verifying heapstate's files and working out what each
version recovers from goes through the JVM (``heapstate.CheckpointInspector``), which reads the
files with the same Scala ``io`` code as the provider: the format is parsed in one place only.
Stores of other providers (HDFS, RocksDB) are listed, not verified.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from heapstate._checkpoint import (
    PathLike,
    StoreDir,
    read_provider_pin,
    require_checkpoint,
    store_dirs,
)
from heapstate._config import PROVIDER_CLASS

Report = dict[str, Any]
JvmDescribe = Callable[[Path], Report]


def describe_with_jvm(checkpoint: Path) -> Report:
    """``CheckpointInspector.describeJson(checkpoint, verify=True)``, parsed.

    Uses the active SparkSession if there is one that can load heapstate; otherwise starts a
    local one (one core, no UI) with the bundled jar, and stops it afterwards.
    """
    from heapstate._session import tool_session

    needs_pyspark = (
        "verifying heapstate files needs pyspark (pip install pyspark), or pass --no-verify "
        "to list files without verifying them"
    )
    with tool_session("heapstate-inspect", "heapstate.CheckpointInspector", needs_pyspark) as spark:
        inspector = spark._jvm.heapstate.CheckpointInspector  # type: ignore[attr-defined]
        try:
            text = inspector.describeJson(str(checkpoint), True)
        except Exception as e:  # a Py4JJavaError: keep the Java message, not its stack
            java = getattr(e, "java_exception", None)
            raise RuntimeError(
                f"the JVM inspector failed on {checkpoint}: {java.toString() if java else e}"
            ) from e
        return json.loads(text)


def _store_key(operator: Any, partition: Any, store: Any) -> tuple[str, str, str]:
    return (str(operator), str(partition), str(store))


def _python_store(store: StoreDir) -> Report:
    bytes_by_kind: dict[str, int] = {}
    for f in store.files:
        bytes_by_kind[f.kind] = bytes_by_kind.get(f.kind, 0) + f.bytes
    return {
        "operator": store.operator,
        "partition": store.partition,
        "store": store.store,
        "path": str(store.path),
        "providers": store.providers,
        "versionsPresent": sorted({f.version for f in store.files}),
        "bytesByKind": bytes_by_kind,
        "verified": False,
        "files": [
            {"name": f.name, "kind": f.kind, "version": f.version, "bytes": f.bytes}
            for f in store.files
        ],
        "versions": None,
    }


def describe(checkpoint: PathLike, verify: bool, jvm: JvmDescribe = describe_with_jvm) -> Report:
    """The whole report on ``checkpoint``, as JSON-ready data.

    Raises ``NotACheckpointError`` for a path that is not a checkpoint, and ``ValueError`` for
    an offset log that cannot be parsed.
    """
    path = require_checkpoint(checkpoint).absolute()
    pin = read_provider_pin(path)
    stores = [_python_store(s) for s in store_dirs(path)]
    verified_any = verify and any(PROVIDER_CLASS in s["providers"] for s in stores)
    if verified_any:
        from_jvm = {
            _store_key(s["operator"], s["partition"], s["store"]): s for s in jvm(path)["stores"]
        }
        for s in stores:
            if PROVIDER_CLASS not in s["providers"]:
                continue
            key = _store_key(s["operator"], s["partition"], s["store"])
            checked = from_jvm.get(key)
            if checked is None:
                raise RuntimeError(f"the JVM inspector did not report the store at {s['path']}")
            # The JVM lists heapstate's files only; files of another provider in the same
            # directory (a mixed-up directory) keep their Python listing.
            others = [f for f in s["files"] if not _is_heapstate(f["name"])]
            s["files"] = sorted(checked["files"] + others, key=lambda f: (f["version"], f["name"]))
            s["versions"] = checked["versions"]
            s["verified"] = True
    report: Report = {
        "checkpoint": str(path),
        "provider": pin.provider if pin else None,
        "providerPinnedIn": f"offsets/{pin.batch_id}" if pin else None,
        "verified": verified_any,
        "stores": stores,
    }
    report["problems"] = problems(report)
    return report


_HS_NAMES = (".hs-journal", ".hs-snapshot")


def _is_heapstate(name: str) -> bool:
    return name.endswith(_HS_NAMES)


def problems(report: Report) -> list[str]:
    """Every damaged file and every version that cannot be recovered, each naming the file."""
    found = []
    for s in report["stores"]:
        for f in s["files"]:
            if f.get("status") in ("corrupt", "unreadable"):
                found.append(f"{s['path']}/{f['name']} is {f['status']}: {f.get('problem')}")
        for v in s["versions"] or []:
            if not v["recoverable"]:
                found.append(
                    f"{s['path']}: version {v['version']} cannot be recovered: {v['problem']}"
                )
    return found


# --------------------------------------------------------------------------------------------
# Text


def ranges(numbers: Iterable[int]) -> str:
    """``1-3, 5, 7-8`` for ``[1, 2, 3, 5, 7, 8]``.

    >>> ranges([1, 2, 3, 5, 7, 8])
    '1-3, 5, 7-8'
    >>> ranges([])
    'none'
    """
    items = sorted(set(numbers))
    if not items:
        return "none"
    parts = []
    start = prev = items[0]
    for n in items[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def _short(provider: str) -> str:
    return provider.rsplit(".", 1)[-1]


def _recovery_lines(versions: list[Report]) -> list[str]:
    """Runs of consecutive versions recovering from the same base, as one line each."""
    lines: list[str] = []
    run: list[Report] = []

    def flush() -> None:
        if not run:
            return
        first, last = run[0], run[-1]
        span = (
            f"version {first['version']}"
            if first is last
            else f"versions {first['version']}-{last['version']}"
        )
        if first["recoverable"]:
            chain = (
                str(first["journalChain"])
                if first is last
                else f"{first['journalChain']}-{last['journalChain']}"
            )
            lines.append(f"{span}: from {first['recoversFrom']}, journal chain {chain}")
        else:
            lines.append(f"{span}: NOT RECOVERABLE: {first['problem']}")
        run.clear()

    for v in versions:
        if run:
            prev = run[-1]
            same = (
                v["recoverable"] == prev["recoverable"]
                and v.get("recoversFrom") == prev.get("recoversFrom")
                and v.get("problem") == prev.get("problem")
                and v["version"] == prev["version"] + 1
            )
            if not same:
                flush()
        run.append(v)
    flush()
    return lines


def format_text(report: Report) -> str:
    """The report for people: one block per store, files with sizes, then recovery."""
    out = [f"checkpoint  {report['checkpoint']}"]
    if report["provider"]:
        out.append(f"provider    {report['provider']} (pinned in {report['providerPinnedIn']})")
    elif report["providerPinnedIn"]:
        out.append(f"provider    not pinned in {report['providerPinnedIn']}")
    else:
        out.append("provider    not pinned yet (no batch has started)")
    stores = report["stores"]
    how = "heapstate files verified through the JVM" if report["verified"] else "not verified"
    out.append(f"stores      {len(stores)} ({how})")
    if not stores:
        out.append("            no state files (no stateful operator, or no batch committed)")
    for s in stores:
        providers = ", ".join(_short(p) for p in s["providers"])
        out.append("")
        out.append(
            f"operator {s['operator']}, partition {s['partition']}, store {s['store']}: {providers}"
        )
        out.append(f"  path      {s['path']}")
        out.append(f"  versions  {ranges(s['versionsPresent'])}")
        sizes = ", ".join(f"{kind} {n:,} B" for kind, n in sorted(s["bytesByKind"].items()))
        out.append(f"  bytes     {sizes}")
        out.append("  files")
        for f in s["files"]:
            detail = ""
            if "status" in f:
                detail = f"  {f['status']}"
                if "records" in f:
                    plural = "" if f["records"] == 1 else "s"
                    detail += f", {f['records']} record{plural}, {f['codec']}"
                if f.get("problem"):
                    detail += f": {f['problem']}"
            out.append(f"    {f['name']:<24} {f['bytes']:>12,} B{detail}")
        if s["versions"] is not None:
            out.append("  recovery")
            out.extend(f"    {line}" for line in _recovery_lines(s["versions"]) or ["none"])
    out.append("")
    if report["problems"]:
        out.append(f"problems    {len(report['problems'])}")
        out.extend(f"  {p}" for p in report["problems"])
    else:
        out.append(
            "problems    none" if report["verified"] else "problems    none found (not verified)"
        )
    return "\n".join(out)
