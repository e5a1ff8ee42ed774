"""``panpriv analyze --learner shuffle-acsa|shuffle-sgd``: the analyzer of Encode–Shuffle–Analyze
over secure summation (Bittau et al. 2017 §3; Ishai et al. 2006 split and mix,
:mod:`panpriv.protocols.secure_sum`; Cheu et al. 2022 Alg. 4 (``shuffle-acsa``) or Alg. 3
(``shuffle-sgd``) for the analysis), for any
:class:`~panpriv.protocols.shuffle_base.SequentialLearner` whose rounds all have the same size.

Each user of round t sends her PVEC count vector c ∈ {0, …, g + b}^d as m additive shares in
Z_q^d, each sealed on its own to the analyzer and the m together to the shuffler
(:mod:`panpriv.streamer.esa.sum_client`); the shuffler releases the round at exactly B users as B·m
permuted units in a signed batch (:mod:`panpriv.streamer.esa.shuffler`). m and τ are computed for
the ⌈γB⌉ honest users of the plan's ``honest_fraction`` γ
(:func:`panpriv.protocols.secure_sum.round_plan`). For the batch of the
current round the analyzer opens every unit, sums them mod q = 2^k (q > B(g + b), so the sum is
the true per-coordinate total), checks every total lies in [0, B(g + b)], and gives the totals to
:meth:`panpriv.protocols.shuffle_base.EncodedLearner.learn_totals` — the same A_VEC analysis and step
(AC-SA, or projected SGD) the in-process learner takes — then publishes round t + 1's model: its
query point (θ^md, or θ_t) and what a client needs to answer it (:meth:`SumAnalyzer.model`).

**Rejected, counted by reason**: per batch record the refusals of every analyzer
(:data:`panpriv.streamer.esa.analyzer.BATCH_REJECTS`: unsigned, forged, replayed, out of order,
duplicated, or not exactly B·m units) and ``horizon_reached`` (the learner has used its n records);
per unit ``malformed``, ``unknown_key``, ``undecryptable``, ``round_mismatch``,
``duplicate_message``; per round ``invalid_units`` (some unit of the round did not open: without
it the sum is a uniformly random value; counted once per round besides the unit's own reason),
``mixed_keys`` (units sealed to two of the analyzer's keys: the key that opens a unit would split
the round into smaller crowds) and ``out_of_range`` (a total outside [0, B(g + b)]: a malicious
client shifted the sum, or a share was replaced). A shifted sum that stays in range is not
detectable: a malicious client can bias a round's gradient (utility), never learn anything of the
others. A round rejected as a whole is **skipped**: not learned, and
the next round's model (same θ) is published so the deployment goes on; the learner then ends its
horizon that many rounds later. An ``out_of_range`` round is charged to the budget first (whether
a shifted sum leaves the range depends on the honest users' totals, so the skip is an output of
their data); an ``invalid_units`` or ``mixed_keys`` round is not (whether a unit opens, or under
which key, is the sender's doing alone).

**One batch size.** The shuffler thresholds at one B, so the learner's plan must give every round
the same number of users (``shuffle-sgd``: always; ``shuffle-acsa``: a ``batch_size`` that divides
``horizon``, one run).

Exactly once and the budget: as :mod:`panpriv.streamer.esa.analyzer` (a deterministic step, an atomic
checkpoint before publication, the round charged through ``gate`` before it is learned).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from nacl.public import PrivateKey

from panpriv.accounting.ledger import PrivacyReport
from panpriv.protocols.secure_sum import SECURITY_BITS, recombine, round_plan
from panpriv.protocols.shuffle_base import SequentialLearner
from panpriv.protocols.shuffle_gd import ShuffleGD
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.analyzer import BATCH_REJECTS, UNIT_REJECTS, AnalyzerCore, check_format, decode_state
from panpriv.streamer.esa.deployment import sum_report
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.runtime.learners import restore_learner

CHECKPOINT_FORMAT = "panpriv-esa-sum-analyzer/2"

REJECT_REASONS = (*BATCH_REJECTS, "horizon_reached", *UNIT_REJECTS, "mixed_keys", "invalid_units", "out_of_range")
"""Every reason :meth:`SumAnalyzer.handle` counts (module docstring)."""


class SumAnalyzer(AnalyzerCore):
    """The secure-sum analyzer's state machine (no I/O); the interface of
    :class:`panpriv.streamer.esa.analyzer.Analyzer`, which :mod:`panpriv.streamer.esa.analyze_service` drives.

    Parameters
    ----------
    learner
        A sequentially interactive PVEC learner (``shuffle-sgd``, ``shuffle-acsa``) whose plan
        gives every round the same number of users.
    keys, name, instance
        As :class:`panpriv.streamer.esa.analyzer.Analyzer`.
    """

    def __init__(self, learner: SequentialLearner | ShuffleGD, keys: list[PrivateKey], name: str,
                 instance: str | None = None) -> None:
        sizes = sorted(learner.vector_sums)
        if len(sizes) != 1:
            raise ValueError(f"the ESA shuffler releases rounds of one size; this {learner.name} plan has rounds of "
                             f"{sizes} users (give a batch_size that divides the horizon, and no strong convexity)")
        super().__init__(learner, keys, name, instance)
        self.learner: SequentialLearner | ShuffleGD = learner  # ShuffleGD: panpriv.streamer.esa.gd_analyzer
        self._vector_sum = vector_sum = learner.vector_sums[sizes[0]]
        self.users, self.dim = vector_sum.n, vector_sum.d
        self.max_count = vector_sum.g + vector_sum.b
        self.plan = round_plan(self.users, vector_sum.parameters.noisy_users, self.dim, self.max_count)
        self.bits, self.shares, self.tau = self.plan.bits, self.plan.shares, self.plan.tau
        self._unit_size = wire.share_unit_size(self.dim)
        self.round = 0
        self.skipped = 0

    REJECT_REASONS = REJECT_REASONS
    CHECKPOINT_FORMAT = CHECKPOINT_FORMAT

    def shuffler_arguments(self) -> str:
        return f"--batch-size {self.users} --params {self.dim} --shares {self.shares}"

    def release_bytes(self) -> int:
        return wire.batch_bytes(self.users * self.shares, self._unit_size)

    def handle(self, value: bytes | None) -> bool:
        """Analyse one record of the shuffled topic; True if it closed the current round (learned or
        skipped: either way round t + 1's model is to be published)."""
        batch = self._admit(value)
        if batch is None:
            return False
        if self.finished:
            self.rejected["horizon_reached"] += 1
            return False
        if len(batch.units) != self.users * self.shares:
            self.rejected["wrong_batch_size"] += 1
            return False
        learned = self._learn(batch)
        if learned is None:
            return False
        self.skipped += 0 if learned else 1
        self.last_valid = self.users if learned else 0
        self.round += 1
        self._mark_applied(batch)
        return True

    @property
    def finished(self) -> bool:
        """No round left to analyse (the learner's horizon; ``shuffle-gd``: its T rounds)."""
        return self.learner.finished

    def _learn(self, batch: wire.Batch) -> bool | None:
        """Open, sum, charge, check and learn the round: True if learned, False if skipped
        (counted), ``None`` if the budget refused it (``stopped``)."""
        return self._sum_and_learn(batch, charge=self._charge_round)

    def _charge_round(self) -> bool:
        """Charge the round through ``gate`` with this deployment's statement; False if refused."""
        if self.gate is not None:
            self.stopped = self.gate(self.round, self.report())
        return self.stopped is None

    def _sum_and_learn(self, batch: wire.Batch, charge: Callable[[], bool] | None) -> bool | None:
        """Open and sum the round's shares, ``charge`` it (``None``: charged already), check the
        totals' range and learn them. Shares and totals are zeroed after use. The charge comes
        before the range check: whether an (adversarially shifted) sum stays in range depends on
        the honest users' totals too, so a skip is an output of their data."""
        units = self._open(batch)
        if units is None:
            self.rejected["invalid_units"] += 1
            return False
        try:
            totals = recombine(units, self.bits)
        finally:
            units.fill(0)
        try:
            if charge is not None and not charge():
                return None
            if totals.max() > self.users * self.max_count:
                self.rejected["out_of_range"] += 1
                return False
            self.learner.learn_totals(totals)
            return True
        finally:
            totals.fill(0)

    def _open(self, batch: wire.Batch) -> np.ndarray | None:
        """The batch's shares as rows (B·m, d); ``None`` if any unit fails (counted by reason)."""
        rows = np.zeros((len(batch.units), self.dim), dtype=np.uint32)
        seen: set[bytes] = set()
        keys: set[bytes] = set()
        valid = True
        for k, item in enumerate(batch.units):
            reason = self._open_one(item, batch.round, seen, keys, rows[k])
            if reason is not None:
                self.rejected[reason] += 1
                valid = False
        if len(keys) > 1:  # the key that opens a unit would split the round's units into smaller crowds
            self.rejected["mixed_keys"] += 1
            valid = False
        if not valid:
            rows.fill(0)
            return None
        return rows

    def _open_one(self, item: bytes, round_: int, seen: set[bytes], keys: set[bytes], out: np.ndarray) -> str | None:
        opened = self._unseal(item, self._unit_size, seen)
        if isinstance(opened, str):
            return opened
        plaintext, unit_key = opened
        keys.add(unit_key)
        try:
            inner_round, share = wire.parse_share_plaintext(plaintext, self.dim)
        except wire.WireError:
            return "malformed"
        if inner_round != round_:
            return "round_mismatch"
        if int(share.max()) >= 1 << self.bits:
            return "malformed"
        out[...] = share
        share.fill(0)
        return None

    def calibration(self) -> dict[str, Any]:
        """What a client needs to answer the current round: the loss, the clips, the plan's
        smoothing, the PVEC instance (its (ε, δ) and (g, b, p), which the client recomputes) and
        the secure sum (m shares in Z_{2^k}^d, σ). Once the horizon is reached: the last round's."""
        learner, vector_sum = self.learner, self._vector_sum
        return {
            "dim": learner.dim,
            "params": self.dim,
            "loss": learner.loss.config(),
            "feature_bound": learner.feature_bound,
            "clip": learner.gradient_norm_bound,
            "smoothing": learner.round_smoothing(),
            "batch_size": self.users,
            "epsilon": learner.epsilon,
            "delta": learner.delta,
            "l2_bound": vector_sum.l2_bound,
            "calibration": learner.calibration,
            "honest_fraction": learner.honest_fraction,
            "g": vector_sum.g,
            "b": vector_sum.b,
            "p": vector_sum.p,
            "honest_users": self.plan.honest,
            "shares": self.shares,
            "modulus_bits": self.bits,
            "security_bits": SECURITY_BITS,
        }

    def model(self) -> ModelRecord:
        """The public model record of the current round; its θ is the query point (θ^md,
        θ_t; the released model once the horizon is reached: there is no round left to answer)."""
        theta = self.learner.query_point() if not self.finished else self.learner.release()
        local = self.report().intrusion
        return ModelRecord(self.learner.name, self.name, self.round, theta, self.calibration(), self.current_key.hex(),
                           (local.epsilon, local.delta))

    def report(self) -> PrivacyReport:
        """The statement of this deployment (:func:`panpriv.streamer.esa.deployment.sum_report`)."""
        assert isinstance(self.learner, SequentialLearner)
        return sum_report(self.learner, self.plan)

    def checkpoint(self, privacy: PrivacyReport | None = None) -> dict[str, Any]:
        """:meth:`AnalyzerCore._checkpoint_fields` (no share, no key), the learner and the skipped rounds."""
        return {"format": CHECKPOINT_FORMAT, **self._checkpoint_fields(privacy), "learner": self.learner.name,
                "skipped": self.skipped}

    @classmethod
    def restore(cls, data: Mapping[str, Any], keys: list[PrivateKey]) -> SumAnalyzer:
        check_format(data, CHECKPOINT_FORMAT, "a secure-sum analyzer checkpoint")
        learner = restore_learner(data["learner"], data["config"], decode_state(data["state"]), None)
        if not isinstance(learner, SequentialLearner):
            raise ValueError(f"{learner.name}: not a learner of the secure-sum analyzer")
        analyzer = cls(learner, keys, data["name"], data.get("instance"))
        analyzer._restore_fields(data)
        analyzer.round = int(data["round"])
        analyzer.skipped = int(data["skipped"])
        return analyzer
