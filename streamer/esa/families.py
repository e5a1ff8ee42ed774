"""The E-S-A families: learner name → how it runs as client, shuffler and analyzer.

The one list of the learners that run in three roles (Bittau et al. 2017 §3), as
:mod:`panpriv.protocols.catalogue` is the one list of learners. Every role looks its learner up
here instead of testing for classes or names: ``panpriv analyze --learner`` (its choices and help),
the analyzer's construction and restore, its reject reasons (the metrics), its checkpoint format
(the state file), the budget's charge unit, the client ``panpriv encode`` runs and the shuffler
mode a deployment needs. Adding a learner to the shuffle model means writing its analyzer and its
client (or reusing a family's) and adding one entry here.

Entries name classes as ``"module:Class"`` strings, imported on use, so that this module imports
nothing (a client that imports it stays free of the service).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Family:
    """How one learner runs in three roles.

    Attributes
    ----------
    learner
        The catalogue name (:mod:`panpriv.protocols.catalogue`).
    analyzer
        ``"module:Class"`` of the analyzer: a class with ``REJECT_REASONS``, ``CHECKPOINT_FORMAT``,
        ``restore(data, keys)`` and a constructor ``(learner, keys, name)``.
    encoder
        ``"module:Class"`` of the client's encoder (what ``panpriv encode`` and applications use): a
        constructor ``(analyzer public key, shuffler public key, model, max_local_epsilon)`` — every
        family's messages are sealed to the analyzer, then to the shuffler
        (:mod:`panpriv.streamer.esa.wire`), so every deployment has a shuffler key pair
        (``panpriv keygen --role shuffler``).
    client
        How users take part: ``"per-round"`` (each user answers one round: one message, or m shares),
        ``"every-round"`` (every user answers each of T rounds, keeping a state file), ``"check-in"``
        (each user checks in once, at her wake slot).
    shuffler
        What ``panpriv shuffle`` releases, as signed batches of units (:mod:`panpriv.streamer.esa.batches`):
        ``"messages"`` (one unit per message), ``"shares"`` (``--shares M``: the M share units of
        each message) or ``"slots"`` (``--checkin``: per-slot releases, each sealed to its slot's key).
    batch_option
        The learner's constructor parameter that ``panpriv analyze --batch-size`` sets (the users of
        a round: ``batch_size``; ``n`` for ``shuffle-gd``, whose rounds ask every user;
        ``slot_length`` for ``checkin``).
    """

    learner: str
    analyzer: str
    encoder: str
    client: Literal["per-round", "every-round", "check-in"]
    shuffler: Literal["messages", "shares", "slots"]
    batch_option: str = "batch_size"

    def analyzer_class(self) -> Any:
        return _load(self.analyzer)

    def encoder_class(self) -> Any:
        return _load(self.encoder)

    @property
    def reject_reasons(self) -> tuple[str, ...]:
        """Every reason the analyzer counts a rejected batch, message or round for."""
        return tuple(self.analyzer_class().REJECT_REASONS)

    @property
    def checkpoint_format(self) -> str:
        """The ``format`` of the analyzer's state (``analyzer.json``)."""
        return str(self.analyzer_class().CHECKPOINT_FORMAT)


_SUM_ANALYZER = "panpriv.streamer.esa.sum_analyzer:SumAnalyzer"
_SHARES_ENCODER = "panpriv.streamer.esa.sum_client:SharesEncoder"

FAMILIES: dict[str, Family] = {
    "shuffle-gaussian": Family("shuffle-gaussian", "panpriv.streamer.esa.analyzer:Analyzer",
                               "panpriv.streamer.esa.client:Encoder", "per-round", "messages"),
    "shuffle-acsa": Family("shuffle-acsa", _SUM_ANALYZER, _SHARES_ENCODER, "per-round", "shares"),
    "shuffle-sgd": Family("shuffle-sgd", _SUM_ANALYZER, _SHARES_ENCODER, "per-round", "shares"),
    "shuffle-gd": Family("shuffle-gd", "panpriv.streamer.esa.gd_analyzer:GDAnalyzer",
                         "panpriv.streamer.esa.gd_client:GDEncoder", "every-round", "shares", batch_option="n"),
    "checkin": Family("checkin", "panpriv.streamer.esa.checkin_analyzer:CheckinAnalyzer",
                      "panpriv.streamer.esa.checkin_client:CheckinEncoder", "check-in", "slots", batch_option="slot_length"),
}
"""Learner name → its family, in the order ``panpriv analyze --help`` lists them."""


def learners_with(**attributes: str) -> tuple[str, ...]:
    """The learners whose family has every one of ``attributes`` (``shuffler="shares"``, …): what a
    client or shuffler mode serves, derived from this one list."""
    return tuple(name for name, entry in FAMILIES.items()
                 if all(getattr(entry, key) == value for key, value in attributes.items()))


class UnknownFamilyError(ValueError):
    """A learner that does not run in three roles, or a state of no known analyzer."""


def family(learner: str) -> Family:
    """The family of ``learner``; :class:`UnknownFamilyError` naming the choices otherwise."""
    found = FAMILIES.get(learner)
    if found is None:
        raise UnknownFamilyError(f"learner {learner!r} does not run in three roles (encode, shuffle, analyze); "
                                 f"these do: {', '.join(FAMILIES)}")
    return found


def analyzer_for_format(checkpoint_format: object) -> Any:
    """The analyzer class whose state has ``checkpoint_format``; :class:`UnknownFamilyError` otherwise."""
    for entry in FAMILIES.values():
        if entry.checkpoint_format == checkpoint_format:
            return entry.analyzer_class()
    formats = sorted({entry.checkpoint_format for entry in FAMILIES.values()})
    raise UnknownFamilyError(f"not an analyzer state of this panpriv (format {checkpoint_format!r}; known: "
                             f"{', '.join(formats)})")


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
