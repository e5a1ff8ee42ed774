"""What a `panpriv run` imports before it learns: no scipy on the default learner's path (issue 18).

scipy.special alone cost 120–130 ms of a one-record run's ~0.46 s (its array-API layer imports
numpy.f2py, numpy.ma and numpy.testing); panpriv.accounting.special and panpriv.protocols.sigmoid replace the
four functions it served. The check runs the real CLI in a fresh interpreter and lists the scipy
modules loaded by the time it exits. The positive control is the checkin learner, whose ℓ2
randomizer's normaliser still uses scipy.special.gammaln.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_PROBE = """
import json, runpy, sys
sys.argv = ["panpriv", *json.loads(sys.argv[1])]
try:
    runpy.run_module("panpriv.streamer.commands.cli", run_name="__main__")
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] == "scipy")))
"""


def _scipy_modules_after_run(tmp_path: Path, *options: str) -> list[str]:
    argv = ["run", "--source", "synthetic:n=8&dim=5", "--dim", "5", "--feature-bound", "1", "--metrics-port", "0",
            "--progress", "off", "-q", "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state"), *options]
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv)], capture_output=True, text=True, check=True, timeout=120)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_default_run_imports_no_scipy(tmp_path: Path) -> None:
    assert _scipy_modules_after_run(tmp_path) == []


def test_the_probe_sees_scipy_where_a_learner_uses_it(tmp_path: Path) -> None:
    assert "scipy.special" in _scipy_modules_after_run(tmp_path, "--learner", "checkin")
