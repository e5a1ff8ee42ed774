"""The users' side of Encode–Shuffle–Analyze for ``shuffle-gd``: clients that answer every round
(Cheu et al. 2022, Alg. 5, fully interactive; Ishai et al. 2006 split and mix, :mod:`panpriv.protocols.secure_sum`).

In ``shuffle-gd`` every one of the n users answers each of the T rounds, at that round's model θ_t.
A user's message for round t is exactly a ``shuffle-sgd``/``shuffle-acsa`` share message
(:class:`panpriv.streamer.esa.sum_client.SharesEncoder`: her gradient at θ_t clipped to L — of the
β_s-Moreau envelope when the plan smooths — through PVEC's randomizer at the per-round budget
(ε₀, δ₀), split into m additive shares mod 2^k, each sealed on its own). What is new is that she
answers **T times**, so her guarantee is the *composition* of T rounds, and she alone can make sure
the analyzer does not ask her more often than the statement she was given says.

**The statement a user accepts** (:func:`plan_of`). The first model record she answers fixes the
plan: the deployment, the learner and the whole calibration — n, d, the loss and clips, the
per-round PVEC instance (ε₀, δ₀, g, b, p, which :class:`SharesEncoder` recomputes), the secure sum
(m, k), and T with the composed guarantee (ε, δ) it promises. The client recomputes the T-round
composition from (ε₀, δ₀, T, δ/(T + 1) or δ/(T + 2)) (:func:`panpriv.protocols.shuffle_gd.composed`, the learner's own
function) and refuses a plan that promises less than that composition, or more ε than the user
accepts (``max_epsilon``).

**The per-user refusal rule** (:class:`AnsweredRounds`). She answers a round only if (i) the
model's plan is the plan she accepted (an analyzer cannot change T, the per-round budget or n
half-way), (ii) its round t is below T, (iii) she has not answered round t before, and (iv) she has
answered fewer than T rounds. Otherwise :class:`RefusedModel`. The answered round is recorded —
durably, in her state file (written atomically and fsync-ed) — **before** her message is computed:
a crash between the two loses her answer to that round (the round then waits for her, see the
shuffler's rule), never lets her answer it twice. Without (ii)–(iv) an analyzer could publish
round t again (or round T, T + 1, …) and get fresh noisy answers beyond the T rounds the statement
covers: the refusal is what makes the statement's T true.

Simulated users (tests, benchmarks): one :class:`GDClients` holds many users (one record each),
who all answer the same rounds, so one state records their common answered rounds; a real
deployment has one state per user (one device, one file). The state file holds only the plan
(public) and round numbers — no record, no gradient. It is sealed like a role's state
(:class:`panpriv.streamer.state.role_state.RoleState`, imported when a state file is used): a flipped
bit or an edit could otherwise silently drop an answered round — and let her answer it again — so
any damage is refused with one line (exit 2); a state of the format before sealing loads and is
sealed at her next answer. It is locked while a process uses it
(:class:`panpriv.streamer.state.lock.StateFileLock`): two processes on one state file would each
answer the rounds the other has not recorded yet, so the second is refused with one line (exit 1).

Like :mod:`panpriv.streamer.esa.sum_client`, this module imports ``protocols``, ``accounting``, numpy,
PyNaCl and its siblings ``panpriv.streamer.esa.wire``/``keys``/``model``/``client``/``sum_client``/``families`` only —
none of the service (tested), except the sealed state file's module when a state file is used.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from nacl.public import PublicKey
from numpy.typing import NDArray

from panpriv.protocols.randomness import RngLike
from panpriv.protocols.shuffle_gd import composed
from panpriv.streamer.esa.client import PrivacyRefused, RefusedModel
from panpriv.streamer.esa.families import learners_with
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.esa.sum_client import SharesEncoder

if TYPE_CHECKING:
    from panpriv.streamer.state.role_state import RoleState

Array = NDArray[np.float64]

STATE_FORMAT = "panpriv-esa-gd-client/1"
COMPOSITION_SLACK = 1e-9
"""Relative tolerance when comparing the promised (ε, δ) with the client's own composition
(the analyzer's floats went through JSON; both sides compute the same function)."""


def plan_of(model: ModelRecord) -> dict[str, Any]:
    """The statement a user accepts with her first answer: what must not change between rounds
    (the deployment, the learner, the whole calibration; not the round, θ or the key id)."""
    return {"deployment": model.deployment, "learner": model.learner, "calibration": dict(model.calibration)}


def plan_digest(plan: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


class GDEncoder(SharesEncoder):
    """:class:`SharesEncoder` for a ``shuffle-gd`` model record: the same share messages, plus the
    checks of the T-round plan (module docstring). ``max_epsilon``: refuse a plan whose T rounds
    compose to more than this ε."""

    learners: ClassVar[tuple[str, ...]] = learners_with(client="every-round")

    def __init__(self, public_key: PublicKey, shuffler_key: PublicKey, model: ModelRecord,
                 max_local_epsilon: float | None = None, max_epsilon: float | None = None, rng: RngLike = None) -> None:
        super().__init__(public_key, shuffler_key, model, max_local_epsilon, rng)
        cal = model.calibration
        self.rounds = int(cal["rounds"])
        self.users = int(cal["batch_size"])
        if self.rounds < 1:
            raise RefusedModel(f"the plan has T = {self.rounds} rounds")
        total_epsilon, total_delta = float(cal["total_epsilon"]), float(cal["total_delta"])
        # δ is cut into T + 1 shares (Lemma B.6), or T + 2 with a share for an intrusion's message
        # (panpriv.protocols.shuffle_gd, fit_intrusion): the slack is one share either way.
        slack = next((total_delta / shares for shares in (self.rounds + 1, self.rounds + 2)
                      if abs(float(cal["slack"]) - total_delta / shares) <= COMPOSITION_SLACK * total_delta / shares), None)
        if slack is None:
            raise RefusedModel(f"the plan's composition slack {cal['slack']} is not delta/(T + 1) = "
                               f"{total_delta / (self.rounds + 1)} or delta/(T + 2) = {total_delta / (self.rounds + 2)}")
        self.composed = composed(self.vector_sum.epsilon, self.vector_sum.delta, self.rounds, slack)
        if (self.composed.epsilon > total_epsilon * (1 + COMPOSITION_SLACK)
                or self.composed.delta > total_delta * (1 + COMPOSITION_SLACK)):
            raise RefusedModel(f"the plan promises (epsilon, delta) = ({total_epsilon:g}, {total_delta:g}) over T = "
                               f"{self.rounds} rounds, but its per-round budget composes to {self.composed}")
        if max_epsilon is not None and self.composed.epsilon > max_epsilon:
            raise PrivacyRefused(f"the plan's T = {self.rounds} rounds compose to epsilon {self.composed.epsilon:.4g} > the "
                               f"{max_epsilon:g} this client accepts")


class AnsweredRounds:
    """A user's record of the rounds she answered and the plan she accepted (module docstring).

    ``path``: her state file (``None``: in memory, for simulated users in tests). The file is
    sealed, created 0600 and replaced atomically (fsync-ed) on every answer; a damaged one is
    refused (:class:`~panpriv.streamer.errors.CheckpointError`, one line).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.plan: dict[str, Any] | None = None
        self.rounds: list[int] = []
        self._file = None if path is None else _state_file(path)
        self._lock = None if self._file is None else self._file.lock_file()  # one process per state file
        if self._file is not None:
            try:
                state = self._file.load()
            except BaseException:
                self.close()
                raise
            if state is not None:
                self.plan, self.rounds = _answered(state, self._file.path)

    def close(self) -> None:
        """Release the state file's lock (the operating system does it too, at exit)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def digest(self) -> str | None:
        return None if self.plan is None else plan_digest(self.plan)

    def check(self, model: ModelRecord, rounds: int) -> None:
        """Raise :class:`RefusedModel` unless the user may answer ``model`` (a plan of ``rounds`` = T)."""
        plan = plan_of(model)
        if self.plan is not None and plan_digest(plan) != self.digest:
            raise RefusedModel("the model's plan (deployment, calibration, T) is not the one this user accepted with "
                               f"her first answer (round {self.rounds[0] if self.rounds else '?'}); refusing")
        if model.round >= rounds:
            raise PrivacyRefused(f"round {model.round} is beyond the T = {rounds} rounds of the statement")
        if model.round in self.rounds:
            raise RefusedModel(f"round {model.round} was already answered")
        if len(self.rounds) >= rounds:
            raise PrivacyRefused(f"already answered the T = {rounds} rounds of the statement")

    def record(self, model: ModelRecord) -> None:
        """Note ``model``'s round as answered (durably when file-backed) — before answering it."""
        self.plan = plan_of(model)
        self.rounds = sorted({*self.rounds, model.round})
        if self._file is not None:
            self._file.save({"format": STATE_FORMAT, "plan": self.plan, "rounds": self.rounds})


_FIX = ("restore it from a backup: without it this user cannot know which rounds she answered, so she must not "
        "answer this deployment again")


def _state_file(path: Path) -> RoleState:
    """The sealed state file at ``path`` (:class:`~panpriv.streamer.state.role_state.RoleState`);
    a state of the format before sealing (the bare object) is recognised by its keys."""
    from panpriv.streamer.state.role_state import RoleState  # only with a state file: see the module docstring

    return RoleState(path.parent, path.name, "esa-gd-client", fix=_FIX, option="--state",
                     legacy=lambda body: set(body) == {"format", "plan", "rounds"} and body["format"] == STATE_FORMAT)


def _answered(state: dict[str, Any], path: Path) -> tuple[dict[str, Any], list[int]]:
    """(plan, answered rounds) of a loaded state; :class:`CheckpointError` for another content."""
    from panpriv.streamer.errors import CheckpointError

    plan, rounds = state.get("plan"), state.get("rounds")
    if (state.get("format") != STATE_FORMAT or type(plan) is not dict or type(rounds) is not list
            or not all(type(r) is int and r >= 0 for r in rounds)):
        raise CheckpointError(f"{path} is not a shuffle-gd client state ({STATE_FORMAT}); {_FIX}")
    return plan, sorted(set(rounds))


class GDClients:
    """Users (one record each) who answer every round of one ``shuffle-gd`` deployment.

    Parameters
    ----------
    public_key, shuffler_key
        The analyzer's and the shuffler's public keys.
    X, y
        The users' records, one row each (a real client: one row).
    state
        Their :class:`AnsweredRounds` (one for all the simulated users: they answer the same rounds).
    max_local_epsilon, max_epsilon
        As :class:`GDEncoder`.
    rng
        ``None``: OS entropy (the deployment); a seed or generator: tests only.
    """

    def __init__(self, public_key: PublicKey, shuffler_key: PublicKey, X: Array, y: Array,
                 state: AnsweredRounds | None = None, max_local_epsilon: float | None = None,
                 max_epsilon: float | None = None, rng: RngLike = None) -> None:
        self.public_key, self.shuffler_key = public_key, shuffler_key
        self.X, self.y = X, y
        self.state = state or AnsweredRounds()
        self.max_local_epsilon, self.max_epsilon = max_local_epsilon, max_epsilon
        self.rng = rng
        self.encode_seconds: list[float] = []

    def answer(self, model: ModelRecord) -> list[bytes]:
        """The users' share messages for ``model``'s round, or :class:`RefusedModel` (nothing
        recorded, nothing computed) if the rule of the module docstring forbids it."""
        encoder = GDEncoder(self.public_key, self.shuffler_key, model, self.max_local_epsilon, self.max_epsilon, self.rng)
        if len(self.y) > encoder.users:
            raise RefusedModel(f"{len(self.y)} users here, the plan has n = {encoder.users}")
        self.state.check(model, encoder.rounds)
        self.state.record(model)
        started = time.perf_counter()
        messages = encoder.encode(self.X, self.y)
        self.encode_seconds.append(time.perf_counter() - started)
        return messages

    def done(self, model: ModelRecord) -> bool:
        """True once the statement's T rounds are answered or ``model`` is past them."""
        rounds = int(model.calibration["rounds"])
        return len(self.state.rounds) >= rounds or model.round >= rounds


def serve(clients: GDClients, current: Callable[[], ModelRecord | None], wait_for: Callable[[int], ModelRecord],
          send: Callable[[list[bytes]], None], log: Callable[[str], None] = lambda text: None) -> int:
    """Answer each round once until the statement's T rounds are done: read the current model,
    answer it (unless already answered), send, wait for the next round's model. Returns the number
    of rounds answered here. A refusal other than "already answered" propagates."""
    model = current()
    if model is None:
        model = wait_for(0)
    answered = 0
    while not clients.done(model):
        if model.round not in clients.state.rounds:
            messages = clients.answer(model)
            send(messages)
            answered += 1
            log(f"answered round {model.round} for {len(messages)} users")
        model = wait_for(model.round + 1)
    return answered
