"""Start-up cost of the CLI: ``panpriv --help``, a whole one-record run, and what the run imports.

    .venv/bin/python -m benchmarks.startup [--repeats 7]

Prints the least and median wall time of ``--repeats`` fresh processes for:

* ``panpriv --help`` (argument parsing only: the learners are listed from the catalogue, no
  learner module is imported);
* ``panpriv run`` over one synthetic record (pan-acsa, d = 20, no metrics port, a fresh ``--out``):
  start-up, calibration, the record, the final checkpoint and snapshot — an upper bound on the
  time to the first record;

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
    """Seconds of ``repeats`` fresh ``python -m streamer.cli`` processes (a new --out each when asked)."""
    times = []
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PANPRIV_STATE_DIR": str(Path(work) / "state")}
        for repeat in range(repeats):
            extra = ["--out", str(Path(work) / f"out{repeat}")] if fresh_out else []
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "streamer.cli", *argv, *extra], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return times


def slowest_imports(count: int) -> list[tuple[int, str]]:
    """The ``count`` largest cumulative import times (µs, module) of a one-record run."""
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "PANPRIV_STATE_DIR": str(Path(work) / "state")}
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "streamer.cli", *RUN_ARGS, "--out", str(Path(work) / "out")],
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
    print("slowest top-level imports of the run (cumulative, python -X importtime):")
    for micros, name in slowest_imports(8):
        print(f"  {micros / 1e3:8.1f} ms  {name.strip()}")


if __name__ == "__main__":
    main()
