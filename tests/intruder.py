"""The intruder of the threat model against the running service: what reads of ``panpriv run``'s
memory give an attacker who knows the stream (canaries) or knows nothing of it (blind).

Used by tests/streamer/test_service_intruder.py and tests/streamer/test_persisted_states.py (and
``benchmarks/memory_hygiene.py`` for its canary stream). The service
is the real ``python -m panpriv run`` (:class:`tests.panpriv_service.PanprivService`), paused with
SIGSTOP while :func:`dump` reads every writable mapping through ``/proc/<pid>/mem``
(:mod:`tests.memscan`).

Canary streams (:func:`canary_stream`). Every value of every record is identifiable: in the text
formats (JSON, CSV) feature j of record i is written ``±0.AA<i:07d><j:02d>7`` (AA random in
05–19: |x_j| < 0.2, ‖x‖ < 0.9, never clipped), so even a fragment of a record's text names it,
and its float64 value is unique; in binary batches the features are float32 with unique bit
patterns. :meth:`CanaryStream.found` lists every record whose text, float64 or float32 value is
anywhere in a dump.

Where the noise is: the oracle. The service is started with tests/known_entropy on its
``PYTHONPATH`` (:func:`known_entropy_env`): its OS entropy comes from a seeded stream, and
:class:`DrawReplay` replays the draws of a twin learner from the same stream, so the test knows
every Z_t the service drew — the device of tests/protocols/test_memory_residue.py, applied to the
real service, whose code paths are otherwise the pan-private ones. With it the test finds the
live accumulator W = Z_t + Σ_{i ∈ [s_t, b)} g_i/b_t of the open batch t exactly (:func:`open_batch`).

Pairs (:func:`pairs`). Any other copy of a state of batch t is V = W − (clean sum of records
[a, b)) for some a ∈ [s_t, b) — a = s_t is the noise draw Z_t itself. The attacker who knows the
records looks for every such V as 8-byte words and as base64 text (how checkpoints serialise
arrays); finding one gives the exact clean sum of the records since a. Blind, an attacker finds
the same V among the base64 texts that decode to p numbers (:func:`base64_vectors`) — what the
issue's held-out measurement did.

The game (:func:`guess_label`, :func:`audit_epsilon`). One target record per batch has a label
drawn by a coin; one dump inside each target's batch, after the target was learned, is the
intruder's read, and it guesses the label — from a pair that straddles the target under one
label only, else from W alone by the likelihood ratio the intrusion guarantee allows (under the
right label W minus the clean partial sum is one draw). Every dump falls in another batch and
batches are disjoint, so for each target the whole view is one intrusion (into its batch) plus
outputs: the intrusion guarantee is what the guesses audit. By Steinke, Nasr & Jagielski 2023
("Privacy auditing with one (1) training run", Thm 1), an ε-DP mechanism makes at most
Binomial(r, e^ε/(1 + e^ε)) of r guesses correct; :func:`audit_epsilon` is the ε that count rules out.
"""

from __future__ import annotations

import binascii
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from panpriv.protocols import secure_noise
from panpriv.protocols.losses import clip_rows
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.streamer.io.codec import encode_batch
from tests.memscan import Memory, read_memory

DIM = 20
RECORDS_PER_BINARY_MESSAGE = 8
RATE = 2000.0
"""Records per second the attacked service is paced at: a dump can then be taken inside a batch
even on a loaded machine."""
_TEXT = re.compile(rb"0\.(\d\d)(\d{7})(\d\d)7")


@dataclass
class CanaryStream:
    """n records whose every value is identifiable (module docstring), in one format."""

    X: NDArray[np.float64]
    y: NDArray[np.float64]
    fmt: str
    digits: NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))

    @property
    def n(self) -> int:
        return int(self.y.size)

    def messages(self) -> list[bytes]:
        """The stream's messages: one per record, or binary batches of :data:`RECORDS_PER_BINARY_MESSAGE`."""
        if self.fmt == "binary":
            m = RECORDS_PER_BINARY_MESSAGE
            return [encode_batch(self.X[i : i + m].astype(np.float32), self.y[i : i + m]) for i in range(0, self.n, m)]
        lines = []
        for i in range(self.n):
            texts = [repr(v) for v in self.X[i].tolist()]
            label = repr(float(self.y[i]))
            text = '{"x": [' + ", ".join(texts) + '], "y": ' + label + "}" if self.fmt == "json" else ",".join([*texts, label])
            lines.append(text.encode())
        return lines

    def write_lines(self, path: Path) -> Path:
        path.write_bytes(b"\n".join(self.messages()) + b"\n")
        return path

    def found(self, raw: bytes) -> dict[str, NDArray[np.int64]]:
        """The records of which anything is in ``raw`` (a memory dump), by how it was found."""
        result: dict[str, NDArray[np.int64]] = {}
        if self.fmt != "binary":
            ids = set()
            for match in _TEXT.finditer(raw):
                a, i, j = int(match[1]), int(match[2]), int(match[3])
                if i < self.n and j < DIM and self.digits[i, j] == a:
                    ids.add(i)
            result["text"] = np.array(sorted(ids), dtype=np.int64)
        words = np.frombuffer(raw, dtype=np.uint64, count=len(raw) // 8)
        result["float64"] = _located(words, self.X.view(np.uint64))
        if self.fmt == "binary":
            halves = np.frombuffer(raw, dtype=np.uint32, count=len(raw) // 4)
            result["float32"] = _located(halves, self.X.astype(np.float32).view(np.uint32), pairs=True)
        return result


def _located(words: NDArray[Any], values: NDArray[Any], pairs: bool = False) -> NDArray[np.int64]:
    """The records (rows of ``values``) one of whose values is among ``words`` — or, with
    ``pairs``, two consecutive values of which are consecutive words (for 4-byte values, of which
    a dump holds many by chance: one in about 2·10⁻⁴ words matches one of 800,000 patterns)."""
    flat = values.ravel()
    order = np.argsort(flat)
    ordered = flat[order]
    where = np.flatnonzero((words >= ordered[0]) & (words <= ordered[-1]))
    position = np.minimum(np.searchsorted(ordered, words[where]), ordered.size - 1)
    match = ordered[position] == words[where]
    where, index = where[match], order[position[match]]
    if pairs:
        row_end = index % values.shape[1] == values.shape[1] - 1
        inside = (where + 1 < words.size) & ~row_end
        where, index = where[inside], index[inside]
        index = index[words[where + 1] == flat[index + 1]]
    return np.unique(index // values.shape[1])


def canary_stream(n: int, fmt: str, seed: int = 0) -> CanaryStream:
    """n canary records of :data:`DIM` features with labels ±1 (module docstring)."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    signs = np.where(rng.random((n, DIM)) < 0.5, -1.0, 1.0)
    if fmt == "binary":  # unique float32 patterns in [2^-5, 2^-4)
        bits = (np.uint32(0x3D000000) + np.arange(n * DIM, dtype=np.uint32)).reshape(n, DIM)
        return CanaryStream(bits.view(np.float32).astype(np.float64) * signs, y, fmt)
    digits = rng.integers(5, 20, size=(n, DIM))
    # 0.AA<i:07d><j:02d>7 as the integer AA<i><j>7 over 10^12: an exact integer below 2^53 divided
    # by an exact power of ten, correctly rounded — the very double float() reads from the text.
    numerators = digits * 10**10 + np.arange(n)[:, None] * 1000 + np.arange(DIM)[None, :] * 10 + 7
    return CanaryStream(numerators / 1e12 * signs, y, fmt, digits)


# -- reading the service ----------------------------------------------------------------------------


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


KNOWN_ENTROPY = Path(__file__).parent / "known_entropy"


def known_entropy_env(seed: int) -> dict[str, str]:
    """The environment of a service whose OS entropy is the seeded stream (module docstring)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PANPRIV_TEST_ENTROPY_SEED": str(seed),
            "PYTHONPATH": (path + os.pathsep if path else "") + str(KNOWN_ENTROPY)}


class DrawReplay:
    """The draws of a pan-acsa service started with :func:`known_entropy_env` (``seed``): a twin
    learner of its configuration draws, from the same stream, the same noise in the same order —
    Z_0, W_0 (the two draws of batch 0), Z_1, W_1, … — whatever the records."""

    def __init__(self, config: dict[str, Any], seed: int) -> None:
        import panpriv.protocols.randomness as randomness

        self._generator = np.random.Generator(np.random.PCG64(seed))
        self._twin = PanPrivateACSA.from_config(config)
        self._draws: list[NDArray[Any]] = []
        self._randomness = randomness

    def first_draw(self, batch: int) -> NDArray[Any]:
        """Z of 0-based batch ``batch`` of the first epoch (draw 2·batch)."""
        plan = self._twin.current_plan()
        while len(self._draws) <= 2 * batch:
            size = plan.batch_size(len(self._draws) // 2 + 1)
            original = self._randomness._read_entropy
            self._randomness._read_entropy = self._fill
            try:
                self._twin._grad.fill(0)
                self._twin._add_noise(size)
            finally:
                self._randomness._read_entropy = original
            self._draws.append(self._twin._grad.copy())
        return self._draws[2 * batch]

    def _fill(self, view: memoryview) -> None:
        np.frombuffer(view, dtype=np.uint8)[:] = self._generator.integers(0, 256, size=len(view), dtype=np.uint8)


# -- the open batch of pan-acsa -------------------------------------------------------------------


@dataclass(frozen=True)
class OpenBatch:
    """Batch t (0-based) of the service at a dump: its first position and size, its clipped
    gradient rows at θ^md (grid units with secure noise), its first draw Z_t, and the live
    accumulator W found in the dump with its position b (``None``: not found)."""

    index: int
    start: int
    size: int
    gradients: NDArray[Any]
    draw: NDArray[Any]
    live: NDArray[Any] | None
    position: int | None

    def partial(self, a: int, b: int, gradients: NDArray[Any] | None = None) -> NDArray[Any]:
        """The clean contribution of records [a, b) to the accumulator."""
        rows = (self.gradients if gradients is None else gradients)[a - self.start : b - self.start].sum(axis=0)
        return rows if rows.dtype == np.int64 else rows / self.size


def gradient_rows(learner: PanPrivateACSA, theta_md: NDArray[np.float64], X: NDArray[np.float64],
                  y: NDArray[np.float64]) -> NDArray[Any]:
    """Each record's clipped gradient at ``theta_md``, as the learner adds it (grid units with secure noise)."""
    loss = learner.loss
    G = clip_rows(loss.gradient(theta_md, loss.features(X, learner.feature_bound), loss.labels(y)),
                  learner.gradient_norm_bound)
    return secure_noise.to_grid(G, learner.gradient_norm_bound) if learner.noise == "secure" else G


def open_batch(memory: Memory, boundary: PanPrivateACSA, replay: DrawReplay, X: NDArray[np.float64],
               y: NDArray[np.float64], window: range) -> OpenBatch:
    """The batch open at the dump, from the learner restored at its last saved boundary (its θ^md
    and first position), with W located at one of the positions ``window`` (the oracle)."""
    index = boundary._iterate.batch - 1
    start = boundary.state_records
    size = boundary.current_plan().batch_size(boundary._iterate.batch)
    gradients = gradient_rows(boundary, boundary._iterate.theta_md, X[start : start + size], y[start : start + size])
    draw = replay.first_draw(index)
    batch = OpenBatch(index, start, size, gradients, draw, None, None)
    positions = [b for b in window if start < b <= start + size]
    if not positions:
        return batch
    targets = np.array([draw + batch.partial(start, b) for b in positions])
    if draw.dtype == np.int64:
        hits = memory.find_int_vectors(targets)
    else:
        hits = memory.find_vectors(targets, 1e-9 * float(np.max(np.abs(targets))))
    if not hits:
        return batch
    k, word = hits[0]
    live = (memory.ints if draw.dtype == np.int64 else memory.floats)[word : word + draw.size].copy()
    return OpenBatch(index, start, size, gradients, draw, live, positions[k])


@dataclass
class Pairs:
    """Every other state of the open batch found in a dump, as ``(a, "words" | "base64")``: a
    vector W − (clean sum of [a, b)); ``a == start`` is the noise draw Z_t."""

    found: list[tuple[int, str]] = field(default_factory=list)

    def straddling(self, record: int, live: int) -> bool:
        return any(a <= record < live for a, _ in self.found)


def pairs(memory: Memory, encoded: NDArray[Any], batch: OpenBatch, gradients: NDArray[Any] | None = None) -> Pairs:
    """The pair search of the module docstring (``encoded``: the dump's :func:`base64_vectors`;
    ``gradients``: the batch's rows under another hypothesis, for the game)."""
    result = Pairs()
    if batch.live is None or batch.position is None:
        return result
    W, b = batch.live, batch.position
    starts = list(range(batch.start, b))
    targets = np.array([W - batch.partial(a, b, gradients) for a in starts])
    tolerance = 0.0 if W.dtype == np.int64 else 1e-9 * float(np.max(np.abs(W)))
    hits = memory.find_int_vectors(targets) if W.dtype == np.int64 else memory.find_vectors(targets, tolerance)
    result.found += sorted({(starts[k], "words") for k, _ in hits})
    result.found += sorted({(starts[k], "base64") for k in _rows_among(targets, encoded, tolerance)})
    return result


def _rows_among(targets: NDArray[Any], vectors: NDArray[Any], tolerance: float) -> set[int]:
    """The rows of ``targets`` equal (within ``tolerance``) to a row of ``vectors``: a sorted
    lookup of the first coordinate, then the whole rows."""
    if not len(vectors):
        return set()
    order = np.argsort(targets[:, 0])
    firsts = targets[order, 0]
    lo = np.searchsorted(firsts, vectors[:, 0] - tolerance, side="left")
    hi = np.searchsorted(firsts, vectors[:, 0] + tolerance, side="right")
    rows = set()
    for v, a, b in zip(np.flatnonzero(hi > lo).tolist(), lo[hi > lo].tolist(), hi[hi > lo].tolist(), strict=True):
        for k in order[a:b].tolist():
            if np.all(np.abs(targets[k] - vectors[v]) <= tolerance):
                rows.add(k)
    return rows


_BASE64_CHARACTERS = np.zeros(256, dtype=bool)
_BASE64_CHARACTERS[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", dtype=np.uint8)] = True


def base64_vectors(raw: bytes, p: int, dtype: str) -> NDArray[Any]:
    """Every base64 text in ``raw`` that is exactly the encoding of p float64 or int64 values — a
    run of that many base64 characters between two others — decoded: what a serialised state
    looks like to an intruder who knows only p (blind)."""
    want = 4 * -(-8 * p // 3)
    data = np.frombuffer(raw, dtype=np.uint8)
    stride = want // 2  # a run of ``want`` characters covers two consecutive samples
    sampled = _BASE64_CHARACTERS[data[::stride]]
    found = []
    seen = -1
    for k in np.flatnonzero(sampled[:-1] & sampled[1:]).tolist():
        a = k * stride
        if a < seen:
            continue
        while a > 0 and _BASE64_CHARACTERS[data[a - 1]]:
            a -= 1
        b = k * stride
        while b < data.size and _BASE64_CHARACTERS[data[b]]:
            b += 1
        seen = b
        if b - a != want:
            continue
        try:
            decoded = binascii.a2b_base64(raw[a:b], strict_mode=True)
        except binascii.Error:
            continue
        if len(decoded) == 8 * p:
            found.append(np.frombuffer(decoded, dtype=dtype))
    return np.array(found) if found else np.zeros((0, p), dtype=dtype)


def draw_coordinates_found(memory: Memory, draw: NDArray[Any]) -> int:
    """How many coordinates of ``draw`` (for integers: of ±draw) are 8-byte words of ``memory``."""
    if draw.dtype == np.int64:
        ordered = memory.sorted_ints()
        wanted = np.stack([draw, -draw])
        where = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
        return int(np.count_nonzero((ordered[where] == wanted).any(axis=0)))
    return sum(1 for value in draw.tolist() if memory.find_vectors(np.array([[value]]), 0.0))


def guess_label(memory: Memory, encoded: NDArray[Any], batch: OpenBatch, target: int,
                rows: dict[float, NDArray[Any]]) -> tuple[float, bool] | None:
    """The intruder's guess of the label of record ``target`` of the open batch (module docstring),
    given the batch's gradient rows under each label; and whether a pair decided it. ``None``: W
    was not found."""
    if batch.live is None or batch.position is None:
        return None
    decided = [label for label, gradients in rows.items()
               if pairs(memory, encoded, batch, gradients).straddling(target, batch.position)]
    if len(decided) == 1:
        return decided[0], True
    distance = {label: float(np.sum(((batch.live - batch.partial(batch.start, batch.position, g)).astype(np.float64)) ** 2))
                for label, g in rows.items()}
    return min(distance, key=lambda label: distance[label]), False


def audit_epsilon(correct: int, guesses: int, confidence: float = 0.95) -> float:
    """The ε lower bound of Steinke, Nasr & Jagielski 2023, Thm 1 from ``correct`` of ``guesses``
    (module docstring): the largest ε at which an ε-DP mechanism would give that many correct
    guesses or more with probability at most 1 − ``confidence`` (0 if even ε = 0 does not)."""

    def tail(epsilon: float) -> float:
        return float(stats.binom.sf(correct - 1, guesses, 1.0 / (1.0 + math.exp(-epsilon))))

    if guesses == 0 or tail(0.0) > 1.0 - confidence:
        return 0.0
    low, high = 0.0, 50.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if tail(middle) <= 1.0 - confidence else (low, middle)
    return low


# -- one run of the service under attack ------------------------------------------------------------


@dataclass
class Exposure:
    """What one dump held of the input: the records found (by kind) and their ages in records
    behind the position the service had reached (``position``: records learned just before the
    dump, read from its metrics; the service may have learned up to one more micro-batch since)."""

    position: int
    found: dict[str, NDArray[np.int64]]

    def oldest_age(self) -> int:
        """How far behind ``position`` the oldest record found is (negative: none behind)."""
        ids = np.concatenate([v for v in self.found.values()] or [np.zeros(0, dtype=np.int64)])
        behind = ids[ids < self.position]
        return int(self.position - behind.min()) if behind.size else -1


class Service:
    """``panpriv run`` on a canary stream, paced so that a dump can be taken where wanted."""

    def __init__(self, workdir: Path, stream: CanaryStream, source_url: str, learner: dict[str, Any],
                 source: dict[str, Any] | None = None, kafka: dict[str, Any] | None = None,
                 entropy_seed: int | None = None, checkpoint_every: int = 100) -> None:
        from tests.panpriv_service import PanprivService

        config: dict[str, Any] = {
            "source": {"url": source_url, "rate": RATE, "batch_records": 256, **(source or {})},
            "records": {"format": stream.fmt, "dim": DIM, "feature_bound": 1.0, "label_values": [-1.0, 1.0]},
            "learner": {"epsilon": 1.0, "delta": 1e-6, **learner},
            "checkpoint": {"every_records": checkpoint_every, "every_seconds": 60.0},
            "snapshots": {"every_records": 10**9},
        }
        if kafka:
            config["kafka"] = kafka
        self.stream = stream
        self.position_before_pause = 0
        self.process = PanprivService(workdir, config, env=None if entropy_seed is None else known_entropy_env(entropy_seed))

    @property
    def step(self) -> int:
        """Records per paced micro-batch: the rate's 50 ms step (panpriv.streamer.runtime.pacing)."""
        return int(RATE * 0.05)

    def position(self) -> int:
        text = self.process.scrape()
        match = re.search(r"^panpriv_records_total ([0-9.e+]+)$", text, re.M)
        return int(float(match[1])) if match else 0

    def wait_for(self, position: int, timeout_s: float = 120.0) -> int:
        """Wait until ``position`` records are learned; return the position read."""
        deadline = time.monotonic() + timeout_s
        while (now := self.position()) < position:
            self.process._process.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the service did not reach record {position} (at {now})")
            time.sleep(0.005)
        return now

    def paused(self) -> _Paused:
        """A ``with`` block in which the service is stopped; its value is the memory read then.
        :attr:`position_before_pause` is the position read from the metrics just before."""
        self.position_before_pause = self.position()
        return _Paused(self.process.pid)

    def manifest(self) -> Any:
        from panpriv.streamer.state.checkpoint import read_manifest

        return read_manifest(self.process.out / "checkpoints" / "checkpoint.json")

    def stop(self) -> None:
        self.process.stop()


class _Paused:
    """SIGSTOP on entry (once the process is stopped), SIGCONT on exit: the memory read and its
    analysis happen while the service does nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> bytes:
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while _state(self.pid) not in ("T", "t"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {self.pid} did not stop")
            time.sleep(0.002)
        return read_memory(self.pid)

    def __exit__(self, *exc_info: object) -> None:
        os.kill(self.pid, signal.SIGCONT)
