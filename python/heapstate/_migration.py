"""``heapstate migrate``: move a stopped query's checkpoint between Spark's HDFS provider and heapstate.

Spark pins ``spark.sql.streaming.stateStore.providerClass`` in every offset log entry and, on a
restart, takes it from the newest one. A migration therefore:

1. checks that the query is stopped and its last batch committed (see :func:`check_quiet`);
2. converts, in the JVM (``heapstate.tools.CheckpointMigration``), the state of every operator,
   partition and store as of the last committed batch into the target provider's snapshot, in a
   staging directory inside the checkpoint. The source provider reads its own files, the target
   provider loads the converted store back, and the two must hold the same rows;
3. only then backs up every file it is about to change, copies the staged snapshots into the state
   directories (under names the source provider ignores), and rewrites the provider in the newest
   offset log entry, last. Until that rewrite the checkpoint still runs on the source provider.

The restarted query runs its next batch on the target provider, from the converted snapshot.
Older offset log entries keep the old provider, so Spark's state data source still reads the
batches before the migration with the provider that wrote them.

Only local checkpoints (a path or a ``file:`` URI) are migrated.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from heapstate._checkpoint import HDFS_PROVIDER, PathLike, require_checkpoint
from heapstate._config import CONF_PREFIX, PROVIDER_CLASS, PROVIDER_CONF

TARGETS: dict[str, str] = {"heapstate": PROVIDER_CLASS, "hdfs": HDFS_PROVIDER}
"""``--to`` choices and the provider class each stands for."""

DEFAULT_IDLE_SECONDS = 60
"""A checkpoint with a file written more recently than this looks active (see :func:`check_quiet`)."""

BACKUP_DIR = "_heapstate_migration_backup"
STAGING_DIR = "_heapstate_migration_staging"

Report = dict[str, Any]
JvmConvert = Callable[..., Report]
"""``(checkpoint, source, target, version, confs, staging_or_None) -> report``; see :func:`convert_with_jvm`."""


class MigrationRefused(ValueError):
    """The checkpoint cannot be migrated as it is; the message says why and what to do."""


# --------------------------------------------------------------------------------------------
# Reading the checkpoint


def _batch_ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_file())


@dataclass(frozen=True)
class OffsetEntry:
    """One offset log file, split into the parts Spark writes: version line, metadata, offsets."""

    file: Path
    lines: list[str]
    metadata: dict[str, Any]

    @classmethod
    def read(cls, file: Path) -> OffsetEntry:
        text = file.read_text(encoding="utf-8")
        lines = text.split("\n")
        if len(lines) < 2 or lines[0] not in ("v1", "v2"):
            raise MigrationRefused(
                f"{file} is not an offset log entry heapstate can rewrite: expected 'v1' or 'v2' "
                f"on its first line, found {lines[0][:40]!r}"
            )
        try:
            metadata = json.loads(lines[1])
        except json.JSONDecodeError as e:
            raise MigrationRefused(
                f"{file}: line 2 is not the JSON metadata Spark writes: {e}"
            ) from e
        if not isinstance(metadata, dict) or not isinstance(metadata.get("conf"), dict):
            raise MigrationRefused(f"{file}: line 2 has no 'conf' object, so it pins no provider")
        return cls(file, lines, metadata)

    @property
    def conf(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.metadata["conf"].items()}

    def with_provider(self, provider: str) -> str:
        """The file's text with ``provider`` pinned; every other byte as Spark wrote it."""
        metadata = dict(self.metadata)
        metadata["conf"] = {**self.metadata["conf"], PROVIDER_CONF: provider}
        line = json.dumps(metadata, separators=(",", ":"), ensure_ascii=False)
        return "\n".join([self.lines[0], line, *self.lines[2:]])


def _newest_write(checkpoint: Path) -> tuple[float, Path] | None:
    """The newest modification time among the files a running query writes, and that file.

    The offset and commit logs (every batch), and the state directories (every batch and
    maintenance snapshots). Hidden files (Hadoop's ``.crc``, temporary files) count too: an
    atomic write in progress is activity.
    """
    newest: tuple[float, Path] | None = None
    roots = [checkpoint / "offsets", checkpoint / "commits", checkpoint / "state"]
    for root in roots:
        if not root.is_dir():
            continue
        for directory, _, names in os.walk(root):
            for name in names:
                path = Path(directory) / name
                try:
                    mtime = path.stat().st_mtime
                except FileNotFoundError:  # a temporary file renamed while we walk
                    mtime = time.time()
                if newest is None or mtime > newest[0]:
                    newest = (mtime, path)
    return newest


def check_quiet(checkpoint: Path, idle_seconds: float, now: float | None = None) -> None:
    """Refuse when the query looks active.

    Spark keeps no lock in a checkpoint, so activity is judged from the files a running query
    writes: the query looks active when any file under ``offsets/``, ``commits/`` or ``state/`` was
    modified less than ``idle_seconds`` ago (a running query writes them every batch, and its
    maintenance thread writes snapshots every ``maintenanceInterval``, 60 s by default). A query
    that is running but idle for longer than that is not seen: stop the query first.
    """
    newest = _newest_write(checkpoint)
    if newest is None:
        return
    age = (time.time() if now is None else now) - newest[0]
    if age < idle_seconds:
        raise MigrationRefused(
            f"the query of {checkpoint} looks active: {newest[1]} was written {max(age, 0):.0f} s "
            f"ago (less than {idle_seconds:g} s). Stop the query, wait until nothing writes to "
            "the checkpoint, and run heapstate migrate again (--idle-seconds sets the wait)"
        )


@dataclass(frozen=True)
class Plan:
    """What a migration of one checkpoint will do, before it reads any state."""

    checkpoint: Path
    source: str
    target: str
    batch_id: int
    """The last committed batch; the state converted is the version it committed."""
    offsets: OffsetEntry

    @property
    def version(self) -> int:
        """The state version batch ``batch_id`` committed (Spark's versions are batch id + 1)."""
        return self.batch_id + 1


def plan(checkpoint: PathLike, to: str, idle_seconds: float = DEFAULT_IDLE_SECONDS) -> Plan:
    """Check that ``checkpoint`` can move to provider ``to`` (``heapstate`` or ``hdfs``).

    Raises ``NotACheckpointError`` for a path that is not a checkpoint, and
    :class:`MigrationRefused`, with the reason, when the checkpoint has an uncommitted batch, looks
    active, or is pinned to a provider other than the one migrated from.
    """
    if to not in TARGETS:
        raise MigrationRefused(f"--to {to!r}: expected one of {', '.join(TARGETS)}")
    target = TARGETS[to]
    path = require_checkpoint(checkpoint).absolute()
    # Activity first: a running query also has an uncommitted batch most of the time, and
    # "it is running" is the message that tells the user what to do.
    check_quiet(path, idle_seconds)
    offsets = _batch_ids(path / "offsets")
    commits = _batch_ids(path / "commits")
    if not offsets:
        raise MigrationRefused(
            f"{path} has no offset log entry: no batch has run, so there is no state to migrate. "
            "Start the query with the provider you want instead."
        )
    last_commit = commits[-1] if commits else None
    if last_commit is None or offsets[-1] > last_commit:
        committed = "no batch" if last_commit is None else f"batch {last_commit}"
        raise MigrationRefused(
            f"{path} has uncommitted batches: offsets/{offsets[-1]} was started but {committed} "
            "is the last committed. Restart the query on its current provider until it has "
            "committed that batch, stop it, then migrate."
        )
    if last_commit > offsets[-1]:
        raise MigrationRefused(
            f"{path}: commits/{last_commit} has no offset log entry (the newest is "
            f"offsets/{offsets[-1]}); the checkpoint is inconsistent"
        )
    entry = OffsetEntry.read(path / "offsets" / str(offsets[-1]))
    source = entry.conf.get(PROVIDER_CONF)
    if source is None:
        raise MigrationRefused(
            f"{entry.file} pins no state store provider, so Spark would take the session's; "
            "heapstate migrate cannot tell which provider wrote the state"
        )
    if source == target:
        raise MigrationRefused(
            f"{path} already uses {target} (pinned in {entry.file}); nothing to do"
        )
    expected = TARGETS["hdfs" if to == "heapstate" else "heapstate"]
    if source != expected:
        raise MigrationRefused(
            f"{path} was made with {source} (pinned in {entry.file}): --to {to} migrates "
            f"from {expected} only. heapstate migrate converts between Spark's HDFS provider and "
            "heapstate; it does not read other providers' state."
        )
    version = entry.conf.get("spark.sql.streaming.stateStore.checkpointFormatVersion", "1")
    if version != "1":
        raise MigrationRefused(
            f"{path} uses state checkpoint format version {version} (pinned in {entry.file}); "
            "heapstate migrate converts format 1 only"
        )
    return Plan(path, source, target, offsets[-1], entry)


# --------------------------------------------------------------------------------------------
# The JVM side


def _java_message(e: Exception) -> str:
    java = getattr(e, "java_exception", None)
    if java is None:
        return str(e)
    # The converter's own message names the operator, partition and store; keep it, not the stack.
    cause = java
    while cause is not None:
        if cause.getClass().getName().endswith("MigrationException"):
            return str(cause.getMessage())
        cause = cause.getCause()
    return str(java.toString())


def convert_with_jvm(
    checkpoint: Path,
    source: str,
    target: str,
    version: int,
    confs: dict[str, str],
    staging: Path | None,
) -> Report:
    """``CheckpointMigration.runJson``, parsed: read (and with ``staging``, convert) every store.

    Uses the active SparkSession if there is one; otherwise starts a local one (one core, no UI)
    with the bundled jar, and stops it afterwards.
    """
    from heapstate._session import tool_session

    needs_pyspark = "heapstate migrate needs pyspark (pip install pyspark)"
    tool_class = "heapstate.tools.CheckpointMigration"
    with tool_session("heapstate-migrate", tool_class, needs_pyspark) as spark:
        session_confs = {k: v for k, v in spark.conf.getAll.items() if k.startswith(CONF_PREFIX)}
        tool = spark._jvm.heapstate.tools.CheckpointMigration  # type: ignore[attr-defined]
        try:
            text = tool.runJson(
                str(checkpoint),
                source,
                target,
                version,
                json.dumps({**session_confs, **confs}),
                None if staging is None else str(staging),
            )
        except Exception as e:  # a Py4JJavaError
            raise RuntimeError(f"nothing was changed: {_java_message(e)}") from e
        return json.loads(text)


# --------------------------------------------------------------------------------------------
# Publishing


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def _crc(path: Path) -> Path:
    """Hadoop's checksum file for ``path`` on the local file system."""
    return path.with_name(f".{path.name}.crc")


class _Backup:
    """Copies files into the backup directory, under their path relative to the checkpoint."""

    def __init__(self, checkpoint: Path, directory: Path) -> None:
        self.checkpoint = checkpoint
        self.directory = directory
        self.saved: list[str] = []

    def save(self, path: Path) -> None:
        for p in (path, _crc(path)):
            if p.exists():
                rel = p.relative_to(self.checkpoint)
                dst = self.directory / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, dst)
                self.saved.append(str(rel))


def _replace(path: Path, data: bytes | Path) -> None:
    """Write ``path`` atomically (temporary file, then rename), dropping its stale checksum."""
    tmp = path.with_name(f".{path.name}.heapstate-migrate.tmp")
    if isinstance(data, Path):
        shutil.copyfile(data, tmp)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)
    # Hadoop's local file system verifies a file against its .crc when one exists; the old one
    # no longer matches (it was backed up first), and without one the file is read unchecked.
    _crc(path).unlink(missing_ok=True)


def _write_manifest(directory: Path, manifest: Report) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "MIGRATION.json").write_text(json.dumps(manifest, indent=2) + "\n")


def migrate(
    checkpoint: PathLike,
    to: str,
    dry_run: bool = False,
    idle_seconds: float = DEFAULT_IDLE_SECONDS,
    jvm: JvmConvert = convert_with_jvm,
) -> Report:
    """Migrate a stopped query's checkpoint to provider ``to`` (``"heapstate"`` or ``"hdfs"``).

    Returns the report (JSON-ready): the providers, the batch and version, each store with its
    row count, the files written and the backup directory. With ``dry_run`` it reads every store
    through the source provider, to check it can, and writes nothing.

    Raises :class:`MigrationRefused` (a ``ValueError``) when the checkpoint cannot be migrated, and
    ``RuntimeError`` when a conversion fails; the checkpoint is then unchanged.

    A dry run on a stopped query's checkpoint made with heapstate, which committed one batch:

    >>> from heapstate._migration import migrate
    >>> report = migrate(checkpoint, to="hdfs", dry_run=True, idle_seconds=0)
    >>> report["source"], report["batch"], report["version"]
    ('heapstate.HeapStateStoreProvider', 0, 1)
    >>> [w.split("/state/")[-1] for w in report["written"]]  # doctest: +ELLIPSIS
    ['0/0/1.snapshot', '0/1/1.snapshot', '/.../offsets/0']

    and the migration itself, for real:

    >>> report = migrate("/data/checkpoints/orders", to="heapstate")  # doctest: +SKIP
    >>> report["backup"]  # doctest: +SKIP
    '/data/checkpoints/orders/_heapstate_migration_backup/20261121T181500123456Z'
    """
    p = plan(checkpoint, to, idle_seconds)
    stamp = _stamp()
    report: Report = {
        "checkpoint": str(p.checkpoint),
        "source": p.source,
        "target": p.target,
        "batch": p.batch_id,
        "version": p.version,
        "offsetLogEntry": str(p.offsets.file),
        "dryRun": dry_run,
        "backup": None,
        "stores": [],
        "written": [],
    }
    if dry_run:
        converted = jvm(p.checkpoint, p.source, p.target, p.version, p.offsets.conf, None)
        report["stores"] = converted["stores"]
        report["written"] = [
            str(p.checkpoint / "state" / _target_name(s, p)) for s in converted["stores"]
        ] + [str(p.offsets.file)]
        report["backup"] = str(p.checkpoint / BACKUP_DIR / "<time of the migration>")
        return report

    staging = p.checkpoint / STAGING_DIR / stamp
    try:
        converted = jvm(p.checkpoint, p.source, p.target, p.version, p.offsets.conf, staging)
        # Conversions done and verified: publish. First the snapshots, under names the source
        # provider ignores, then the offset log entry, which switches the provider.
        backup = _Backup(p.checkpoint, p.checkpoint / BACKUP_DIR / stamp)
        staged_root = staging / "state"
        files = [f for s in converted["stores"] for f in s["stagedFiles"]]
        manifest: Report = {
            "from": p.source,
            "to": p.target,
            "batch": p.batch_id,
            "version": p.version,
            "offsetLogEntry": str(p.offsets.file.relative_to(p.checkpoint)),
            "stateFilesAdded": [f"state/{f}" for f in files],
            "undo": "copy offsets/ from this directory back into the checkpoint (and delete the "
            "added state files if you like: the restored provider ignores them)",
        }
        _write_manifest(backup.directory, manifest)
        backup.save(p.offsets.file)
        for rel in files:
            dst = p.checkpoint / "state" / rel
            backup.save(dst)  # nothing to save unless a file of that name exists already
            _replace(dst, staged_root / rel)
        _replace(p.offsets.file, p.offsets.with_provider(p.target).encode("utf-8"))
        manifest["backedUp"] = backup.saved
        _write_manifest(backup.directory, manifest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            (p.checkpoint / STAGING_DIR).rmdir()
        except OSError:
            pass
    report["stores"] = converted["stores"]
    report["written"] = [str(p.checkpoint / "state" / f) for f in files] + [str(p.offsets.file)]
    report["backup"] = str(backup.directory)
    return report


def _target_name(store: Report, p: Plan) -> str:
    suffix = "hs-snapshot" if p.target == PROVIDER_CLASS else "snapshot"
    rel = f"{store['operator']}/{store['partition']}"
    if store["store"] != "default":
        rel += f"/{store['store']}"
    return f"{rel}/{p.version}.{suffix}"


# --------------------------------------------------------------------------------------------
# Text


def _short(provider: str) -> str:
    return provider.rsplit(".", 1)[-1]


def format_text(report: Report) -> str:
    """The report for people: what was (or, in a dry run, would be) converted and written."""
    dry = report["dryRun"]
    out = [
        f"checkpoint  {report['checkpoint']}",
        f"from        {report['source']}",
        f"to          {report['target']}",
        f"state       batch {report['batch']} (the last committed), version {report['version']}",
    ]
    stores = report["stores"]
    rows = sum(s["rows"] for s in stores)
    check = "read" if dry else "converted and verified"
    out.append(f"stores      {len(stores)}, {rows:,} rows {check}")
    for s in stores:
        out.append(
            f"  operator {s['operator']} ({s['operatorName']}), partition {s['partition']}, "
            f"store {s['store']}: {s['rows']:,} rows"
        )
    out.append("")
    verb = "would write" if dry else "wrote"
    out.append(f"{verb} {len(report['written'])} files:")
    out.extend(f"  {w}" for w in report["written"])
    if dry:
        out.append(
            f"would pin {report['target']} in {report['offsetLogEntry']}, after backing it up "
            f"under {report['backup']}"
        )
        out.append("dry run: nothing was written")
    else:
        out.append(f"pinned {_short(report['target'])} in {report['offsetLogEntry']}")
        out.append(f"backup      {report['backup']}")
        out.append(
            f"done: restart the query with the same checkpoint; it continues on "
            f"{_short(report['target'])} from batch {report['batch'] + 1}"
        )
    return "\n".join(out)
