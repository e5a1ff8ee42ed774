"""Run the service twice over the same records and read the budget they share.

    python examples/budget_across_runs.py

Every ``panpriv run`` charges the records it learns to a budget store shared by every run on the
machine; a second run over the same records — here the same numbers written in another format,
CSV instead of JSON lines — is a second use, and its statement composes both. ``--max-epsilon``
refuses a run whose records would go over the limit, before it learns anything (exit code 3).
This example keeps its store, its data and its outputs in a temporary folder
(``PANPRIV_STATE_DIR``), not in your own store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PANPRIV = [sys.executable, "-m", "panpriv"]


def write_records(folder: Path, n: int = 2_000, dim: int = 4) -> tuple[Path, Path]:
    """The same records twice: JSON lines and CSV (the store identifies records by their numbers)."""
    rng = np.random.default_rng(3)
    X = np.round(rng.normal(size=(n, dim)) / 3, 6)
    y = np.where(X[:, 0] + X[:, 1] > 0, 1, -1)
    jsonl, csv = folder / "events.jsonl", folder / "events.csv"
    jsonl.write_text("".join(json.dumps({"x": row.tolist(), "y": int(label)}) + "\n" for row, label in zip(X, y)))
    csv.write_text("".join(",".join(map(str, row.tolist())) + f",{label}\n" for row, label in zip(X, y)))
    return jsonl, csv


def run(source: Path, fmt: str, out: Path, env: dict[str, str], *extra: str) -> int:
    """``panpriv run`` over ``source``; prints the first sentence of its privacy statement."""
    command = [*PANPRIV, "-q", "run", "--source", f"file:{source}", "--format", fmt, "--dim", "4",
               "--feature-bound", "1", "--out", str(out), "--metrics-port", "0", "--progress", "off", *extra]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
    for line in done.stdout.splitlines():
        if line.strip().startswith("privacy"):
            print(f"{source.name}: {line.split('privacy', 1)[1].strip().split(';')[0]}")
    return done.returncode


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        env = {**os.environ, "PANPRIV_STATE_DIR": str(folder / "budget")}
        jsonl, csv = write_records(folder)
        assert run(jsonl, "json", folder / "first", env) == 0
        assert run(csv, "csv", folder / "second", env) == 0  # the same numbers: a second use
        refused = run(jsonl, "json", folder / "third", env, "--max-epsilon", "2.5")
        print(f"a third run under --max-epsilon 2.5 exits {refused} (3: refused by the budget, nothing learned)")
        subprocess.run([*PANPRIV, "budget"], env=env, check=True)


if __name__ == "__main__":
    main()
