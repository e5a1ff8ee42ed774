"""Start-up cost of the CLI: ``panpriv --help``, a whole one-record run, and what the run imports.

    .venv/bin/python -m benchmarks.startup [--repeats 7]

Prints the least and median wall time of ``--repeats`` fresh processes for:

* ``panpriv --help`` (argument parsing only: the learners are listed from the catalogue, no
  learner module is imported);
* ``panpriv run`` over one synthetic record (pan-acsa, d = 20, no metrics port, a fresh ``--out``):
  start-up, calibration, the record, the final checkpoint and snapshot — an upper bound on the
  time to the first record;
* the same run's time to its first record: from the process's start (its own clock, read by the
  parent just before it starts the child) to the learner's first ``learn_many`` call, which a
  probe reports (it wraps ``PanPrivateACSA.learn_many`` when the module is first imported, so
  the run imports exactly what it would without the probe);

then the slowest imports of that run by ``python -X importtime`` (cumulative microseconds), the
measure issue 18 asks for. The machine's load is printed: on a shared 2-core machine the numbers
move by tens of percent between runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN_ARGS = ["run", "--source", "synthetic:n=1&dim=20", "--dim", "20", "--feature-bound", "1", "--metrics-port", "0", "--progress", "off", "-q"]


def wall_times(argv: list[str], repeats: int, fresh_out: bool) -> list[float]:
    """Seconds of ``repeats`` fresh ``python -m panpriv`` processes (a new --out each when asked)."""
    times = []
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PANPRIV_STATE_DIR": str(Path(work) / "state")}
        for repeat in range(repeats):
            extra = ["--out", str(Path(work) / f"out{repeat}")] if fresh_out else []
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "panpriv", *argv, *extra], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return times


_FIRST_RECORD_PROBE = """
import importlib.abc, importlib.machinery, runpy, sys, time

class _Probe(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "panpriv.protocols.pan_acsa":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            learner, learn_many = module.PanPrivateACSA, module.PanPrivateACSA.learn_many

            def first_learn_many(self, *args, **kwargs):
                learner.learn_many = learn_many
                print(f"first-record {time.time():.6f}", file=sys.stderr, flush=True)
                return learn_many(self, *args, **kwargs)

            learner.learn_many = first_learn_many

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Probe())
sys.argv = ["panpriv", *sys.argv[1:]]
runpy.run_module("panpriv.streamer.commands.cli", run_name="__main__")
"""


def first_record_times(repeats: int) -> list[float]:
    """Seconds from just before each fresh process starts to its learner's first ``learn_many``."""
    times = []
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PANPRIV_STATE_DIR": str(Path(work) / "state")}
        for repeat in range(repeats):
            start = time.time()
            done = subprocess.run([sys.executable, "-c", _FIRST_RECORD_PROBE, *RUN_ARGS, "--out", str(Path(work) / f"out{repeat}")],
                                  env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            stamps = [float(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("first-record ")]
            times.append(stamps[0] - start)
    return times


def slowest_imports(count: int) -> list[tuple[int, str]]:
    """The ``count`` largest cumulative import times (µs, module) of a one-record run."""
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PANPRIV_STATE_DIR": str(Path(work) / "state")}
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "panpriv", *RUN_ARGS, "--out", str(Path(work) / "out")],
                              env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit():
                rows.append((int(cumulative), name.rstrip()))
    top_level = [row for row in rows if not row[1].startswith("  ")]  # imports made by the run itself
    return sorted(top_level, reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"start-up (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.repeats} fresh processes each)")
    for label, argv, fresh in (("panpriv --help", ["--help"], False), ("panpriv run, one record", RUN_ARGS, True)):
        times = wall_times(argv, args.repeats, fresh)
        print(f"  {label:26s} least {min(times):.3f} s   median {statistics.median(times):.3f} s")
    times = first_record_times(args.repeats)
    print(f"  {'  ... to its first record':26s} least {min(times):.3f} s   median {statistics.median(times):.3f} s")
    print("slowest top-level imports of the run (cumulative, python -X importtime):")
    for micros, name in slowest_imports(8):
        print(f"  {micros / 1e3:8.1f} ms  {name.strip()}")


if __name__ == "__main__":
    main()
