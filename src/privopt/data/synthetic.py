"""``synthetic-groups``: a p-group Gaussian-mixture logistic-regression benchmark for worst-group rates.

Group ``i`` has its own direction ``mu_i = separation * (cos phi_i e_0 + sin phi_i e_1)`` with
angles ``phi_i`` spread evenly over ``[0, spread]`` degrees. A record of group ``i`` has a label
``y ~ Bernoulli(label_prior)`` and features ``x = (2y - 1) mu_i + noise * N(0, I_dim)``; for each
group alone the Bayes classifier is linear (logistic regression is well specified), but the groups
disagree on the direction, so one linear model trades their risks off and the worst group matters.

Features are divided by the public constant ``R = separation + noise * (sqrt(dim) + 3)`` and
records longer than 1 are scaled back to norm 1, then multiplied by ``max_norm``: every record has
``||x|| <= max_norm`` (the logistic loss is ``max_norm``-Lipschitz). The test split is drawn
independently, ``n_test_per_group`` records per group. See ``docs/data.md`` ("synthetic-groups").

Example:
    >>> from privopt.data import load_dataset
    >>> ds = load_dataset("synthetic-groups", num_groups=3, n_train=600, n_test_per_group=100)
    >>> ds.num_groups, ds.input_shape, len(ds.y_test)
    (3, (10,), 300)
    >>> bool(ds.x_train.norm(dim=1).max() <= 1.0 + 1e-6)
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privopt.data.dataset import Part, RawData
from privopt.data.public import PublicScaling
from privopt.data.registry import BuildContext, is_int, is_real, register_dataset
from privopt.errors import ConfigError

__all__ = ["group_means", "feature_radius"]


def group_means(*, num_groups: int, dim: int, separation: float, spread: float) -> np.ndarray:
    """``[num_groups, dim]`` class-1 means of the groups (class 0 is the negative)."""
    phi = np.deg2rad(np.linspace(0.0, spread, num_groups)) if num_groups > 1 else np.zeros(1)
    mu = np.zeros((num_groups, dim))
    mu[:, 0], mu[:, 1] = separation * np.cos(phi), separation * np.sin(phi)
    return mu


def feature_radius(*, dim: int, separation: float, noise: float) -> float:
    """The public constant features are divided by before clipping rows to norm 1."""
    return float(separation + noise * (np.sqrt(dim) + 3.0))


def _check(num_groups, dim, n_train, n_test_per_group, fractions, separation, noise, prior, max_norm) -> np.ndarray:
    ints = (
        ("num_groups", num_groups, 1),
        ("dim", dim, 2),
        ("n_train", n_train, 1),
        ("n_test_per_group", n_test_per_group, 1),
    )
    for key, v, lo in ints:
        if not (is_int(v) and v >= lo):
            raise ConfigError(f"synthetic-groups {key} must be an integer >= {lo}, got {v!r}")
    for key, v in (("separation", separation), ("noise", noise), ("max_norm", max_norm)):
        if not (is_real(v) and v > 0):
            raise ConfigError(f"synthetic-groups {key} must be a positive number, got {v!r}")
    if not (is_real(prior) and 0 < prior < 1):
        raise ConfigError(f"synthetic-groups label_prior must be in (0, 1), got {prior!r}")
    f = np.full(num_groups, 1.0 / num_groups) if fractions is None else np.asarray(fractions, dtype=np.float64)
    if f.shape != (num_groups,) or np.any(f <= 0) or abs(f.sum() - 1.0) > 1e-9:
        raise ConfigError(f"synthetic-groups group_fractions must be {num_groups} positive numbers summing to 1")
    return f


def _draw(rng: np.random.Generator, counts, mu, *, noise: float, prior: float, radius: float, max_norm: float):
    g = np.repeat(np.arange(len(counts)), counts)
    y = (rng.random(len(g)) < prior).astype(np.int64)
    x = (2 * y - 1)[:, None] * mu[g] + noise * rng.standard_normal((len(g), mu.shape[1]))
    x /= radius
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.maximum(norms, 1.0) * max_norm
    return Part(x, y, g)


@register_dataset("synthetic-groups", needs_files=False)
def _synthetic_groups(
    ctx: BuildContext,
    *,
    num_groups: int = 4,
    dim: int = 10,
    n_train: int = 4000,
    n_test_per_group: int = 2000,
    group_fractions: Sequence[float] | None = None,
    separation: float = 2.0,
    noise: float = 1.0,
    spread: float = 90.0,
    label_prior: float = 0.5,
    max_norm: float = 1.0,
) -> RawData:
    """p-group Gaussian-mixture logistic benchmark (worst-group rate checks); no files needed."""
    f = _check(num_groups, dim, n_train, n_test_per_group, group_fractions, separation, noise, label_prior, max_norm)
    mu = group_means(num_groups=num_groups, dim=dim, separation=separation, spread=spread)
    radius = feature_radius(dim=dim, separation=separation, noise=noise)
    counts = np.floor(f * n_train).astype(np.int64)
    counts[: n_train - counts.sum()] += 1  # rounding remainder to the first groups
    kw = dict(noise=noise, prior=label_prior, radius=radius, max_norm=max_norm)
    train = _draw(ctx.rng("synthetic-train"), counts, mu, **kw)
    test = _draw(ctx.rng("synthetic-test"), np.full(num_groups, n_test_per_group), mu, **kw)
    meta = {
        "source": {"format": "generated", "generator": "p-group Gaussian mixture, logistic labels"},
        "official_splits_present": ["train", "test"],
        "test_split": f"drawn independently: {n_test_per_group} records per group",
        "class_names": ["negative", "positive"],
        "group_names": [f"group {i}" for i in range(num_groups)],
        "group_sizes_train": counts.tolist(),
        "group_means": mu.tolist(),
        "feature_radius": radius,
        "preprocessing": [f"features / {radius:.6g} (public), rows longer than 1 scaled to norm 1, times {max_norm:g}"],
    }
    scaling = PublicScaling.box(
        np.full(dim, -float(max_norm)), np.full(dim, float(max_norm)),
        center=np.zeros(dim), scale=np.ones(dim), source=f"generator bound ||x|| <= {max_norm:g}",
    )  # fmt: skip
    return RawData(train, test, "tabular", 2, scaling, meta=meta)
