"""Authenticated batches: the shuffler signs every batch it releases, the analyzer learns only batches
its shuffler signed for its deployment (Bittau et al. 2017 §3: the analyzer trusts the shuffler's
thresholding and shuffling — so it must know a batch is the shuffler's).

Without a signature anyone who can write the shuffled topic could label any bytes as the current
round: a batch of one old valid unit repeated b times was applied as a round with no valid message,
and the statement's ε moved (from 4 to 6.18). Now:

- the **shuffler** signs, with Ed25519 (PyNaCl ``SigningKey``, derived from its key file:
  :func:`panpriv.streamer.esa.keys.signing_key`), the deployment id, the round, the count and size
  of the units, the batch digest (SHA-256 of the round and the sorted units) and its key id
  (:func:`panpriv.streamer.esa.wire.signed_part`). Ed25519 signatures are deterministic and the
  digest does not depend on the permutation, so a batch the shuffler releases again after a crash
  (the same units, another order) carries the same digest and signature;
- the **analyzer** holds the shuffler's verify key(s) and, before it opens, charges or learns
  anything of a record (:meth:`BatchVerifier.admit`), refuses: ``old_format`` (an unsigned batch of
  the format before signed batches), ``malformed_batch``, ``unknown_signer`` (signed by a key it
  does not hold: forged or re-signed), ``bad_signature`` (the signature does not verify, or the
  units are not the ones the signed digest names), ``wrong_deployment`` (the shuffler's batch for
  another deployment sharing its key). The order checks — ``duplicate_batch`` (a digest already
  applied: a re-release or a replay of the same record), ``replayed_batch`` (a batch of a round
  already analysed with other units), ``out_of_order`` (a round ahead of the current one) — need the
  analyzer's state: :meth:`panpriv.streamer.esa.analyzer.AnalyzerCore._admit`. Each refused
  record is counted once, by reason; it is never charged and never learned.

The deployment id is the data key ``esa:<cluster>/<messages topic>``
(:func:`panpriv.streamer.esa.deployment.data_key`): both roles compute it from the broker's cluster id
and the messages topic, so neither trusts the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from panpriv.streamer.esa import wire
from panpriv.streamer.esa.keys import ShufflerKeys, key_id

BATCH_REASONS = ("old_format", "malformed_batch", "unknown_signer", "bad_signature", "wrong_deployment")
"""Why :meth:`BatchVerifier.admit` refuses a record (module docstring)."""

ORDER_REASONS = ("duplicate_batch", "replayed_batch", "out_of_order")
"""Why an analyzer refuses a signed batch of its deployment (module docstring)."""


class BatchSigner:
    """The shuffler's side: every released round as one signed batch record of ``deployment``."""

    def __init__(self, keys: ShufflerKeys, deployment: str) -> None:
        self._signer = keys.signer
        self.signer_id = keys.signer_id
        self.deployment = deployment
        self._deployment = wire.deployment_digest(deployment)

    def record(self, round_: int, units: Sequence[bytes]) -> bytes:
        """The batch record of ``units`` (already permuted) as round ``round_``, signed."""
        size = len(units[0]) if units else 0
        digest = wire.batch_digest(round_, units)
        signed = wire.signed_part(self._deployment, round_, len(units), size, digest, self.signer_id)
        signature = self._signer.sign(signed).signature
        return wire.batch_record(self._deployment, round_, units, digest, self.signer_id, signature)


class BatchVerifier:
    """The analyzer's side: the batches of ``deployment`` signed by one of ``verify_keys``."""

    def __init__(self, verify_keys: Sequence[VerifyKey], deployment: str) -> None:
        if not verify_keys:
            raise ValueError("the analyzer needs the shuffler's verify key (shuffler-<id>.verify)")
        self._keys = {key_id(key): key for key in verify_keys}
        self.deployment = deployment
        self._deployment = wire.deployment_digest(deployment)

    @property
    def signer_ids(self) -> list[str]:
        return sorted(ident.hex() for ident in self._keys)

    def admit(self, value: bytes | None) -> wire.Batch | str:
        """The batch in ``value`` if its framing is sound, its signer one of the verify keys, its
        signature valid over the digest of exactly its units, and its deployment this one; else
        the reason (:data:`BATCH_REASONS`)."""
        try:
            batch = wire.parse_batch(value or b"")
        except wire.WireError as exc:
            return str(exc)
        key = self._keys.get(batch.signer_id)
        if key is None:
            return "unknown_signer"
        try:
            key.verify(batch.signed, batch.signature)
        except BadSignatureError:
            return "bad_signature"
        if wire.batch_digest(batch.round, batch.units) != batch.digest:
            return "bad_signature"
        if batch.deployment != self._deployment:
            return "wrong_deployment"
        return batch
