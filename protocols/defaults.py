"""The defaults every learner shares, in one place: a module of constants that imports nothing, so
the service's configuration (:class:`panpriv.streamer.config.LearnerConfig`) reads the same values
without loading a learner.

The rules that depend on a learner's own settings — the radius √d
(:func:`panpriv.protocols.base.default_radius`), the intercept of a loss named without one
(:func:`panpriv.protocols.losses.learner_loss`), a step size or a plan — live beside the code that
applies them; each constructor's docstring states its own.
"""

from __future__ import annotations

DEFAULT_EPSILON = 1.0
"""ε of a learner built without one — and of ``panpriv run`` without ``--epsilon``."""

DEFAULT_DELTA = 1e-6
"""δ of a learner built without one (PNSGD: its pan floor) — and of ``panpriv run`` without ``--delta``."""

DEFAULT_LOSS = "logistic"
"""The loss of a learner built without one (the service's ``learner.options.loss`` unset)."""
