"""The privacy statement of an analyzer deployed as Encode–Shuffle–Analyze: ``shuffle-gaussian``
(:func:`esa_report`), ``shuffle-sgd``/``shuffle-acsa`` over secure summation (:func:`sum_report`)
and ``checkin`` (:func:`checkin_report`).

The learner's own report (:meth:`panpriv.protocols.shuffle_gaussian.ShuffleGaussianSGD.privacy`) assumes
randomizer, shuffler and analyzer in one process. Deployed in three roles (Bittau et al. 2017 §3)
the same numbers hold under different trust, which this module states:

- **output** (against the analyzer and everyone who sees its models): the shuffle-model guarantee
  of one round (Liew & Takahashi 2022 Thm 1) — if the shuffler is honest and separate. When a
  round had fewer valid messages than b (rejected ones), each message hid among fewer others: the
  output guarantee is then that of the smallest round, Thm 1 at n = its valid count (never above
  the local ε₀). Messages that decrypt and are well formed but come from dishonest clients cannot
  be told apart: the bound assumes every valid message is an honest user's.
- **intrusion** into the analyzer (one read of its memory and files, plus all outputs): the local
  guarantee (ε₀, δ) — its private key opens every message on the messages topic, where their
  order and metadata are not yet shuffled.
- **client**: her message is (ε₀, δ)-locally private against anyone, whatever the others do.
- **shuffler**: holds no key; it sees ciphertexts, rounds, sizes and the broker's metadata. If it
  colludes with the analyzer, only the local guarantee (ε₀, δ) remains.
"""

from __future__ import annotations

import dataclasses

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.secure_sum import added_delta
from panpriv.protocols.shuffle_base import SequentialLearner, max_guarantee
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD

DEPLOYMENT = "trusted shuffler, separate process"
"""How the ledger and statements name this deployment."""

REFERENCE = "Bittau et al. 2017, §3 (Encode-Shuffle-Analyze)"


def esa_report(learner: ShuffleGaussianSGD, min_valid: int | None) -> PrivacyReport:
    """The learner's report restated for the ESA deployment (module docstring).

    ``min_valid``: the fewest valid messages any applied round had (``None``: no round yet).
    """
    report = learner.privacy()
    local = learner.local_guarantee()
    b = learner.batch_size or 0
    output = report.output
    if min_valid is not None and min_valid < b:
        output = Guarantee(learner.round_epsilon(min_valid), learner.delta)
    roles = [
        f"deployment: {DEPLOYMENT} (Encode-Shuffle-Analyze): clients encode and seal their message to the analyzer's "
        "key, a separate shuffler drops metadata, releases a round only at exactly b = "
        f"{b} messages and permutes it with OS entropy, the analyzer sees only shuffled batches",
        f"client: her one message per round is {local}-locally private against anyone, including a shuffler and "
        "analyzer that collude",
        f"shuffler: holds no key that opens a message; if it colludes with the analyzer only the local guarantee {local} holds",
        f"analyzer intrusion: its private key opens the unshuffled messages topic, so one read of its memory or files "
        f"plus all outputs is bounded by the local guarantee {local}",
        "client dropout or rejected messages: the output guarantee is that of the round with the fewest valid "
        f"messages ({'none yet' if min_valid is None else min_valid} of {b}); every valid message is assumed to come "
        "from an honest client (a fraction gamma of dishonest but well-formed messages weakens it to n = gamma-honest count)",
    ]
    assumptions = [a for a in report.assumptions if not a.startswith("a trusted shuffler")]
    return dataclasses.replace(
        report,
        output=output,
        assumptions=tuple([*roles, *assumptions]),
        references=tuple([*report.references, REFERENCE]),
    )


SECURE_SUM_REFERENCE = "Ishai et al. 2006 (split and mix; message count: panpriv.protocols.secure_sum)"


def sum_report(learner: SequentialLearner, users: int, shares: int, bits: int, tau: float) -> PrivacyReport:
    """The ``shuffle-sgd`` or ``shuffle-acsa`` learner's report restated for an ESA deployment over split-and-mix
    shares (:mod:`panpriv.protocols.secure_sum`, :mod:`panpriv.streamer.esa.sum_analyzer`).

    - **output**: PVEC's (ε, δ) per round (Cheu et al. 2022, Thm 3.2, a statement about the
      per-coordinate totals of the users' counts) becomes (ε, δ + (1 + e^ε)·τ): the analyzer sees
      the round's shuffled shares, within statistical distance τ of a function of the totals
      (:func:`panpriv.protocols.secure_sum.distance_bound`), and the hybrid argument of
      :mod:`panpriv.protocols.secure_sum` adds (1 + e^ε)·τ to δ;
    - **intrusion** into the analyzer, **collusion** of shuffler and analyzer: both link a user's m
      shares (one message on the messages topic, or the shuffler's record of which units came
      together) and so see her PVEC count vector: the local guarantee of PVEC's randomizer.
    """
    report = learner.privacy()
    local = report.intrusion
    eps = report.output.epsilon
    added = added_delta(eps, tau)
    output = Guarantee(eps, report.output.delta + added)
    roles = [
        f"deployment: {DEPLOYMENT} (Encode-Shuffle-Analyze) over secure summation: each client splits her PVEC count "
        f"vector into m = {shares} additive shares in Z_q^d, q = 2^{bits} > B(g + b), seals each share separately to the "
        f"analyzer's key and sends the m together; a separate shuffler drops metadata, releases a round only at exactly "
        f"B = {users} complete users and permutes all B*m shares with OS entropy; the analyzer sums them mod q",
        f"secure summation (Ishai et al. 2006): the analyzer's view of a round is within statistical distance "
        f"tau = {tau:.3g} of a function of the per-coordinate totals alone (the bound proved in panpriv.protocols.secure_sum, "
        f"not a paper's constant); the output delta includes (1 + e^eps) tau = {added:.3g}",
        f"client: her count vector is {local}-locally private (PVEC's randomizer) against anyone, including a shuffler "
        "and analyzer that collude (they can link her m shares)",
        f"shuffler: holds no key that opens a share; if it colludes with the analyzer only the local guarantee {local} holds",
        f"analyzer intrusion: its private key opens the messages topic, where a user's m shares are one message, so one "
        f"read of its memory or files plus all outputs is bounded by the local guarantee {local}",
        "malicious clients: a client can shift a round's sum by any amount mod q (utility only: it learns nothing of the "
        "others); a round whose sum leaves [0, B(g + b)] is skipped but charged (whether a shifted sum leaves the range "
        "depends on the honest users' totals), one with any share that does not open is skipped and not charged; every "
        "well-formed share is assumed to come from an honest client running PVEC's randomizer",
    ]
    assumptions = [a for a in report.assumptions if not a.startswith("a trusted shuffler")]
    return secure_sum_statement(report, output, local, roles, assumptions)


def secure_sum_statement(report: PrivacyReport, output: Guarantee, local: Guarantee, roles: list[str],
                         assumptions: list[str]) -> PrivacyReport:
    """The learner's ``report`` restated for a secure-sum deployment: ``output``, an intrusion
    guarantee no better than the local one, the roles' assumptions first, the deployment's
    references last (:func:`sum_report`, :func:`panpriv.streamer.esa.gd_analyzer.gd_report`)."""
    return dataclasses.replace(
        report,
        output=output,
        intrusion=max_guarantee(local, output),
        assumptions=tuple([*roles, *assumptions]),
        references=tuple([*report.references, REFERENCE, SECURE_SUM_REFERENCE]),
    )


def checkin_report(learner: RandomCheckinSGD) -> PrivacyReport:
    """The ``checkin`` learner's report restated for an ESA deployment (:mod:`panpriv.streamer.esa.checkin_client`,
    :mod:`panpriv.streamer.esa.slot_shuffler`, :mod:`panpriv.streamer.esa.checkin_analyzer`).

    - **output**: the learner's own guarantee (Balle et al. 2020 Thm 3.2 / the setting of Thm 4.3
      for single updates with the l2 randomizer, derived in :mod:`panpriv.accounting.checkin`; else the
      unamplified (ε₀, δ₀)) — if the shuffler is honest and separate: the analyzer then sees, per
      slot, what the in-process learner's slot sees (one sealed update, a client's or a dummy, for
      ``single``; the candidates' updates for ``averaged``), never who chose which slot;
    - **intrusion** into the analyzer: the output guarantee — its key opens only the inner boxes,
      which on the messages topic are inside boxes sealed to the shuffler; what it holds is part of
      the released sequence of slot updates the bound covers (no candidate waits in the analyzer);
    - **collusion** of shuffler and analyzer, or an intrusion into the shuffler too: the local
      (ε₀, δ₀) (the shuffler knows each update's wake slot and chosen slot).
    """
    report = learner.privacy()
    local = learner.local_randomizer.local_guarantee()
    roles = [
        f"deployment: {DEPLOYMENT} (Encode-Shuffle-Analyze) for random check-ins: each client, at her public wake "
        "slot, checks in with her own randomness, randomizes her clipped gradient at the latest published model and "
        "sends one fixed-size message whether or not she checked in: the update sealed to the analyzer inside a box "
        "sealed to the shuffler with her chosen slot; a separate shuffler opens the outer box only, releases each slot "
        "once its wake slot is complete, in slot order, exactly once ("
        + ("the least-key candidate, or a dummy it draws and seals when the slot is empty, so every release is one "
           "update" if learner.update == "single" else "every candidate, permuted with OS entropy")
        + "); the analyzer sees the released updates only, with no client identity, wake slot or check-in",
        f"client: her update is {local}-locally private against anyone, including a shuffler and analyzer that collude",
        f"shuffler: holds no key that opens an update; it learns which slot each wake-slot client chose; if it colludes "
        f"with the analyzer only the local guarantee {local} holds",
        f"analyzer intrusion: its private key opens only the updates the shuffler released (on the messages topic "
        f"they are inside boxes sealed to the shuffler) and no candidate waits in the analyzer, so one read of its "
        f"memory or files plus all outputs is bounded by the output guarantee; an intrusion that also reads the "
        f"shuffler's key or state is bounded by the local guarantee {local} only",
        "client dropout: a wake slot closes with the clients that arrived by the shuffler's public deadline; the "
        "output bound holds conditionally on every other client's check-in, so fewer clients do not weaken it",
    ]
    assumptions = [a for a in report.assumptions if not a.startswith(("streaming deviation", "pan-privacy: the state holds"))]
    assumptions.append("staleness as in process: a client computes her update at her wake slot, at the model "
                       "published after the previous slot, and it waits in the shuffler for its chosen slot")
    return dataclasses.replace(
        report,
        intrusion=report.output,
        assumptions=tuple([*roles, *assumptions]),
        references=tuple([*report.references, REFERENCE]),
    )
