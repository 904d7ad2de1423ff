"""The wheel: it bundles the jar and ``py.typed``, and works installed into a fresh venv.

The fresh venv has no pyspark: ``jar_path()``, ``submit-args`` and ``inspect --no-verify`` must
work without it, and ``inspect`` with verification must say that it needs pyspark.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import heapstate

ROOT = Path(__file__).resolve().parents[2]
PROVIDER_FLAG = "spark.sql.streaming.stateStore.providerClass=heapstate.HeapStateStoreProvider"


def run(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # Without the machine's Spark confs: submit-args keeps the plugins of a spark-defaults.conf.
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME")}
    return subprocess.run(
        [str(a) for a in argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_wheel_bundles_the_jar_and_works_in_a_fresh_venv(tmp_path: Path) -> None:
    # Build from a clean copy, so that no build/ leftovers of the source tree get in.
    source = tmp_path / "src"
    shutil.copytree(
        ROOT / "python",
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    pip = Path(sys.executable).parent / "pip"
    built = run(pip, "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", source)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("spark_heapstate-*.whl")

    repo_jar = (ROOT / "python" / "heapstate" / "jars" / "heapstate.jar").read_bytes()
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert zf.read("heapstate/jars/heapstate.jar") == repo_jar
        assert "heapstate/py.typed" in names
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert zf.read(entry_points).decode().split() == [
            "[console_scripts]",
            "heapstate",
            "=",
            "heapstate.cli:main",
        ]
    modules = sorted(n for n in names if n.startswith("heapstate/") and n.endswith(".py"))
    package = Path(heapstate.__file__).parent
    assert modules == sorted(f"heapstate/{p.name}" for p in package.glob("*.py"))

    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    installed = run(venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-index", wheel)
    assert installed.returncode == 0, installed.stderr

    probe = run(
        venv / "bin" / "python",
        "-c",
        "import heapstate, json, importlib.util; "
        "print(json.dumps([heapstate.jar_path(), importlib.util.find_spec('pyspark') is None]))",
    )
    assert probe.returncode == 0, probe.stderr
    jar, no_pyspark = json.loads(probe.stdout)
    assert no_pyspark, "the fresh venv was meant to have no pyspark"
    assert Path(jar).is_relative_to(venv), jar
    assert Path(jar).read_bytes() == repo_jar

    expected = ["--jars", jar, "--conf", "spark.plugins=heapstate.TaskActivityPlugin"]
    expected += ["--conf", PROVIDER_FLAG]
    for argv in ([venv / "bin" / "heapstate"], [venv / "bin" / "python", "-m", "heapstate"]):
        done = run(*argv, "submit-args")
        assert (done.returncode, done.stderr) == (0, ""), argv
        assert shlex.split(done.stdout) == expected, argv

    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text(
        'v1\n{"conf":{"spark.sql.streaming.stateStore.providerClass":'
        '"heapstate.HeapStateStoreProvider"}}\n{}\n'
    )
    (checkpoint / "state" / "0" / "0").mkdir(parents=True)
    (checkpoint / "state" / "0" / "0" / "1.hs-journal").write_bytes(b"x" * 7)

    listed = run(venv / "bin" / "heapstate", "inspect", "--no-verify", "--json", checkpoint)
    assert (listed.returncode, listed.stderr) == (0, ""), listed.stderr
    (store,) = json.loads(listed.stdout)["stores"]
    assert store["files"] == [{"name": "1.hs-journal", "kind": "journal", "version": 1, "bytes": 7}]

    verified = run(venv / "bin" / "heapstate", "inspect", checkpoint)
    assert (verified.returncode, verified.stdout) == (2, "")
    assert verified.stderr == (
        "heapstate inspect: error: verifying heapstate files needs pyspark (pip install "
        "pyspark), or pass --no-verify to list files without verifying them\n"
    )
