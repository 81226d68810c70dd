"""The scattering transform as a fixed feature extractor (``apply_features(ds, "scattering")``).

A 2-D wavelet scattering transform (Mallat; computed by kymatio) — cascades of Morlet wavelet
convolutions and moduli with a final low-pass — maps an image to translation-stable features
without learning anything. Tramèr & Boneh ("Differentially private learning needs better
features (or much more data)", ICLR 2021) showed that a linear model on these features is a
strong DP baseline on MNIST, Fashion-MNIST and CIFAR-10. privopt normalises each record's
features by itself (group normalisation without learned parameters, then unit Euclidean norm):
their data normalisation would use training-set statistics. Guide: ``docs/data.md``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from privopt.data.features import FeatureMap, register_features
from privopt.errors import ConfigError

__all__ = ["ScatteringFeatures"]


@functools.cache
def _scattering_class() -> Any:
    """kymatio's Scattering2D (torch frontend).

    kymatio 0.3.0 imports ``scipy.special.sph_harm`` for its 3-D transform at package import;
    SciPy 1.17 removed that name (kymatio issue #1068, unreleased fix). The 2-D transform never
    uses it, so a placeholder that refuses to run is bound only while kymatio imports.
    """
    import scipy.special

    missing = not hasattr(scipy.special, "sph_harm")
    if missing:

        def _unavailable(*_a: Any, **_k: Any) -> Any:
            raise RuntimeError("scipy.special.sph_harm is not available in this SciPy (kymatio 3-D scattering)")

        scipy.special.sph_harm = _unavailable
    try:
        from kymatio.torch import Scattering2D
    except ImportError as e:
        raise ConfigError(f"the scattering features need kymatio (pip install kymatio): {e}") from None
    finally:
        if missing:
            del scipy.special.sph_harm
    return Scattering2D


class ScatteringFeatures(FeatureMap):
    """Scattering coefficients of order ≤ 2 at scale ``2**J`` with ``L`` orientations, per-record normalised.

    An image ``(C, H, W)`` gives ``C·K`` channels of size ``(H/2^J, W/2^J)`` with
    ``K = 1 + J·L + L²·J(J−1)/2`` (81 for J = 2, L = 8), flattened.
    """

    name = "scattering"

    def __init__(
        self, *, input_shape: tuple[int, ...], J: int = 2, L: int = 8, groups: int = 27, pool: int | None = None
    ):
        if len(input_shape) != 3:
            raise ConfigError(f"scattering features need image inputs (C, H, W), got input_shape {input_shape}")
        for key, v in (("J", J), ("L", L), ("groups", groups), ("pool", 1 if pool is None else pool)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"scattering option {key} must be a positive integer, got {v!r}")
        c, h, w = input_shape
        if min(h, w) < 2**J:
            raise ConfigError(f"scattering J={J} needs images of at least {2**J}x{2**J}, got {h}x{w}")
        self._base = {"J": J, "L": L, "groups": groups}
        self.params = self._base if pool is None else {**self._base, "pool": pool}
        self._op = _scattering_class()(J=J, shape=(h, w), L=L)
        self._channels = c * (1 + J * L + L * L * J * (J - 1) // 2)
        self._maps = (h // 2**J, w // 2**J)
        if pool is not None and pool > min(self._maps):
            raise ConfigError(f"scattering pool={pool} exceeds the {self._maps[0]}x{self._maps[1]} maps of J={J}")
        self._pool = pool
        self._groups = math.gcd(groups, self._channels)  # a divisor of the channel count

    def cache_key(self) -> str:
        # Pooling runs after the cache: pooled and unpooled features share the cached coefficients.
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in sorted(self._base.items()))})"

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """Average-pool each channel's map to ``pool × pool`` (fewer coordinates, each less noisy to
        learn under DP), then unit norm again; nothing without ``pool``."""
        if self._pool is None:
            return x
        if x.shape[0] == 0:
            return x.new_zeros((0, self._channels * self._pool**2))
        maps = x.reshape(x.shape[0], self._channels, *self._maps)
        out = torch.nn.functional.adaptive_avg_pool2d(maps, self._pool).reshape(x.shape[0], -1)
        return out / out.norm(dim=1, keepdim=True).clamp_min(1e-12)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        s = self._op(x.to(torch.float32).contiguous())  # [N, C, K, H', W']
        s = s.reshape(s.shape[0], self._groups, -1)
        s = (s - s.mean(dim=2, keepdim=True)) / (s.std(dim=2, keepdim=True) + 1e-5)
        s = s.reshape(s.shape[0], -1)
        return s / s.norm(dim=1, keepdim=True).clamp_min(1e-12)


@register_features("scattering")
def scattering(
    *, input_shape: tuple[int, ...], J: int = 2, L: int = 8, groups: int = 27, pool: int | None = None
) -> FeatureMap:
    """The scattering transform (options ``J`` = 2, ``L`` = 8, ``groups`` = 27, ``pool`` = none)."""
    return ScatteringFeatures(input_shape=input_shape, J=J, L=L, groups=groups, pool=pool)
