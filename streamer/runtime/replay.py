"""Learners that read a recording by record index: what they declare, and how passes are accounted.

Most learners take a stream in arrival order (:meth:`panpriv.protocols.base.Learner.learn_many` on each
micro-batch). Some need the whole recording at hand and choose which record comes next:
:class:`panpriv.protocols.pnsgd.ShuffledPNSGD` visits the n records in the order of one uniformly random
permutation (Sordello et al. 2021, Thm 2); a multi-pass learner such as ``shuffle-gd`` (Cheu et al. 2022, Alg. 5) reads every
record once per round. The processor drives such a learner over an :class:`~panpriv.streamer.io.indexed.IndexedFile`
instead of a sequential source. A learner takes part by subclassing
:class:`panpriv.protocols.recorded.RecordedLearner` (``n``, ``learn_recorded(fetch, micro_batch)``,
``resumes_mid_pass``, ``reports_per_round``/``round_reports()``, ``passes``), not by its name. The
processor's ``fetch`` is where it takes control between micro-batches: it accounts, checkpoints and
snapshots the batch just learned, and stops the run by raising :class:`Halt`. A learner that
reports per round (``shuffle-gd``) has pass ``p`` as its own ledger instance :func:`pass_instance`,
registered with the pass's *increment* of the learner's composed guarantee, so the ledger's
composition of the T uses of a record telescopes to the learner's figure instead of composing the
cumulative figure T times. Otherwise the learner's :meth:`~panpriv.protocols.base.Learner.privacy` covers
everything and each pass is charged to the one instance (right for one pass; over-counts, never
under-counts, for several).

Ledger. A pass uses every record of the recording, so when a pass begins its instance is charged
with the whole :attr:`~panpriv.streamer.io.indexed.IndexedFile.extent` (every position of every source key,
rejected messages included, as the sequential path charges them) — each record once per pass.
Charging only the positions visited so far would not be more precise: for ShuffledPNSGD the
guarantee of every record is an average over the random order (Sordello et al. 2021, App. A), and the set of
visited positions is information about the permutation that must not be kept at rest. The
rejects of the recording are counted once per pass, as a sequential replay counts them.

Crash and restart mid-pass (``resumes_mid_pass = False``). Whatever the interrupted pass released
was registered in a durable checkpoint before it left the process (snapshots follow their
checkpoint), together with the charge of the whole recording to its instance. The resumed run
restores the learner as it was at the start of the pass, gives the restarted pass a fresh instance
id, and charges it again when it begins: the ledger composes the interrupted pass's releases with
the new pass (basic composition), and ``learner.max_epsilon`` can stop the run before the new pass
spends anything.
"""

from __future__ import annotations

import logging
import time

from panpriv.protocols.base import Learner
from panpriv.protocols.recorded import RecordedLearner
from panpriv.streamer.config import SourceConfig
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.codec import Codec
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.io.source_url import FileUrl, parse_source_url

log = logging.getLogger("panpriv.replay")


class Halt(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised from ``fetch`` to end a recorded run between two micro-batches."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


def reads_by_index(learner_cls: type[Learner]) -> bool:
    """True if instances of ``learner_cls`` read a recording by record index."""
    return issubclass(learner_cls, RecordedLearner)


def has_round_reports(learner: Learner) -> bool:
    """Whether the learner accounts each pass as its own increment (``round_reports()``)."""
    return isinstance(learner, RecordedLearner) and learner.reports_per_round


def pass_instance(instance: str, number: int) -> str:
    """The ledger instance of pass ``number`` (1-based) of a learner reporting per round;
    zero-padded so that the ledger's sorted order is the passes' order."""
    return f"{instance}/round-{number:06d}"


def open_indexed(config: SourceConfig, codec: Codec, learner: str) -> IndexedFile:
    """The record-index reader for ``config.url``; a :class:`ConfigError` if the source cannot be
    read by index (a :class:`~panpriv.streamer.errors.SourceError` if the file cannot)."""
    parsed = parse_source_url(config.url)
    if not isinstance(parsed, FileUrl):
        raise ConfigError(
            f"learner {learner!r} reads a recording by record index, so its source must be file:PATH "
            "(a panpriv recording, JSONL or CSV); record a Kafka topic first with `panpriv record`"
        )
    if config.recorded_pace:
        raise ConfigError(
            f"source.recorded_pace: learner {learner!r} chooses the order of the records, so recorded "
            "timestamps cannot pace it; use source.rate"
        )
    path = parsed.path
    log.info("indexing %s: decoding and validating every record once", path)
    started = time.monotonic()
    indexed = IndexedFile(path, codec)
    rejected = sum(indexed.rejects.values())
    log.info("indexed %s valid records (%s rejected) in %.1f s", f"{indexed.n:,}", f"{rejected:,}", time.monotonic() - started)
    return indexed
