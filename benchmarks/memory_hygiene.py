"""What issue 32's memory hygiene costs, each measured side by side with the plain form in one run.

- ``clip``: :func:`panpriv.protocols.scratch.clip_rows_into` multiplies every row (the same
  operations whatever the data) against the old form, which skipped the multiply when no row was
  over the bound — on a block with no row to clip (where the old form saved work) and with one.
- ``draw``: a discrete-Gaussian draw of p coordinates with every intermediate zeroed, against the
  same sampler with the zeroing switched off (``Kept.wipe`` a no-op).
- ``seal``: a checkpoint's sealed bytes built in an owned buffer (arrays base64-encoded inside it,
  :func:`panpriv.streamer.state.integrity.seal_document`) against the text path it replaced
  (``json.dumps`` of base64 strings, parsed and dumped again to add the digest).
- ``service``: the CPU time of ``panpriv run`` on a JSON stream with the wiping allocator (the
  default) against ``PANPRIV_ALLOCATOR=default``, run in turn, the ratio taken pair by pair.

    python -m benchmarks.memory_hygiene              # all
    python -m benchmarks.memory_hygiene --only clip draw seal
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from panpriv.protocols import discrete_gaussian, scratch, secure_noise
from panpriv.protocols.scalar_residue import scale_rows
from panpriv.streamer.state.integrity import seal_document


def _median(function: Callable[[], object], repeats: int, rounds: int = 7) -> float:
    """Median over ``rounds`` of the mean seconds of ``repeats`` calls."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            function()
        times.append((time.perf_counter() - start) / repeats)
    return float(np.median(times))


def _old_clip(X, bound, out, norms, work) -> None:  # noqa: ANN001 - the replaced form, for the floor
    np.einsum("ij,ij->i", X, X, out=norms)
    np.sqrt(norms, out=norms)
    scratch._clip_factors(bound, norms)
    np.copyto(out, X)
    least = np.min(norms, out=work.reshape(-1)[:1], keepdims=True)
    if np.less(least, 1.0)[0]:
        scale_rows(out, norms, work)


def clip() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1024, 21))
    X /= np.linalg.norm(X, axis=1, keepdims=True) * 1.1
    over = X.copy()
    over[5] *= 4.0
    out, norms, work = np.empty_like(X), np.empty(1024), np.empty_like(X)
    for name, block in (("no row over", X), ("one row over", over)):
        new = _median(lambda b=block: scratch.clip_rows_into(b, 1.0, out, norms, work), 2000)
        old = _median(lambda b=block: _old_clip(b, 1.0, out, norms, work), 2000)
        print(f"clip 1024x21 {name:13s} always multiply {new * 1e6:7.1f} us   skip when none {old * 1e6:7.1f} us   ratio {new / old:.2f}")


def draw() -> None:
    calibration = secure_noise.calibrate_draw(1.0, 1e-6)
    wipe = discrete_gaussian.Kept.wipe
    for p in (21, 101, 1001):
        sample = lambda: secure_noise.draw(calibration, p, None)  # noqa: E731
        new = _median(sample, 20)
        discrete_gaussian.Kept.wipe = lambda self: None
        try:
            old = _median(sample, 20)
        finally:
            discrete_gaussian.Kept.wipe = wipe
        print(f"secure draw p={p:<5d} zeroed {new * 1e3:6.2f} ms   not zeroed {old * 1e3:6.2f} ms   ratio {new / old:.2f}")


def _old_seal(body: dict) -> bytes:
    def encode(value: object) -> object:
        if isinstance(value, np.ndarray):
            return {"ndarray": {"dtype": value.dtype.str, "shape": list(value.shape),
                                "base64": base64.b64encode(value.tobytes()).decode("ascii")}}
        return value

    text = json.dumps({**body, "state": {k: encode(v) for k, v in body["state"].items()}}, sort_keys=True)
    parsed = json.loads(text)
    canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode("ascii")
    parsed["sha256"] = hashlib.sha256(canonical).hexdigest()
    return json.dumps(parsed, sort_keys=True).encode("utf-8")


def seal() -> None:
    rng = np.random.default_rng(1)
    ledger = {"segments": [[i * 1000, (i + 1) * 1000, ["run"]] for i in range(50)], "instances": {"run": {"epsilon": 1.0}}}
    for p in (21, 1001):
        body = {"state": {k: rng.standard_normal(p) for k in ("theta", "theta_ag", "theta_md")}, "ledger": ledger, "records": 5}
        new = _median(lambda b=body: seal_document(b).wipe(), 200)
        old = _median(lambda b=body: _old_seal(b), 200)
        print(f"seal a checkpoint p={p:<5d} owned buffer {new * 1e6:7.0f} us   text path {old * 1e6:7.0f} us   ratio {new / old:.2f}")


def _cpu_of(command: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def service(records: int, pairs: int) -> None:
    from tests.intruder import canary_stream

    with tempfile.TemporaryDirectory() as work:
        stream = canary_stream(records, "json", seed=3).write_lines(Path(work) / "stream.jsonl")
        ratios, cpu = [], {"wiping": [], "default": []}
        for k in range(pairs):
            for mode in ("wiping", "default"):
                out = Path(work) / f"out-{k}-{mode}"
                env = {**os.environ, "PANPRIV_STATE_DIR": str(out / "state")}
                if mode == "default":
                    env["PANPRIV_ALLOCATOR"] = "default"
                command = [sys.executable, "-m", "panpriv", "-q", "run", "--source", f"file:{stream}", "--dim", "20",
                           "--feature-bound", "1", "--out", str(out), "--metrics-port", "0", "--progress", "off"]
                cpu[mode].append(_cpu_of(command, env))
            ratios.append(cpu["wiping"][-1] / cpu["default"][-1])
        print(f"service, {records:,} JSON records (d = 20), pan-acsa: CPU {np.median(cpu['wiping']):.2f} s with the "
              f"wiping allocator, {np.median(cpu['default']):.2f} s without; ratio (median of {pairs} pairs) "
              f"{np.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=["clip", "draw", "seal", "service"])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    chosen = args.only or ["clip", "draw", "seal", "service"]
    for name in chosen:
        if name == "service":
            service(args.records, args.pairs)
        else:
            {"clip": clip, "draw": draw, "seal": seal}[name]()


if __name__ == "__main__":
    main()
