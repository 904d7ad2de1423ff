"""The heapstate command line.

  heapstate submit-args [--compaction-interval N] [--codec C] [--undo-versions N] [--no-task-plugin]
      prints the spark-submit flags that turn heapstate on
  heapstate inspect CHECKPOINT [--json] [--no-verify]
      shows each operator's and partition's state files, versions and recovery chains
  heapstate migrate CHECKPOINT --to {heapstate,hdfs} [--dry-run] [--json] [--idle-seconds S]
      moves a stopped query's state between Spark's HDFS provider and heapstate

Exit codes: 0 success; 1 inspect found damaged files or versions that cannot be recovered;
2 the command could not run (bad arguments, a path that is not a checkpoint, a migration refused
or failed, ...).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence

from heapstate._config import (
    PLUGIN_CLASS,
    PLUGINS_CONF,
    _append_listed,
    _spark_defaults,
    conf_entries,
    jar_path,
)

EXIT_PROBLEMS = 1
EXIT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heapstate",
        description="heapstate, a heap state store for Spark Structured Streaming.",
        epilog="exit codes: 0 ok; 1 inspect found problems; 2 the command could not run",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    submit = sub.add_parser(
        "submit-args",
        help="print the spark-submit flags that turn heapstate on",
        description="Print the --jars and --conf flags for spark-submit, shell-quoted, e.g. "
        "spark-submit $(heapstate submit-args) job.py. The spark.plugins printed keeps those of "
        "spark-defaults.conf; a later --conf spark.plugins replaces it, so list other plugins in "
        "one value, comma-separated.",
    )
    submit.add_argument("--compaction-interval", type=int, metavar="N")
    submit.add_argument("--codec", metavar="CODEC", help="zstd, lz4, snappy or none")
    submit.add_argument("--undo-versions", type=int, metavar="N")
    submit.add_argument(
        "--no-task-plugin",
        action="store_true",
        help=f"leave {PLUGIN_CLASS} out of {PLUGINS_CONF} (it lets background snapshots wait "
        "while tasks run on every core)",
    )

    inspect = sub.add_parser(
        "inspect",
        help="show a checkpoint's state stores: versions, files, sizes, recovery chains",
        description="For each operator and partition of a checkpoint: the provider, the "
        "versions present, journal and snapshot sizes, the snapshot each version recovers "
        "from and the length of its journal chain, and any missing or damaged file. "
        "heapstate's files are verified through a local JVM (pyspark needed) unless "
        "--no-verify is given.",
    )
    inspect.add_argument("checkpoint", metavar="CHECKPOINT", help="a local checkpoint location")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of text")
    inspect.add_argument(
        "--no-verify",
        action="store_true",
        help="only list files and sizes: no JVM, no verification, no recovery chains",
    )

    migrate = sub.add_parser(
        "migrate",
        help="move a stopped query's state between Spark's HDFS provider and heapstate",
        description="Convert the state of the last committed batch of every operator, partition "
        "and store into the other provider's snapshot, verify it by loading it back, then pin "
        "that provider in the newest offset log entry (backed up first), so that the restarted "
        "query continues where it stopped. Refuses while the query looks active (a file under "
        "offsets/, commits/ or state/ written less than --idle-seconds ago), when a batch is "
        "uncommitted, and for other providers. Needs pyspark: the state is read and written "
        "by the providers themselves, in a local JVM.",
    )
    migrate.add_argument("checkpoint", metavar="CHECKPOINT", help="a local checkpoint location")
    migrate.add_argument(
        "--to", required=True, choices=["heapstate", "hdfs"], help="the provider to move to"
    )
    migrate.add_argument(
        "--dry-run",
        action="store_true",
        help="check and read every store, show what would be written, write nothing",
    )
    migrate.add_argument("--json", action="store_true", help="print JSON instead of text")
    migrate.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="refuse if the checkpoint was written less than S seconds ago (default 60)",
    )
    return parser


def _submit_args(args: argparse.Namespace) -> int:
    entries = conf_entries(
        compaction_interval=args.compaction_interval,
        codec=args.codec,
        undo_versions=args.undo_versions,
    )
    flags = ["--jars", jar_path()]
    if not args.no_task_plugin:
        plugins = _append_listed(_spark_defaults(PLUGINS_CONF), PLUGIN_CLASS)
        flags += ["--conf", f"{PLUGINS_CONF}={plugins}"]
    for key, value in entries.items():
        flags += ["--conf", f"{key}={value}"]
    print(" ".join(shlex.quote(f) for f in flags))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from heapstate._inspection import describe, format_text

    report = describe(args.checkpoint, verify=not args.no_verify)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_text(report))
    return EXIT_PROBLEMS if report["problems"] else 0


def _migrate(args: argparse.Namespace) -> int:
    from heapstate._migration import format_text, migrate

    report = migrate(args.checkpoint, args.to, dry_run=args.dry_run, idle_seconds=args.idle_seconds)
    print(json.dumps(report, indent=2) if args.json else format_text(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    >>> from heapstate.cli import main
    >>> main(["submit-args", "--codec", "lz4"])  # doctest: +ELLIPSIS
    --jars .../heapstate.jar --conf spark.plugins=heapstate.TaskActivityPlugin --conf spark.sql.streaming.stateStore.providerClass=heapstate.HeapStateStoreProvider --conf spark.sql.streaming.stateStore.heapstate.compressionCodec=lz4
    0
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "submit-args":
            return _submit_args(args)
        if args.command == "migrate":
            return _migrate(args)
        return _inspect(args)
    except (ValueError, OSError, RuntimeError) as e:  # NotACheckpointError is a ValueError
        print(f"heapstate {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
