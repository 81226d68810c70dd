"""Membership scores: from the released noisy gradients (white-box) or the released model (black-box).

White-box (:class:`WhiteBoxScorer`): a release observer
(:func:`privopt.grads.release.observe_releases`) reads every released vector. In canary ``i``'s
coordinate, a release is ``(c·s + Z)`` on the noisy-sum scale, where ``Z ~ N(0, σ²)`` is the privacy
noise (σ = the release's noise std), ``s = ±1`` the canary's known sign, ``c`` the release's
per-record bound and ``c`` present only if the canary is in the data AND its batch sampled it
(rate ``q``). Normalised, ``y = s·value·normalizer/σ ~ N(μ·b, 1)`` with ``μ = c/σ`` and
``b ~ Bernoulli(q)`` for an included canary, ``b = 0`` otherwise. The score is the log-likelihood
ratio of "included" against "excluded" summed over releases,
``Σ log(1 − q + q·exp(μ·y − μ²/2))`` — the most powerful test of one canary's membership given
these observations (Neyman–Pearson). σ is the noise the run actually drew, measured in the
clock's coordinate, which no record's gradient reaches (so a release there is noise alone): a
mechanism that draws less noise than it declares is scored with the noise it drew. The score
reads only released values, public rates and bounds, and the public iterates (the clock).

Which releases carry a canary's gradient, and with which sign, follows from the algorithm's
release plan: a plain release (a fixed threshold) at every sampled step with the sign at the
current point; a difference release (step-proportional threshold, two points) only when the sign
flipped since the previous point, with the current sign. Other releases (scalars, statistics
with a combined bound) are not scored.

Black-box (:func:`black_box_scores`): the released model's preference for the canary's (wrong) label
over the input's true label, ``loss(true label) − loss(canary label)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from privopt.errors import ConfigError

__all__ = ["WhiteBoxScorer", "release_kinds", "inclusion_rate", "black_box_scores"]


def release_kinds(plan) -> dict[str, str]:
    """``{family: "gradient" | "difference" | "other"}`` from an algorithm's release plan."""
    from privopt.algorithms.releases import Fixed, StepProportional

    kinds: dict[str, str] = {}
    for phase in plan.phases if plan is not None else ():
        for q in phase.queries:
            sens = q.sensitivity
            if getattr(sens, "factor", 1.0) != 1.0:
                kinds[q.name] = "other"
            elif isinstance(sens, StepProportional):
                kinds[q.name] = "difference"
            elif isinstance(sens, Fixed):
                kinds[q.name] = "gradient"
            else:
                kinds[q.name] = "other"
    return kinds


def inclusion_rate(sampling) -> float:
    """Probability that one given record is in a batch drawn by ``sampling`` (public)."""
    kind = getattr(sampling, "kind", None)
    if kind in ("poisson", "full"):
        return float(sampling.rate)
    if kind == "single":
        return 1.0 / sampling.n
    if kind == "without_replacement":
        return sampling.batch_size / sampling.n
    raise ConfigError(f"cannot score releases made with sampling {sampling!r}")


def _log_likelihood_ratio(y: torch.Tensor, *, mu: float, rate: float) -> torch.Tensor:
    shifted = mu * y - 0.5 * mu * mu
    if rate >= 1.0:
        return shifted
    return torch.logaddexp(torch.full_like(y, np.log1p(-rate)), shifted + np.log(rate))


class WhiteBoxScorer:
    """A release observer scoring the gradient canaries of an :class:`~privopt.audit.canaries.AuditModel`
    or a :class:`~privopt.audit.canaries.LinearAuditModel`.

    Args:
        model: the audit model (its clock is read at each release, a public iterate, and it gives
            the sign of a canary's term in each kind of release).
        kinds: :func:`release_kinds` of the algorithm's release plan.

    After the run, :attr:`scores` holds one score per canary and :attr:`noise_ratio` the noise
    actually drawn relative to the noise the releases declare.
    """

    def __init__(self, model, kinds: dict[str, str]):
        self.model = model
        self.canaries = model.canaries
        self.offset = model.head_offset()
        self.clock_index = self.offset + self.canaries  # the coordinate after the canaries
        self.dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.kinds = kinds
        self.used: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self._clock: float | None = None
        self._prev_clock: float | None = None
        self._observations: list[tuple[torch.Tensor, float, float]] = []  # (y, mu, rate) per scored release
        self._clock_noise: list[float] = []

    def _advance_clock(self) -> None:
        now = self.model.clock()
        if self._clock is not None and now != self._clock:
            self._prev_clock = self._clock
        self._clock = now

    def _skip(self, name: str) -> None:
        self.skipped[name] = self.skipped.get(name, 0) + 1

    def __call__(self, event: Any) -> None:
        flat = event.value.detach().reshape(-1).to(torch.float64)
        if flat.numel() != self.dim or not event.noise_std > 0:  # scalar releases carry no canary coordinate
            self._skip(event.name)
            return
        self._advance_clock()
        scale = event.normalizer / event.noise_std  # to units of the declared noise std
        # No record has a gradient in the clock's coordinate: it holds the noise alone.
        self._clock_noise.append(float(flat[self.clock_index]) * scale)
        kind = self.kinds.get(event.name, "other")
        sign = 0.0 if kind == "other" else self.model.release_sign(kind, self._prev_clock, self._clock)
        if sign == 0.0:
            self._skip(event.name)
            return
        y = sign * flat[self.offset : self.offset + self.canaries] * scale
        self._observations.append((y, event.bound / event.noise_std, inclusion_rate(event.sampling)))
        self.used[event.name] = self.used.get(event.name, 0) + 1

    @property
    def noise_ratio(self) -> float:
        """Root-mean-square of the clock coordinate's noise in declared-std units: ≈ 1 when the
        releases draw the noise they declare (and account for), ≈ 0.1 when it is ten times smaller."""
        if not self._clock_noise:
            return float("nan")
        return float(np.sqrt(np.mean(np.square(self._clock_noise))))

    @property
    def scores(self) -> torch.Tensor:
        """Per-canary log-likelihood ratio, with the noise level the run actually drew (the
        measured :attr:`noise_ratio`, a function of the releases alone)."""
        total = torch.zeros(self.canaries, dtype=torch.float64)
        kappa = max(self.noise_ratio, 1e-6) if self._clock_noise else 1.0
        for y, mu, rate in self._observations:
            total += _log_likelihood_ratio(y / kappa, mu=mu / kappa, rate=rate)
        return total

    def summary(self) -> dict[str, Any]:
        """Releases scored and skipped, by family, and the measured noise ratio."""
        return {"scored": dict(self.used), "not_scored": dict(self.skipped), "noise_ratio": self.noise_ratio}


def black_box_scores(model, loss_fn, x: torch.Tensor, y: torch.Tensor, *, reference=None) -> np.ndarray:
    """Membership scores from the released model (higher = "more likely trained on"): the negative
    loss on each canary ``(x, y)``, or, with ``reference`` labels (the inputs' true labels), the
    log-odds ``loss(x, reference) − loss(x, y)``, which removes how hard each input is."""
    from privopt.eval.mia import attack_scores

    scores = attack_scores(model, loss_fn, x, y, score="loss")
    if reference is not None:
        scores = scores - attack_scores(model, loss_fn, x, reference, score="loss")
    return scores
