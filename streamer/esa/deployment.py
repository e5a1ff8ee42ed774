"""The privacy statement of an analyzer deployed as Encode–Shuffle–Analyze: ``shuffle-gaussian``
(:func:`esa_report`), ``shuffle-sgd``/``shuffle-acsa`` over secure summation (:func:`sum_report`),
``shuffle-gd`` (:func:`panpriv.streamer.esa.gd_analyzer.gd_report`) and ``checkin``
(:func:`checkin_report`).

The learner's own report assumes randomizer, shuffler and analyzer in one process. Deployed in
three roles (Bittau et al. 2017 §3) the same numbers hold under a trust model this module states,
the same for every learner (:func:`parties`):

- **who reads what** (the deploy/ Kafka ACLs enforce it): clients write the messages topic and read
  the model topic; the shuffler reads the messages topic and writes (and reads back) the shuffled
  topic (``checkin``: and reads the model topic); the analyzer reads the shuffled topic and writes
  the model topic. Keys: clients hold the analyzer's and the shuffler's public keys; the shuffler
  its private key, which opens the outer layer of a message and signs batches (``checkin``: and the
  analyzer's public keys, for its dummies); the analyzer its private keys, which open released
  units only, and the shuffler's verify key;
- **output** (against the analyzer and everyone who sees its models), **intrusion** into the
  analyzer (one read of its memory and files, plus all outputs) and **a broker operator colluding
  with the analyzer**: the shuffle-model guarantee. Every message is sealed to the analyzer and
  then to the shuffler (onion sealing, :mod:`panpriv.streamer.esa.wire`): the analyzer's key opens
  nothing on the messages topic, and a released unit shares no bytes, size or timing with any
  message, so reading both topics links no unit to its sender. The analyzer learns only batches
  the shuffler signed for this deployment, in round order, once
  (:mod:`panpriv.streamer.esa.batches`), so nobody else can make it learn a round;
- **shuffler colluding with the analyzer** (or an intrusion into both): the local guarantee;
- **client**: her message is locally private against anyone;
- **colluding clients**: the shuffle-model guarantee hides each honest user among the honest ones.
  The secure-sum learners compute m and τ for h = ⌈γn⌉ honest users with the plan's
  ``honest_fraction`` γ (:func:`panpriv.protocols.secure_sum.round_plan`); the others assume γ = 1
  and say so.
"""

from __future__ import annotations

import dataclasses

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.secure_sum import SumPlan, added_delta
from panpriv.protocols.shuffle_base import SequentialLearner
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD

DEPLOYMENT = "trusted shuffler, separate process"
"""How the ledger and statements name this deployment."""

REFERENCE = "Bittau et al. 2017, §3 (Encode-Shuffle-Analyze)"

SECURE_SUM_REFERENCE = "Ishai et al. 2006 (split and mix; message count: panpriv.protocols.secure_sum)"

KEY_PREFIX = "esa:"


def data_key(cluster: str, messages_topic: str) -> str:
    """The deployment id ``esa:<cluster>/<messages topic>``: the data key of the deployment's records
    in the budget store (why the messages topic: :mod:`panpriv.streamer.esa.analyze_service`) and
    what the shuffler signs every batch for (:mod:`panpriv.streamer.esa.batches`). The shuffler and
    the analyzer each compute it from the broker's cluster id
    (:func:`panpriv.streamer.sources.identity.kafka_cluster_identity`), so neither trusts the other for it."""
    return f"{KEY_PREFIX}{cluster}/{messages_topic}"


def topic_access(checkin: bool = False) -> dict[str, dict[str, tuple[str, ...]]]:
    """Which topics each role reads and writes — the one table the statement prints, docs/privacy.md
    shows and the deploy/ Kafka ACLs grant (tested against both). The shuffler reads the shuffled
    topic back for its last released round; the ``checkin`` shuffler reads the model topic for the
    deployment's configuration and each slot's analyzer key."""
    return {
        "client": {"read": ("model",), "write": ("messages",)},
        "shuffler": {"read": ("messages", "shuffled", *(("model",) if checkin else ())), "write": ("shuffled",)},
        "analyzer": {"read": ("shuffled",), "write": ("model",)},
    }


def _topics(names: tuple[str, ...]) -> str:
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"the {listed} topic{'s' if len(names) > 1 else ''}"


def _access_line(checkin: bool) -> str:
    parts = [f"the {role} reads {_topics(access['read'])} and writes {_topics(access['write'])}"
             for role, access in topic_access(checkin).items()]
    return "readable topics (deploy/ Kafka ACLs): " + "; ".join(parts) + "; nobody reads a topic beyond these"


def parties(output: Guarantee, local: Guarantee, checkin: bool = False) -> list[str]:
    """The statement's lines on who reads which topic (:func:`topic_access`) and holds which key,
    what a broker operator colluding with the analyzer learns, and each role's guarantee (module
    docstring)."""
    dummy_keys = " and the analyzer's public keys (it seals the dummies of empty slots)" if checkin else ""
    return [
        _access_line(checkin),
        "keys: clients hold the analyzer's and the shuffler's public keys and seal each message to the analyzer, "
        "then the result to the shuffler (onion sealing); the shuffler holds its private key, which opens the outer "
        f"layer only and signs every batch{dummy_keys}; the analyzer holds its private keys, which open released "
        "units only, and the shuffler's verify key: it learns only batches the shuffler signed for this deployment, "
        "in round order, once (unsigned, forged, replayed, out-of-order and duplicated batches are refused, counted "
        "and never charged)",
        f"broker operator colluding with the analyzer: it reads every topic and sees the clients' connections and "
        f"send times, but the analyzer's key opens nothing on the messages topic and no released unit shares bytes, "
        f"size or timing with a message (a batch's units leave together, permuted), so it learns who sent in which "
        f"round, not which unit is whose: the output guarantee {output} holds",
        f"client: her message is {local}-locally private against anyone, including a shuffler and analyzer that "
        "collude",
        f"shuffler: opens only the outer layer (it sees sealed units, rounds, sizes and the broker's metadata); with "
        f"the broker it learns no content; if it colludes with the analyzer only the local guarantee {local} holds",
        f"analyzer intrusion: its keys open only released, already shuffled units, so one read of its memory or "
        f"files plus all outputs, with or without the topics, is bounded by the output guarantee {output}; an "
        f"intrusion into the shuffler too is the collusion above: the local guarantee {local}",
    ]


def all_honest(crowd: str) -> str:
    """The statement's line for learners that assume every client honest (γ = 1)."""
    return (f"colluding clients: honest fraction gamma = 1 (default): every client is assumed honest; colluding "
            f"clients are outside the model (k of them who hand their messages to the analyzer leave {crowd} minus k "
            "to hide the others)")


def esa_report(learner: ShuffleGaussianSGD, min_valid: int | None) -> PrivacyReport:
    """The learner's report restated for the ESA deployment (module docstring).

    - **output**, **intrusion**, **broker with analyzer**: the shuffle-model guarantee of one round
      (Liew & Takahashi 2022 Thm 1) — if the shuffler is honest and separate. When a round had
      fewer valid messages than b (rejected ones), each message hid among fewer others: the
      guarantee is then that of the smallest round, Thm 1 at n = its valid count (never above the
      local ε₀). Messages that decrypt and are well formed but come from dishonest clients cannot
      be told apart: the bound assumes every valid message is an honest user's (γ = 1).
    - **collusion** of shuffler and analyzer: the local guarantee (ε₀, δ).

    ``min_valid``: the fewest valid messages any applied round had (``None``: no round yet).
    """
    report = learner.privacy()
    local = learner.local_guarantee()
    b = learner.batch_size or 0
    output = report.output
    if min_valid is not None and min_valid < b:
        output = Guarantee(learner.round_epsilon(min_valid), learner.delta)
    roles = [
        f"deployment: {DEPLOYMENT} (Encode-Shuffle-Analyze): clients seal their message to the analyzer's key and "
        f"the result to the shuffler's; a separate shuffler removes its layer, drops metadata, releases a round only "
        f"at exactly b = {b} messages, permutes it with OS entropy and signs the batch; the analyzer sees only signed "
        "shuffled batches",
        *parties(output, local),
        all_honest(f"b = {b}"),
        "client dropout or rejected messages: the output guarantee is that of the round with the fewest valid "
        f"messages ({'none yet' if min_valid is None else min_valid} of {b}); every valid message is assumed to come "
        "from an honest client",
    ]
    assumptions = [a for a in report.assumptions if not a.startswith("a trusted shuffler")]
    return dataclasses.replace(
        report,
        output=output,
        intrusion=output,
        assumptions=tuple([*roles, *assumptions]),
        references=tuple([*report.references, REFERENCE]),
    )


def honest_users_line(plan: SumPlan, gamma: float) -> str:
    """The statement's line on colluding clients for a secure-sum learner."""
    if plan.honest == plan.users:
        return (f"colluding clients: honest fraction gamma = {gamma:g} (default 1): m and tau are computed for all "
                f"n = {plan.users} users, so colluding clients are outside the model (k of them who hand their shares "
                "to the analyzer leave a split and mix of n - k users, which tau does not cover; declare "
                "honest_fraction to cover them)")
    return (f"colluding clients: honest fraction gamma = {gamma:g}: m = {plan.shares} and tau are computed for "
            f"ceil(gamma n) = {plan.honest} honest users of n = {plan.users}, and PVEC's noise for the same users, so up "
            f"to {plan.users - plan.honest} clients may collude with the analyzer (hand it their shares, or send any)")


def sum_report(learner: SequentialLearner, plan: SumPlan) -> PrivacyReport:
    """The ``shuffle-sgd`` or ``shuffle-acsa`` learner's report restated for an ESA deployment over split-and-mix
    shares (:mod:`panpriv.protocols.secure_sum`, :mod:`panpriv.streamer.esa.sum_analyzer`).

    - **output**, **intrusion**, **broker with analyzer**: PVEC's (ε, δ) per round (Cheu et al.
      2022, Thm 3.2, a statement about the per-coordinate totals of the users' counts) becomes
      (ε, δ + (1 + e^ε)·τ): the analyzer sees the round's shuffled shares, within statistical
      distance τ of a function of the totals (:func:`panpriv.protocols.secure_sum.distance_bound`,
      at the plan's honest users), and the hybrid argument of :mod:`panpriv.protocols.secure_sum`
      adds (1 + e^ε)·τ to δ. The messages topic holds each user's m shares as one message sealed
      to the shuffler, so the analyzer's key does not link them;
    - **collusion** of shuffler and analyzer: they link a user's m shares and see her PVEC count
      vector: the local guarantee of PVEC's randomizer.
    """
    report = learner.privacy()
    local = report.intrusion
    eps = report.output.epsilon
    added = added_delta(eps, plan.tau)
    output = Guarantee(eps, report.output.delta + added)
    roles = [
        f"deployment: {DEPLOYMENT} (Encode-Shuffle-Analyze) over secure summation: each client splits her PVEC count "
        f"vector into m = {plan.shares} additive shares in Z_q^d, q = 2^{plan.bits} > B(g + b), seals each share "
        f"separately to the analyzer's key and the m together to the shuffler's; a separate shuffler removes its layer, "
        f"drops metadata, releases a round only at exactly B = {plan.users} complete users, permutes all B*m shares with "
        "OS entropy and signs the batch; the analyzer sums them mod q",
        f"secure summation (Ishai et al. 2006): the analyzer's view of a round is within statistical distance "
        f"tau = {plan.tau:.3g} of a function of the per-coordinate totals alone (the bound proved in "
        f"panpriv.protocols.secure_sum, not a paper's constant); the output delta includes (1 + e^eps) tau = {added:.3g}",
        *parties(output, local),
        honest_users_line(plan, learner.honest_fraction),
        "malicious clients: a client can shift a round's sum by any amount mod q (utility: it biases one step; the "
        "shares of the honest users stay a split and mix); a round whose sum leaves [0, B(g + b)] is skipped but "
        "charged (whether a shifted sum leaves the range depends on the honest users' totals), one with any share "
        "that does not open is skipped and not charged",
    ]
    assumptions = [a for a in report.assumptions if not a.startswith("a trusted shuffler")]
    return secure_sum_statement(report, output, roles, assumptions)


def secure_sum_statement(report: PrivacyReport, output: Guarantee, roles: list[str],
                         assumptions: list[str]) -> PrivacyReport:
    """The learner's ``report`` restated for a secure-sum deployment: ``output`` as the output and
    intrusion guarantee, the roles' assumptions first, the deployment's references last
    (:func:`sum_report`, :func:`panpriv.streamer.esa.gd_analyzer.gd_report`)."""
    return dataclasses.replace(
        report,
        output=output,
        intrusion=output,
        assumptions=tuple([*roles, *assumptions]),
        references=tuple([*report.references, REFERENCE, SECURE_SUM_REFERENCE]),
    )


def checkin_report(learner: RandomCheckinSGD) -> PrivacyReport:
    """The ``checkin`` learner's report restated for an ESA deployment (:mod:`panpriv.streamer.esa.checkin_client`,
    :mod:`panpriv.streamer.esa.slot_shuffler`, :mod:`panpriv.streamer.esa.checkin_analyzer`).

    - **output**, **intrusion**, **broker with analyzer**: the learner's own guarantee (Balle et
      al. 2020 Thm 3.2 / the setting of Thm 4.3 for single updates with the l2 randomizer, derived
      in :mod:`panpriv.accounting.checkin`; else the unamplified (ε₀, δ₀)) — if the shuffler is
      honest and separate: the analyzer then sees, per slot, what the in-process learner's slot
      sees (one sealed update, a client's or a dummy sealed to the key the slot's model names, for
      ``single``; the candidates' updates for ``averaged``), never who chose which slot;
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
        "once its wake slot is complete, in slot order, exactly once, signed ("
        + ("the least-key candidate sealed to the key the slot's model names, or a dummy it derives and seals to that "
           "key when the slot is empty, so every release is one update of one size and key id"
           if learner.update == "single" else "every candidate sealed to the key the slot's model names, permuted with "
           "OS entropy")
        + "); the analyzer sees the released updates only, with no client identity, wake slot or check-in",
        *parties(report.output, local, checkin=True),
        all_honest("the clients of a window"),
        "dishonest clients that win slots: a client who sends choice key 0 wins the slot she chooses, even if she "
        "chooses it (and her record) from the published models; that cannot weaken an honest client's bound (proved: "
        "panpriv.accounting.checkin.per_slot_epsilons, 'Dishonest clients'); a well-formed update that is not the "
        "randomizer's output and is picked instead of an honest client's is outside the bound (gamma = 1)",
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
