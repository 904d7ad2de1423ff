"""What a checkpoint says from Python: its pinned provider and its state files, by name and size.

Only file names, sizes and the offset log (plain text and JSON, written by Spark) are read here.
The contents of heapstate's own files are read by the Scala ``io`` layer only (see
``CheckpointInspector``), so that the file format is parsed in one place.

Checkpoint layout, as Spark writes it::

    <checkpoint>/metadata                 the query id
    <checkpoint>/offsets/<batchId>        line 1 "v1", line 2 JSON with the pinned confs
    <checkpoint>/commits/<batchId>
    <checkpoint>/state/<op>/<partition>[/<storeName>]/<version>.<kind>

Only local checkpoints (plain paths or ``file:`` URIs) can be read from Python.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union
from urllib.parse import unquote, urlparse

from heapstate._config import PROVIDER_CLASS, PROVIDER_CONF

PathLike = Union[str, "os.PathLike[str]"]
"""A checkpoint location: a local path, as a string or path object, or a ``file:`` URI."""

Checkpoints = PathLike | Iterable[PathLike]
"""One checkpoint location or several, as the ``checkpoint=`` arguments take them."""

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

STATE_FILE = re.compile(
    r"^(\d+)(?:_[0-9A-Za-z-]+){0,2}\.(hs-journal|hs-snapshot|delta|snapshot|changelog|zip)$"
)
"""A state file of any provider: heapstate (``hs-*``), HDFS (``delta``, ``snapshot``) or
RocksDB (``changelog``, ``zip``; its SST files live in subdirectories and are not listed). In
checkpoint format version 2, heapstate and RocksDB put checkpoint ids after the version
(``<version>_<id>[_<baseId>]``)."""

FILE_KINDS: dict[str, tuple[str, str]] = {
    "hs-journal": (PROVIDER_CLASS, "journal"),
    "hs-snapshot": (PROVIDER_CLASS, "snapshot"),
    "delta": (HDFS_PROVIDER, "delta"),
    "snapshot": (HDFS_PROVIDER, "snapshot"),
    "changelog": (ROCKSDB_PROVIDER, "changelog"),
    "zip": (ROCKSDB_PROVIDER, "zip"),
}
"""File extension -> (the provider that writes it, the kind of file)."""


class ProviderMismatchWarning(UserWarning):
    """A checkpoint was made with a state store provider other than the one being set.

    Spark pins the provider class in each checkpoint's offset log: a query restarted from that
    checkpoint keeps its provider, whatever the session says.
    """


class NotACheckpointError(ValueError):
    """A path is not the checkpoint location of a streaming query."""


def local_path(location: PathLike) -> Path:
    """The local path of a checkpoint location given as a path or a ``file:`` URI.

    >>> str(local_path("file:///tmp/cp"))
    '/tmp/cp'
    >>> local_path("s3a://bucket/cp")
    Traceback (most recent call last):
    ...
    ValueError: s3a://bucket/cp: heapstate reads local checkpoints only (a path or a file: URI)
    """
    text = os.fspath(location)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter is a Windows drive
        raise ValueError(f"{text}: heapstate reads local checkpoints only (a path or a file: URI)")
    return Path(text)


@dataclass(frozen=True)
class ProviderPin:
    """The provider pinned by a checkpoint's newest offset log entry."""

    provider: str | None
    """The provider class, or None when the entry pins none (Spark then uses the session's)."""
    batch_id: int
    file: Path


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def read_provider_pin(checkpoint: PathLike) -> ProviderPin | None:
    """The newest offset log entry's pinned provider, or None when there is no entry yet."""
    offsets = local_path(checkpoint) / "offsets"
    if not offsets.is_dir():
        return None
    batches = [int(p.name) for p in offsets.iterdir() if p.name.isdigit() and p.is_file()]
    if not batches:
        return None
    newest = max(batches)
    file = offsets / str(newest)
    lines = file.read_text(encoding="utf-8").splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise ValueError(
            f"{file} is not an offset log entry: expected a version line such as 'v1' and a "
            f"metadata line, found {lines[:2]!r}"
        )
    metadata = _json_object(lines[1])
    if metadata is None:
        raise ValueError(
            f"{file}: line 2 is not the JSON metadata of an offset log: {lines[1][:100]!r}"
        )
    conf = metadata.get("conf") or {}
    provider = conf.get(PROVIDER_CONF) if isinstance(conf, dict) else None
    return ProviderPin(provider, newest, file)


def checkpoint_provider(checkpoint: PathLike) -> str | None:
    """Return the state store provider class that ``checkpoint`` is pinned to.

    Spark records the provider in every offset log entry (``<checkpoint>/offsets/<batchId>``);
    this reads the newest. A query restarted from the checkpoint keeps that provider, whatever
    the session says. Returns ``None`` when nothing is pinned yet (no batch has started: the
    location is new or empty), so a query started there takes the session's provider.

    Raises ``ValueError`` naming the file when the newest entry cannot be parsed, and for a
    location that is not local.

    >>> import heapstate, tempfile
    >>> heapstate.checkpoint_provider(tempfile.mkdtemp()) is None
    True
    >>> heapstate.checkpoint_provider(checkpoint)  # a checkpoint heapstate made
    'heapstate.HeapStateStoreProvider'
    """
    pin = read_provider_pin(checkpoint)
    return pin.provider if pin else None


def _short(provider: str) -> str:
    return provider.rsplit(".", 1)[-1]


def _locations(checkpoint: Checkpoints) -> list[PathLike]:
    if isinstance(checkpoint, (str, os.PathLike)):
        return [checkpoint]
    return list(checkpoint)


def warn_if_pinned_elsewhere(checkpoint: Checkpoints, provider: str, caller: str) -> None:
    """Warn for each checkpoint pinned to a provider other than ``provider``.

    The warning says what will happen: a restart from that checkpoint keeps its own provider.
    A location with no offset log yet pins nothing and gets no warning.
    """
    for location in _locations(checkpoint):
        pin = read_provider_pin(location)
        if pin is None or pin.provider is None or pin.provider == provider:
            continue
        if provider == PROVIDER_CLASS and pin.provider == HDFS_PROVIDER:
            advice = (
                "To run that query on heapstate with its state, stop it and run "
                f"`heapstate migrate {location} --to heapstate`; or start it with a new "
                "checkpoint location (its state then starts empty)."
            )
        elif provider == PROVIDER_CLASS:
            advice = (
                "To run that query on heapstate, start it with a new checkpoint location "
                "(its state then starts empty)."
            )
        else:
            advice = (
                f"It stays on {_short(pin.provider)}, so that provider's jar must stay on the "
                "classpath for it."
            )
        warnings.warn(
            f"checkpoint {location} was made with {pin.provider} (pinned in "
            f"offsets/{pin.batch_id}): {caller} sets {provider} for new queries, but a query "
            f"restarted from this checkpoint keeps using {_short(pin.provider)}. {advice}",
            ProviderMismatchWarning,
            stacklevel=3,
        )


# --------------------------------------------------------------------------------------------
# State files


@dataclass(frozen=True)
class StateFile:
    """One state file: its name, version, the provider that writes files of its kind, size."""

    name: str
    version: int
    provider: str
    kind: str
    bytes: int


@dataclass(frozen=True)
class StoreDir:
    """One state store directory and the state files in it, by version then name."""

    path: Path
    operator: int | None
    partition: int | None
    store: str
    files: tuple[StateFile, ...]

    @property
    def providers(self) -> list[str]:
        """The providers whose files are here (one, unless the directory is mixed up)."""
        return sorted({f.provider for f in self.files})


def _numeric_first(p: Path) -> tuple[int, int | str]:
    return (0, int(p.name)) if p.name.isdigit() else (1, p.name)


def _state_files(directory: Path) -> list[StateFile]:
    files = []
    for entry in os.scandir(directory):
        m = STATE_FILE.match(entry.name)
        if m and entry.is_file():
            provider, kind = FILE_KINDS[m.group(2)]
            files.append(
                StateFile(entry.name, int(m.group(1)), provider, kind, entry.stat().st_size)
            )
    return sorted(files, key=lambda f: (f.version, f.name))


def _walk(directory: Path) -> Iterator[Path]:
    if any(STATE_FILE.match(name) for name in os.listdir(directory)):
        yield directory
    subdirs = [p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))]
    for sub in sorted(subdirs, key=_numeric_first):
        yield from _walk(sub)


def store_dirs(checkpoint: PathLike) -> list[StoreDir]:
    """Every directory under ``<checkpoint>/state`` that holds state files, of any provider.

    Directories starting with ``_`` (operator metadata) or ``.`` are skipped, as Spark does.
    """
    state = local_path(checkpoint) / "state"
    if not state.is_dir():
        return []
    result = []
    for directory in _walk(state):
        parts = directory.relative_to(state).parts
        result.append(
            StoreDir(
                path=directory,
                operator=int(parts[0]) if parts and parts[0].isdigit() else None,
                partition=int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None,
                store=parts[2] if len(parts) > 2 else "default",
                files=tuple(_state_files(directory)),
            )
        )
    return result


def require_checkpoint(location: PathLike) -> Path:
    """The local path of ``location``, if it is a streaming checkpoint; else an error naming it."""
    path = local_path(location)
    if not path.exists():
        raise NotACheckpointError(f"{location}: no such file or directory")
    if not path.is_dir():
        raise NotACheckpointError(f"{location} is a file, not a checkpoint directory")
    if not (path / "offsets").is_dir() and not (path / "metadata").is_file():
        raise NotACheckpointError(
            f"{location} is not a streaming checkpoint: it has no offsets/ directory and no "
            "metadata file"
        )
    return path
