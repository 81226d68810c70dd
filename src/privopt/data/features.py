"""Fixed, data-independent feature extractors applied to every split of a :class:`Dataset`.

A feature map is public preprocessing: a function of one record alone, with public constants and
no trainable or data-fitted part, so a record's features depend on nothing but that record and DP
training on the features is DP for the records. ``apply_features(ds, "scattering")`` returns a new
dataset whose inputs are the features; train any model on it (a linear head: ``logreg``). Guide:
``docs/data.md``, "Fixed feature extractors".

Example:
    >>> import torch
    >>> from privopt.data import Dataset
    >>> ds = Dataset.from_tensors(torch.rand(6, 1, 8, 8), torch.tensor([0, 1] * 3), num_classes=2)
    >>> f = apply_features(ds, "scattering", J=1, cache=False)
    >>> f.input_shape, round(float(f.x_train[0].norm()), 4)
    ((144,), 1.0)
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from privopt.errors import ConfigError, DataError
from privopt.registry import Registry

__all__ = [
    "FeatureMap",
    "apply_features",
    "available_features",
    "feature_cache_dir",
    "features_of",
    "register_features",
]

_FEATURES: Registry[Callable[..., FeatureMap]] = Registry("feature map")
_CHUNK = 512  # records per transform call: bounds the memory of the intermediate wavelet maps


class FeatureMap:
    """A per-record feature extractor. Subclasses set ``name``/``params`` and implement ``transform``."""

    name: str = ""
    params: dict[str, Any]

    def transform(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """Features ``[N, D]`` of a batch ``[N, ...]``; row i depends on ``x[i]`` alone."""
        raise NotImplementedError

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.name}({args})"

    def cache_key(self) -> str:
        """What identifies the cached part of the map (default: the whole map, :meth:`describe`)."""
        return self.describe()

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """A cheap per-record step after the cache (float32 rows in, rows out; default: none)."""
        return x


def register_features(name: str) -> Callable:
    """Decorator registering ``factory(*, input_shape, **params) -> FeatureMap`` as ``name``."""
    return _FEATURES.register_as(name)


def available_features() -> list[str]:
    """Names accepted by :func:`apply_features` (``"none"`` keeps the inputs)."""
    import privopt.data.scattering  # noqa: F401  (registers the built-in maps)

    return ["none", *_FEATURES.names()]


def feature_cache_dir() -> Path:
    """Where computed features are cached: ``$PRIVOPT_CACHE/features`` (default ``~/.cache/privopt``).

    The cache holds transformed training records: it needs the same protection as the data
    itself (files are created readable by their owner only). It is never part of a run's outputs.
    """
    root = os.environ.get("PRIVOPT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "privopt")
    return Path(root) / "features"


def _record_keys(x: torch.Tensor) -> list[bytes]:
    """One content digest per record (its bytes, shape and dtype): the cache's per-record key."""
    flat = x.detach().cpu().contiguous().reshape(x.shape[0], -1).numpy()
    tag = str((tuple(x.shape[1:]), str(x.dtype))).encode()
    return [hashlib.blake2b(row.tobytes(), digest_size=16, key=tag[:64]).digest() for row in flat]


def _map_dir(fmap: FeatureMap) -> Path:
    return feature_cache_dir() / hashlib.blake2b(fmap.cache_key().encode(), digest_size=10).hexdigest()


def _cached_rows(folder: Path, keys: list[bytes]) -> dict[bytes, torch.Tensor]:
    """Features of the records in ``keys`` found in the cache blocks of ``folder``."""
    wanted, found = set(keys), {}
    for block in sorted(folder.glob("*.pt")) if folder.is_dir() else []:
        try:
            saved = torch.load(block, weights_only=True, mmap=True)
            raw = saved["keys"].numpy().tobytes()
            for i in range(len(raw) // 16):
                k = raw[16 * i : 16 * (i + 1)]
                if k in wanted and k not in found:
                    found[k] = saved["x"][i].clone()
        except (RuntimeError, OSError, EOFError, KeyError):
            block.unlink(missing_ok=True)  # a torn block: its records are recomputed
        if len(found) == len(wanted):
            break
    return found


def _store_block(folder: Path, keys: list[bytes], x: torch.Tensor) -> None:
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = hashlib.blake2b(b"".join(keys), digest_size=16).hexdigest()
    tmp = folder / f".{name}.tmp{os.getpid()}"
    key_tensor = torch.frombuffer(bytearray(b"".join(keys)), dtype=torch.uint8).reshape(len(keys), 16)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        torch.save({"keys": key_tensor, "x": x}, fh)
    os.replace(tmp, folder / f"{name}.pt")


def _compute(fmap: FeatureMap, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = torch.cat([fmap.transform(x[i : i + _CHUNK]) for i in range(0, x.shape[0], _CHUNK)])
    # Stored and returned at half precision, cached or not (so a cache hit changes nothing).
    out = out.to(torch.float16)
    if not torch.isfinite(out).all():
        raise DataError(f"feature map {fmap.describe()} produced non-finite features")
    return out


def _transform_split(fmap: FeatureMap, x: torch.Tensor, *, cache: bool) -> torch.Tensor:
    if x.shape[0] == 0:
        return _compute(fmap, x.new_zeros((1, *x.shape[1:])))[:0].to(torch.float32)
    if not cache:
        return _compute(fmap, x).to(torch.float32)
    keys, folder = _record_keys(x), _map_dir(fmap)
    found = _cached_rows(folder, keys)
    missing = [i for i, k in enumerate(keys) if k not in found]
    if missing:
        fresh = _compute(fmap, x[missing])
        new_keys = [keys[i] for i in missing]
        _store_block(folder, new_keys, fresh)
        found.update(zip(new_keys, fresh))
    return torch.stack([found[k] for k in keys]).to(torch.float32)


def _options(factory: Callable) -> list[str] | None:
    """The keyword options a factory declares (``None`` when it takes ``**params``: unknown)."""
    parameters = inspect.signature(factory).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.name != "input_shape"]


def build_feature_map(name: str, *, input_shape: tuple[int, ...], **params: Any) -> FeatureMap:
    """The registered feature map ``name`` for inputs of ``input_shape`` (one record)."""
    available = available_features()
    if name not in _FEATURES:
        raise ConfigError(f"unknown feature map {name!r}; available: {', '.join(available)}")
    factory = _FEATURES.lookup(name)
    options = _options(factory)
    unknown = sorted(set(params) - set(options)) if options is not None else []
    if unknown:
        raise ConfigError(
            f"feature map {name!r}: unknown option(s) {unknown}; its options: {', '.join(options)} "
            "(and scale, for any map)"
        )
    try:
        return factory(input_shape=tuple(input_shape), **params)
    except TypeError as e:
        raise ConfigError(f"feature map {name!r}: {e}") from None


def apply_features(dataset: Any, name: str | None, *, cache: bool = True, scale: float = 1.0, **params: Any) -> Any:
    """``dataset`` with every split's inputs replaced by the features ``name`` (``None``/``"none"``: unchanged).

    Args:
        dataset: a :class:`~privopt.data.Dataset`.
        name: a registered feature map (:func:`available_features`).
        cache: reuse / store the features in :func:`feature_cache_dir` (keyed by a hash of the
            inputs and the map's parameters).
        scale: a public constant multiplying every feature, applied after the map and the cache
            (the scattering rows have unit norm; a linear head trains better on rows of norm ~√D,
            Tramèr & Boneh's per-feature unit scale, see ``docs/data.md``).
        **params: the map's options (e.g. ``J``, ``L`` for ``scattering``).

    Raises:
        ConfigError: unknown map or option, or inputs the map cannot take.
    """
    _check_scale(scale)
    if name in (None, "none"):
        if params or scale != 1.0:
            given = sorted([*params, *(["scale"] if scale != 1.0 else [])])
            raise ConfigError(f"feature options {given} given without a feature map")
        return dataset
    fmap = build_feature_map(name, input_shape=tuple(dataset.input_shape), **params)
    splits = {f: _features(fmap, getattr(dataset, f), cache=cache, scale=scale) for f in ("x_train", "x_val", "x_test")}
    meta = dict(dataset.meta)
    public = dict(meta.get("public", {}))
    scaled = "" if scale == 1.0 else f" x {float(scale):g}"
    public["features"] = (
        f"{fmap.describe()}{scaled}: a fixed per-record transform with public constants (no statistic of the data)"
    )
    meta["public"] = public
    return dataclasses.replace(dataset, **splits, input_shape=tuple(splits["x_train"].shape[1:]), meta=meta)


def _check_scale(scale: Any) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ConfigError(f"feature scale must be a finite number > 0, got {scale!r}")


def _features(fmap: FeatureMap, x: torch.Tensor, *, cache: bool, scale: float) -> torch.Tensor:
    return fmap.finish(_transform_split(fmap, x, cache=cache)) * float(scale)


def features_of(x: torch.Tensor, name: str, *, scale: float = 1.0, **params: Any) -> torch.Tensor:
    """The features ``name`` of the records ``x`` (``[N, ...]``), as :func:`apply_features` computes
    them for one split, without the cache (new records to score are not stored).

    Example:
        >>> import torch
        >>> features_of(torch.rand(2, 1, 8, 8), "scattering", J=1).shape
        torch.Size([2, 144])
    """
    _check_scale(scale)
    params.pop("cache", None)  # a run's cache option: how its splits were stored, not what they are
    fmap = build_feature_map(name, input_shape=tuple(x.shape[1:]), **params)
    return _features(fmap, x, cache=False, scale=scale)
