"""The DRO reproductions' datasets: names, loading options and Paper A's δ rule.

Re-exported by :mod:`privopt.experiments.dro_protocol` (the protocol as a whole).
"""

from __future__ import annotations

from typing import Any

from privopt.errors import ConfigError

__all__ = ["DRO_DATASETS", "load_dro_dataset", "paper_delta"]

# CLI dataset name -> (registry name, options). CIFAR10-ST uses the share 100/5000 = 0.02 so it is
# exact on full CIFAR-10 and still meaningful on a subset.
DRO_DATASETS: dict[str, tuple[str, dict[str, Any]]] = {
    "mnist-st": ("mnist-st", {}),
    "fashion-mnist": ("fashion-mnist", {}),
    "cifar10-st": ("cifar10-st", {"minority_count": None, "minority_fraction": 0.02}),
    "celeba": ("celeba", {}),
    "digits-st": ("digits-st", {}),
}


def load_dro_dataset(
    name: str,
    *,
    data_dir=None,
    seed: int = 0,
    val_fraction: float = 0.0,
    max_train: int | None = None,
    features: str | None = None,
    feature_params: dict[str, Any] | None = None,
):
    """Load one of :data:`DRO_DATASETS` with the reproduction's options.

    ``features`` names a fixed feature map applied to every split (image data only; e.g.
    ``"scattering"``, see :func:`privopt.data.features.apply_features`); tabular data is unchanged.

    Example:
        >>> ds = load_dro_dataset("digits-st", seed=0)
        >>> ds.num_classes
        2
    """
    from privopt.data import load_dataset

    if name not in DRO_DATASETS:
        raise ConfigError(f"unknown DRO dataset {name!r}; choose from {', '.join(DRO_DATASETS)}")
    reg, opts = DRO_DATASETS[name]
    data = load_dataset(reg, data_dir=data_dir, seed=seed, val_fraction=val_fraction, max_train=max_train, **opts)
    if features is None or len(data.input_shape) != 3:
        return data
    from privopt.data.features import apply_features

    return apply_features(data, features, **(feature_params or {}))


def paper_delta(n: int) -> float:
    """Paper A's δ = 1/n^1.1 for ``n`` training records."""
    return float(n) ** -1.1
