"""The heapstate command line (first cut: ``submit-args``)."""

from __future__ import annotations

import argparse
import shlex
import sys

from heapstate._config import PROVIDER_CLASS, PROVIDER_CONF, jar_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heapstate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("submit-args", help="print the spark-submit flags that turn heapstate on")
    args = parser.parse_args(argv)
    if args.command == "submit-args":
        flags = ["--jars", jar_path(), "--conf", f"{PROVIDER_CONF}={PROVIDER_CLASS}"]
        print(" ".join(shlex.quote(f) for f in flags))
        return 0
    parser.print_help(sys.stderr)
    return 2
