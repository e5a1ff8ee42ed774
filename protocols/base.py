"""The contract every panpriv learner follows (the architecture is described in README.md).

A learner consumes a stream in micro-batches of any size through :meth:`Learner.learn_many`,
keeps only noisy internal state, and releases parameters through :meth:`Learner.snapshot`.
How the stream is cut into micro-batches never changes the mechanism: the state after
``learn_many(A); learn_many(B)`` has the same distribution as after ``learn_many(A + B)``.

Persistence goes through :meth:`Learner.state_dict` (noisy arrays and counters only — never a raw
record, never generator state; for a learner with batch boundaries, the state at the last one:
:meth:`Learner.records_to_boundary`) and :meth:`Learner.from_state_dict` with the constructor
configuration from :meth:`Learner.config`. ``panpriv.protocols.checks`` is the conformance suite that
every learner's tests run.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self, overload

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import validation as check
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.geometry import L2Ball
from panpriv.protocols.losses import Loss, learner_loss
from panpriv.protocols.randomness import SEEDED_WARNING, NoiseSource, RngLike
from panpriv.protocols.schema import FeatureSchema
from panpriv.protocols.scratch import Scratch
from panpriv.protocols.sigmoid import expit

StateValue = NDArray[np.float64] | NDArray[np.int64] | int | float | str | bool
"""What a state dict may hold: noisy arrays, counters, and small labels (e.g. a phase name)."""


CLIPPING_RULE = "l2-ball"
"""How features are bounded, in training and in prediction alike: a row x with ‖x‖₂ above the
feature bound R is replaced by R·x/‖x‖₂ (rows inside the ball are unchanged)."""


@dataclass(frozen=True)
class ModelSpec:
    """What released parameters need in order to be used: the loss (its link ``σ`` or identity, and
    whether an intercept feature is appended), the feature dimension, the feature bound of the
    clipping rule, and optional feature names. Public configuration: no data-dependent value."""

    loss: Loss
    dim: int
    feature_bound: float
    feature_names: tuple[str, ...] | None = None
    schema: FeatureSchema | None = None
    """The named fields the model was trained on (:mod:`panpriv.protocols.schema`), if declared:
    a prediction then takes a record as a mapping, mapped exactly as in training."""

    @property
    def link(self) -> str:
        """``"logistic"`` (probabilities σ(⟨θ, z⟩)) or ``"identity"`` (scores, values)."""
        return "logistic" if self.loss.name == "logistic" else "identity"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the snapshot record's ``model`` field)."""
        return {
            "loss": self.loss.config(),
            "link": self.link,
            "intercept": self.loss.intercept,
            "dim": self.dim,
            "feature_bound": self.feature_bound,
            "clipping": CLIPPING_RULE,
            "feature_names": None if self.feature_names is None else list(self.feature_names),
            **({} if self.schema is None else {"schema": self.schema.to_dict()}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        """Inverse of :meth:`to_dict`; an unknown clipping rule is refused (predictions would not
        match training)."""
        from panpriv.protocols.losses import loss_from_config

        if data.get("clipping", CLIPPING_RULE) != CLIPPING_RULE:
            raise InvalidInputError(f"model: unknown clipping rule {data.get('clipping')!r}; this panpriv applies {CLIPPING_RULE!r}")
        names = data.get("feature_names")
        schema = data.get("schema")
        return cls(
            loss_from_config(data["loss"]),
            int(data["dim"]),
            float(data["feature_bound"]),
            None if names is None else tuple(str(n) for n in names),
            None if schema is None else FeatureSchema.from_dict(schema),
        )

    def features(self, X: object) -> NDArray[np.float64]:
        """Validated rows, clipped and extended exactly as in training (``loss.features``)."""
        X_arr, _ = check_batch("ModelSpec", X, None, self.dim)
        return self.loss.features(X_arr, self.feature_bound)

    def row(self, x: object, owner: str) -> NDArray[np.float64]:
        """One record as a (1, dim) row: a mapping through :attr:`schema`, else an array."""
        return record_row(x, self.schema, owner)


@dataclass(frozen=True)
class Snapshot:
    """Released parameters with the guarantee that covers them, and what serving them needs.

    ``params`` are computed from noisy state only; ``records`` is how many records contributed
    (:attr:`Learner.state_records`: for ``pan-acsa`` the records up to the last batch boundary).
    ``model`` (absent from snapshots written before it existed) makes the snapshot servable:
    :meth:`predict_many` applies the training-time clipping to new rows. Serving a snapshot is
    post-processing of a release: it costs no privacy.
    """

    learner: str
    records: int
    params: NDArray[np.float64]
    privacy: PrivacyReport
    model: ModelSpec | None = None

    def _spec(self) -> ModelSpec:
        if self.model is None:
            raise InvalidInputError(
                f"this {self.learner} snapshot carries no model description (written before servable snapshots); "
                "load it with its loss and feature bound (panpriv.streamer.serving.snapshots.load_snapshot(..., loss=..., feature_bound=...))"
            )
        return self.model

    def decision_many(self, X: object) -> NDArray[np.float64]:
        """Scores ⟨θ, z⟩ of the rows of ``X`` (z: clipped features, intercept appended)."""
        return self._spec().features(X) @ self.params

    def predict_many(self, X: object) -> NDArray[np.float64]:
        """Labels ±1 (classification losses) or values (regression losses); as :meth:`Learner.predict_many`."""
        return labels_or_values(self._spec().loss, self.decision_many(X))

    def predict_proba_many(self, X: object) -> NDArray[np.float64]:
        """P(y = 1) for the logistic loss; an error for the others."""
        spec = self._spec()
        return probabilities(spec.loss, spec.features(X) @ self.params, f"{self.learner} snapshot")

    def predict_one(self, x: object) -> float:
        """:meth:`predict_many` for one record: an array, or a mapping of named fields when the
        snapshot carries its schema (``model.schema``)."""
        return float(self.predict_many(self._spec().row(x, f"{self.learner} snapshot"))[0])

    def predict_proba_one(self, x: object) -> float:
        """:meth:`predict_proba_many` for one record (an array or, with a schema, a mapping)."""
        return float(self.predict_proba_many(self._spec().row(x, f"{self.learner} snapshot"))[0])

    def to_sklearn(self) -> Any:
        """A fitted scikit-learn linear estimator (``coef_``, ``intercept_``) with these parameters:
        ``LogisticRegression`` for the logistic loss, ``LinearRegression`` for the regression losses,
        ``SGDClassifier(loss="hinge")`` for the hinge loss. Caveat: scikit-learn does not clip
        features, so its predictions match :meth:`predict_many` only on rows with ‖x‖₂ ≤ the
        feature bound; clip other rows first (or use this snapshot). Needs scikit-learn."""
        try:
            from sklearn.linear_model import LinearRegression, LogisticRegression, SGDClassifier
        except ImportError:
            raise ImportError("Snapshot.to_sklearn needs scikit-learn (pip install scikit-learn)") from None
        spec = self._spec()
        params = np.asarray(self.params, dtype=np.float64)
        coef, intercept = params[: spec.dim], 0.0
        if spec.loss.intercept:
            intercept = float(params[spec.dim]) * spec.loss.intercept_scale
        estimator: Any
        if spec.loss.binary_labels:
            estimator = LogisticRegression() if spec.loss.name == "logistic" else SGDClassifier(loss="hinge")
            estimator.classes_ = np.array([-1.0, 1.0])
            estimator.coef_ = coef.reshape(1, -1).copy()
            estimator.intercept_ = np.array([intercept])
        else:
            estimator = LinearRegression()
            estimator.coef_ = coef.copy()
            estimator.intercept_ = intercept
        estimator.n_features_in_ = spec.dim
        return estimator

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (parameters as a list of floats)."""
        return {
            "learner": self.learner,
            "records": self.records,
            "params": [float(v) for v in self.params],
            "privacy": self.privacy.to_dict(),
            "model": None if self.model is None else self.model.to_dict(),
        }


def record_row(x: object, schema: FeatureSchema | None, owner: str) -> NDArray[np.float64]:
    """One record as a (1, d) float64 row: a mapping of named fields through ``schema`` (an
    error naming ``owner`` without one), anything else as an array (checked by the caller)."""
    if isinstance(x, Mapping):
        if schema is None:
            raise InvalidInputError(
                f"{owner}: a record given as a mapping needs the feature names: call use_schema(FeatureSchema(...)) "
                "or use_schema([names in order]) first, or pass an array"
            )
        return schema.vector(x, owner).reshape(1, -1)
    return np.asarray(x, dtype=np.float64).reshape(1, -1)


def labels_or_values(loss: Loss, scores: NDArray[np.float64]) -> NDArray[np.float64]:
    """Labels ±1 (sign of the score, ties to +1) for a classification loss; the scores otherwise."""
    if not loss.binary_labels:
        return scores
    return np.where(scores >= 0.0, 1.0, -1.0)


def probabilities(loss: Loss, scores: NDArray[np.float64], owner: str) -> NDArray[np.float64]:
    """σ(score) for the logistic loss; an error naming ``owner`` for the losses that give none."""
    if loss.name != "logistic":
        raise InvalidInputError(
            f"{owner}: the {loss.name} loss gives no probabilities; use predict_many (labels or values) "
            "or decision_many (scores)"
        )
    return np.asarray(expit(scores), dtype=np.float64)


def doubling_epochs_beyond(planned: int, placement: str) -> str:
    """:meth:`Learner.beyond_plan` of a learner whose first epoch plans for ``planned`` records and
    whose later epochs are each twice as long, warm-started (the doubling trick), each record
    placed once (``placement``: where), so its per-record guarantee does not depend on the length."""
    return (
        f"records past the first {planned:,} are learned by further epochs, each twice as long and warm-started "
        f"from the last; {placement}, so the per-record guarantee is unchanged, but the model was planned for "
        f"{planned:,} records. Set learner.n (--n) to the stream's length"
    )


def default_radius(dim: int) -> float:
    """The radius r of Θ when none is given: r = √d, by a rule that does not look at the data.

    Θ = {‖θ‖ ≤ √d} contains every weight vector with |θ_j| ≤ 1 for each of the d features: for
    features on a unit scale (in [0, 1] or [-1, 1], one-hot or scaled ranges) each may move the
    log-odds by up to one e-fold, and a model can reach confident predictions, which radius 1
    (|⟨θ, x⟩| ≤ ‖x‖) cannot for more than a handful of features (probabilities stay in
    [0.27, 0.73] at ‖x‖ ≤ 1). Never below 1. Every learner's ``radius=None`` means this.
    """
    return max(1.0, math.sqrt(dim))


class Learner(abc.ABC):
    """Base class of the online learners.

    Subclasses set ``name`` (the CLI's ``--learner`` value) and implement the abstract methods.
    Constructor arguments are stored under the same names so that :meth:`config` can return them
    (River's convention); learned state is private.
    """

    name: ClassVar[str]
    noisy_counters: ClassVar[frozenset[str]] = frozenset()
    """Integer entries of :meth:`state_dict` that depend on the noise (e.g. ``pan-acsa``'s AC-SA step
    index, reset by noise-driven restarts); the conformance suite compares their distribution
    across micro-batch splits instead of requiring equality. Other integers are public counters."""
    legacy_defaults: ClassVar[Mapping[str, Any]] = {}
    """Constructor arguments added after checkpoints were written without them, each with the value
    that rebuilds the learner such a checkpoint holds (the behaviour before the argument existed)
    when it differs from today's default; :meth:`from_state_dict` fills them in. An argument whose
    default reproduces the old behaviour needs no entry."""
    dim: int
    loss: Loss
    feature_bound: float
    radius: float
    _noise: NoiseSource
    schema: FeatureSchema | None = None
    """The named fields of a record (:meth:`use_schema`); ``None`` until declared."""

    def _setup_common(
        self,
        owner: str,
        dim: int,
        loss: Loss | Mapping[str, Any] | str,
        radius: float | None,
        feature_bound: float,
        rng: RngLike,
    ) -> None:
        """The constructor header every learner root shares: validate and store ``dim``, ``loss``
        (a :class:`~panpriv.protocols.losses.Loss`, or its name or config dict completed with the
        learners' defaults by :func:`~panpriv.protocols.losses.learner_loss`: an intercept),
        ``radius`` (``None``: :func:`default_radius`) and ``feature_bound`` under their names
        (errors name ``owner``), and set up what each learner holds: the parameter count
        ``_params`` (with the intercept), the domain ``_ball`` of that radius, the ``_noise``
        source (OS entropy unless ``rng`` is given: the loudly labelled replay/testing mode), the
        wiped ``_scratch`` buffers and the ``_records`` counter. The resolved values are what
        :meth:`config` records, so a configuration rebuilds the same learner whatever the
        defaults of a later version."""
        self.dim = check.positive_int(owner, "dim", dim)
        self.loss = learner_loss(loss, owner)
        self.radius = default_radius(self.dim) if radius is None else check.positive(owner, "radius", radius)
        self.feature_bound = check.positive(owner, "feature_bound", feature_bound)
        self._params = self.loss.param_dim(self.dim)
        self._ball = L2Ball(self.radius)
        self._noise = NoiseSource(rng)
        self._scratch = Scratch()
        self._records = 0

    @abc.abstractmethod
    def learn_many(self, X: NDArray[np.float64], y: NDArray[np.float64]) -> None:
        """Process a micro-batch: ``X`` of shape (m, dim), ``y`` of shape (m,). Inputs are not mutated."""

    def use_schema(self, schema: FeatureSchema | Iterable[str]) -> Self:
        """Name the features, so that :meth:`learn_one`, :meth:`predict_one` and
        :meth:`predict_proba_one` take a record as a mapping (``{"age": 0.3, …}``) and snapshots
        carry the names and the mapping: a :class:`~panpriv.protocols.schema.FeatureSchema`, or
        the names of plain numeric features in position order. Its dimension must be ``dim``.
        The same mapping the service applies to named JSON and CSV records
        (``records.fields``); not part of :meth:`config` (it changes no noise). Returns ``self``."""
        if not isinstance(schema, FeatureSchema):
            schema = FeatureSchema.of_names(schema)
        if schema.dim != self.dim:
            raise InvalidInputError(
                f"{type(self).__name__}.use_schema: the schema's features take {schema.dim} positions; this learner has dim={self.dim}"
            )
        self.schema = schema
        return self

    def learn_one(self, x: NDArray[np.float64] | Mapping[str, Any], y: float) -> None:
        """Process one record: :meth:`learn_many` on a micro-batch of one (same mechanism). ``x``
        is an array of ``dim`` features or, after :meth:`use_schema`, a mapping of named fields."""
        row = record_row(x, self.schema, f"{type(self).__name__}.learn_one")
        self.learn_many(row, np.array([y], dtype=np.float64))

    def predict_many(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Labels ±1 for a classification loss (logistic, hinge: the sign of the score ⟨θ, z⟩,
        ties to +1), the predicted value for a regression loss; at the released parameters.

        Features are clipped to ``feature_bound`` (and the intercept appended) exactly as in
        training. Like River's ``predict_many`` and scikit-learn's ``predict``.
        """
        return labels_or_values(self.loss, self.decision_many(X))

    def predict_proba_many(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """P(y = 1) for each row, for the logistic loss (σ(⟨θ, z⟩)); an error for the other losses,
        which do not model probabilities."""
        return probabilities(self.loss, self.decision_many(X), f"{type(self).__name__}.predict_proba_many")

    def decision_many(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """The linear scores ⟨θ, z⟩ at the released parameters (z: clipped features, intercept)."""
        return self._features(X) @ self._prediction_params()

    def predict_one(self, x: NDArray[np.float64] | Mapping[str, Any]) -> float:
        """:meth:`predict_many` for one record (an array, or a mapping after :meth:`use_schema`)."""
        return float(self.predict_many(record_row(x, self.schema, f"{type(self).__name__}.predict_one"))[0])

    def predict_proba_one(self, x: NDArray[np.float64] | Mapping[str, Any]) -> float:
        """:meth:`predict_proba_many` for one record: P(y = 1) for the logistic loss (River's
        ``predict_proba_one`` gives a dict of classes; with labels ±1 this is its value for +1)."""
        return float(self.predict_proba_many(record_row(x, self.schema, f"{type(self).__name__}.predict_proba_one"))[0])

    @abc.abstractmethod
    def describe_noise(self) -> tuple[str, ...]:
        """Lines for ``panpriv privacy`` describing the noise this configuration adds (batches,
        standard deviations, clipping), computed from the public configuration only."""

    def beyond_plan(self, planned: int) -> str:
        """What learning past the ``planned`` stream length (the public ``n`` the learner was built
        for: ``horizon`` or ``n``) means for this learner, in one sentence for the service's
        warning. The default states what holds for every learner: the calibration and schedule
        were planned for ``planned`` records, and the statement printed is the learner's report
        for what it has learned. A learner with a rule for longer streams overrides it."""
        return (
            f"its calibration and schedule were planned for {planned:,} records; the guarantee printed is its "
            "report for the records it has learned. Set learner.n (--n) to the stream's length for a plan that covers it"
        )

    def utility_warnings(self) -> tuple[str, ...]:
        """Plain warnings about what this configuration can learn, from its public configuration
        only (never from data): ``panpriv run`` logs them before learning, ``panpriv privacy``
        prints them. Empty unless a learner knows its noise swamps the model."""
        return ()

    def _features(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        X_arr, _ = check_batch(type(self).__name__, X, None, self.dim)
        return self.loss.features(X_arr, self.feature_bound)

    def _prediction_params(self) -> NDArray[np.float64]:
        """The parameters predictions use: :meth:`release`, unless a learner's accounting depends on
        which parameters leave it (PNSGD overrides this with its last snapshot)."""
        return self.release()

    @abc.abstractmethod
    def release(self) -> NDArray[np.float64]:
        """The parameters a snapshot would publish now, computed from noisy state only."""

    @abc.abstractmethod
    def privacy(self) -> PrivacyReport:
        """The guarantee for everything released so far and for one intrusion."""

    def planned_privacy(self) -> PrivacyReport:
        """The weakest guarantee this learner can come to report over its planned use: every record
        of its horizon learned, under any pattern of snapshots, and one intrusion.

        The default is :meth:`privacy`, right for learners whose guarantee is fixed when they are
        built (it is the calibration target); a learner whose guarantee grows with records,
        rounds or releases overrides it. The service compares it with the requested δ before it
        learns anything (:mod:`panpriv.streamer.runtime.delta_target`).
        """
        return self.privacy()

    def _planned(self, output: Guarantee, intrusion: Guarantee) -> PrivacyReport:
        """:meth:`privacy`'s report with the planned guarantees, under :meth:`_report`'s rule for a
        seeded noise source (no intrusion guarantee)."""
        return dataclasses.replace(
            self.privacy(), output=output, intrusion=Guarantee.none() if self._noise.is_seeded else intrusion
        )

    def config(self) -> dict[str, Any]:
        """JSON-ready constructor arguments (without ``rng``), enough to rebuild the learner.

        Derived from the constructor's signature, never written by hand (River's ``_get_params``
        convention): every parameter is read from the attribute of the same name, a loss as its
        config dict. A learner that does not store a parameter under its name fails here, loudly.
        """
        config: dict[str, Any] = {}
        for name in constructor_parameters(type(self)):
            try:
                value = getattr(self, name)
            except AttributeError:
                raise TypeError(
                    f"{type(self).__name__} does not store its constructor argument {name!r} under that name"
                ) from None
            config[name] = value.config() if isinstance(value, Loss) else value
        return config

    @abc.abstractmethod
    def state_dict(self) -> dict[str, StateValue]:
        """Noisy internal state and counters only (never raw records, never generator state). Its
        arrays are copies the caller owns: a writer zeroes them once written (the service's
        checkpoint does), which must not touch the learner."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def checkpoint_state(self) -> dict[str, StateValue]:
        """The state to *persist* (a checkpoint): :meth:`state_dict`, unless a learner must change
        its noisy accumulators around a persisted copy so that two persisted states, or one and a
        later intrusion, never differ by a clean sum of records (pan-ftrl's open tree nodes). The
        service persists this and nothing else; :meth:`state_dict` stays the exact state (the
        conformance suite's round trips, what an intrusion reads)."""
        return self.state_dict()

    def resumed(self) -> None:
        """Hook: called once on a learner rebuilt from a persisted state, before it learns (see
        :meth:`checkpoint_state`). Default: nothing."""

    @property
    @abc.abstractmethod
    def records_seen(self) -> int:
        """Number of records processed so far."""

    @property
    def state_records(self) -> int:
        """Records that the state of :meth:`state_dict` has learned: :attr:`records_seen`, unless
        the learner saves only states at batch boundaries (:meth:`records_to_boundary`)."""
        return self.records_seen

    def records_to_boundary(self) -> int | None:
        """Records still to learn before :meth:`state_dict` is again the live state, or ``None``
        when it always is.

        A learner whose open batch carries one noise draw shared by every state inside the batch
        (``pan-acsa``'s Z_t) saves only states at batch boundaries: two states of one batch would
        differ by the exact clean sum of the records between them. Mid-batch its
        :meth:`state_dict` is the state at the last boundary, covering :attr:`state_records`
        records, and a caller that persists it (the service's checkpoint) also persists the input
        positions of that boundary and re-reads the records after it on a resume."""
        return None

    def snapshot(self) -> Snapshot:
        """Release the current parameters with the guarantee that covers them.

        Learners whose accounting depends on when parameters are released (PNSGD) override
        :meth:`_note_release` to record the release point; the report is taken after that.
        """
        params = np.array(self.release(), dtype=np.float64, copy=True)
        self._note_release()
        schema = self.schema
        model = ModelSpec(self.loss, self.dim, self.feature_bound, None if schema is None else schema.feature_names, schema)
        return Snapshot(self.name, self.state_records, params, self.privacy(), model)

    def _note_release(self) -> None:
        """Hook: called when a snapshot is released. Default: releases do not change accounting."""

    def _report(
        self, output: Guarantee, intrusion: Guarantee, assumptions: Sequence[str], references: Sequence[str]
    ) -> PrivacyReport:
        """The :class:`PrivacyReport` of this learner, under the rule every learner follows: with a
        seeded noise source (replay/testing mode) an intruder can predict the noise still to come,
        so there is no intrusion guarantee and the report says why (:data:`SEEDED_WARNING`).

        The one signature of the learners' reports: a learner family that shares assumptions or
        references (the PVEC learners, the message-SGD learners) overrides it, adds them and calls
        this one."""
        seeded = self._noise.is_seeded
        if seeded:
            assumptions = [*assumptions, SEEDED_WARNING]
        return PrivacyReport(
            mechanism=self.name,
            records=self.records_seen,
            output=output,
            intrusion=Guarantee.none() if seeded else intrusion,
            assumptions=tuple(assumptions),
            references=tuple(references),
        )

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Constructor arguments (without ``rng``) on which the catalogue's conformance test
        (``tests/protocols/test_catalogue.py``) runs :mod:`panpriv.protocols.checks` for this learner
        (River's ``_unit_test_params``). Small dimension, short horizons, a radius large enough
        that the noise is not hidden by projection. Every catalogued learner must provide them."""
        raise NotImplementedError(f"{cls.__name__} declares no unit_test_params(); the conformance test needs them")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Self:
        """A fresh learner from :meth:`config` output; ``kwargs`` (e.g. ``rng``) go to the constructor."""
        return cls(**dict(config), **kwargs)

    @classmethod
    def from_state_dict(cls, config: Mapping[str, Any], state: Mapping[str, StateValue], **kwargs: Any) -> Self:
        """Rebuild a learner from :meth:`config` and :meth:`state_dict` output.

        ``kwargs`` (e.g. ``rng``) are passed to the constructor; they are not part of the config. A
        config saved before an argument existed gets its :attr:`legacy_defaults` value.
        A seed (an ``int``) is refused for a state that has learned records: it would restart the
        noise stream from its beginning, so the resumed learner would add the very draws already
        added to what it released (an analyst comparing releases could cancel them). Resume with
        ``rng=None`` (OS entropy) or with the ``Generator`` that drew the noise so far.
        """
        learner = cls.from_config({**cls.legacy_defaults, **config}, **kwargs)
        learner.load_state_dict(state)
        rng = kwargs.get("rng")
        if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and learner.records_seen > 0:
            raise InvalidInputError(
                f"{cls.__name__}.from_state_dict: refusing to resume a state that has learned {learner.records_seen} "
                "records with a seed — the seed restarts the noise stream and would repeat draws already added to "
                "what was released; pass rng=None (OS entropy) or the Generator that drew the noise so far"
            )
        return learner


@functools.cache
def constructor_parameters(cls: type[Learner]) -> tuple[str, ...]:
    """The names of ``cls``'s constructor parameters that :meth:`Learner.config` records: all of
    them but ``self`` and ``rng`` (the noise source is never part of a configuration). A
    constructor that passes ``**kwargs`` on contributes its named parameters and its parent's.
    Kept per class: reading the signatures cost ~0.5 ms at every checkpoint (issue 37)."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        forwards = False
        for parameter in inspect.signature(vars(klass)["__init__"]).parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                forwards = True
            elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL and parameter.name not in ("self", "rng", *names):
                names.append(parameter.name)
        if not forwards:
            break
    return tuple(names)


@overload
def check_batch(
    owner: str, X: object, y: None, dim: int, row_squares: NDArray[np.float64] | None = None
) -> tuple[NDArray[np.float64], None]: ...


@overload
def check_batch(
    owner: str, X: object, y: object, dim: int, row_squares: NDArray[np.float64] | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]: ...


def check_batch(
    owner: str, X: object, y: object | None, dim: int, row_squares: NDArray[np.float64] | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """Validate a micro-batch and return float64 views (copies only where a conversion is needed).

    Raises :class:`InvalidInputError` naming the argument for a wrong shape, a length mismatch, or
    a non-finite value. Feature clipping is the loss's job (it knows the declared bound).

    ``row_squares`` (shape (m,), optional): filled with the rows' squared norms, and the finiteness
    of X is read from them — a NaN or ±inf in a row makes its sum of squares non-finite, and a
    finite sum has only finite terms — so a learner that needs the norms reads X once for both
    (the element-wise check runs only when some sum is not finite: an overflowing huge row).
    """
    X_arr = np.asarray(X, dtype=np.float64)
    if X_arr.ndim != 2 or X_arr.shape[1] != dim:
        raise InvalidInputError(f"{owner}: X must have shape (m, {dim}); got shape {X_arr.shape}")
    if row_squares is not None:
        np.einsum("ij,ij->i", X_arr, X_arr, out=row_squares[: X_arr.shape[0]])
        finite = bool(np.isfinite(row_squares[: X_arr.shape[0]]).all()) or bool(np.all(np.isfinite(X_arr)))
    else:
        finite = bool(np.all(np.isfinite(X_arr)))
    if not finite:
        raise InvalidInputError(f"{owner}: X contains NaN or infinite values")
    if y is None:
        return X_arr, None
    y_arr = np.asarray(y, dtype=np.float64)
    if y_arr.ndim != 1 or y_arr.shape[0] != X_arr.shape[0]:
        raise InvalidInputError(
            f"{owner}: y must have shape ({X_arr.shape[0]},) to match X; got shape {y_arr.shape}"
        )
    if not np.all(np.isfinite(y_arr)):
        raise InvalidInputError(f"{owner}: y contains NaN or infinite values")
    return X_arr, y_arr
