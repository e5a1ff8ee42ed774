"""A sensible value to suggest for a learner option that is missing or wrong (error messages only).

The suggestions are starting points that name the flag to set them with and the rule behind
them; none is computed from the data (a radius or step size read off the records would itself
leak them).
"""

from __future__ import annotations

HINTS: dict[str, str] = {
    "radius": "--radius R: a PUBLIC bound on the weights' norm chosen before seeing the data, e.g. R = sqrt(dim) "
              "for features scaled to [0, 1] (|theta_j| <= 1 per feature)",
    "eta": "--set eta=ETA: the step size, at most 2/beta for the loss's smoothness beta (logistic: "
           "beta = feature_bound^2 / 4, plus 1/4 with the intercept); unset, the learner plans r / (G sqrt(n))",
    "n": "--n N: the PUBLIC number of records the run will read",
    "horizon": "--n N: the PUBLIC number of records the run will read",
    "batch_size": "--set batch_size=B: records per noisy step",
}


def hint(option: str) -> str:
    """``" (--radius R: …)"`` for a known option, else ``""``."""
    text = HINTS.get(option)
    return f" ({text})" if text else ""
