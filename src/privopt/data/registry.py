"""Dataset registry and the generic loading pipeline shared by every dataset.

A dataset is a *builder* registered under a name with its options and their defaults. The builder
reads its files (through a :class:`BuildContext`), makes sure a test split exists
(:meth:`BuildContext.with_test`) and applies its task transform (binarisation, imbalance, class
selection). :func:`load_dataset` then runs the same steps for everyone:

1. carve a validation split from the training split (stratified, ``val_fraction``);
2. cap the training split at ``max_train`` records (stratified subsample, keeps class ratios);
3. scale features with statistics of the (final) training split only;
4. convert to tensors and record provenance in ``meta``.

Every random choice uses its own generator derived from ``(seed, stage)``, so the same seed gives
the same splits, and changing e.g. ``max_train`` does not reshuffle the test split.
"""

from __future__ import annotations

import inspect
import os
import warnings
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privopt.data.dataset import Dataset, RawData
from privopt.data.splits import label_histogram, stratified_split, stratified_subsample
from privopt.errors import ConfigError, DataError

__all__ = [
    "register_dataset",
    "available_datasets",
    "dataset_options",
    "describe_datasets",
    "load_dataset",
    "resolve_data_dir",
    "BuildContext",
    "DEFAULT_TEST_FRACTION",
]

DEFAULT_TEST_FRACTION = 0.2
DATA_ENV = "PRIVOPT_DATA"


@dataclass(frozen=True)
class _Spec:
    name: str
    builder: Callable[..., RawData]
    options: dict[str, Any]
    needs_files: bool
    description: str


_DATASETS: dict[str, _Spec] = {}


def register_dataset(name: str, *, needs_files: bool = True) -> Callable:
    """Decorator registering ``builder(ctx, **options) -> RawData`` under ``name``.

    The builder's keyword-only parameters (with their defaults) are the dataset's options; any
    other option passed to :func:`load_dataset` is rejected with :class:`ConfigError`.
    ``needs_files=False`` marks datasets embedded in a library (no ``data_dir`` needed).
    """

    def deco(fn: Callable[..., RawData]) -> Callable[..., RawData]:
        if name in _DATASETS:
            raise ConfigError(f"dataset {name!r} is already registered")
        params = inspect.signature(fn).parameters.values()
        opts = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        doc = (inspect.getdoc(fn) or "").split("\n")[0]
        _DATASETS[name] = _Spec(name, fn, opts, needs_files, doc)
        return fn

    return deco


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_dataset`."""
    _ensure_builtin()
    return sorted(_DATASETS)


def dataset_options(name: str) -> dict[str, Any]:
    """The dataset-specific options of ``name`` and their defaults."""
    return dict(_spec(name).options)


def describe_datasets() -> dict[str, dict[str, Any]]:
    """``{name: {"description", "needs_files", "options"}}`` for every registered dataset (for CLIs/docs)."""
    _ensure_builtin()
    return {
        n: {"description": s.description, "needs_files": s.needs_files, "options": dict(s.options)}
        for n, s in sorted(_DATASETS.items())
    }


def _spec(name: str) -> _Spec:
    _ensure_builtin()
    try:
        return _DATASETS[name]
    except KeyError:
        raise ConfigError(f"unknown dataset {name!r}; available: {', '.join(sorted(_DATASETS))}") from None


def _ensure_builtin() -> None:
    # Builders register on import; importing here avoids a cycle with privopt.data.builtin.
    import privopt.data.builtin  # noqa: F401


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """``data_dir`` if given, else ``$PRIVOPT_DATA``; must be an existing directory.

    Raises:
        DataError: neither is set, or the directory does not exist.
    """
    if data_dir is None:
        env = os.environ.get(DATA_ENV)
        if not env:
            raise DataError(f"no data directory: pass data_dir=... or set the {DATA_ENV} environment variable")
        data_dir = env
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DataError(f"data directory {path} does not exist (or is not a directory)")
    return path


class BuildContext:
    """Handed to dataset builders: file lookup, seeded generators and test-split carving."""

    def __init__(self, *, name: str, data_dir: str | os.PathLike | None, seed: int, test_fraction: float | None):
        self.name = name
        self._data_dir = data_dir
        self.seed = seed
        self.test_fraction = test_fraction

    def rng(self, stage: str) -> np.random.Generator:
        """A generator that depends only on ``(seed, stage)``."""
        return np.random.default_rng([self.seed, zlib.crc32(stage.encode())])

    def dataset_dir(self, folders: Iterable[str], *, expected: str) -> Path:
        """The first existing ``data_dir/<folder>``; ``expected`` describes the files for the error."""
        root = resolve_data_dir(self._data_dir)
        tried = [root / f for f in folders]
        for p in tried:
            if p.is_dir():
                return p
        raise DataError(
            f"dataset {self.name!r}: no folder for it under {root} (tried {', '.join(str(t) for t in tried)}); "
            f"expected {expected}"
        )

    @staticmethod
    def find(folder: Path, names: Iterable[str]) -> Path | None:
        """The first of ``names`` (or ``name.gz``) present in ``folder``."""
        for n in names:
            for cand in (folder / n, folder / f"{n}.gz"):
                if cand.is_file():
                    return cand
        return None

    def with_test(self, raw: RawData) -> RawData:
        """Ensure ``raw.test`` exists: keep an official test split, else carve one (stratified, seeded).

        With an official test split an explicit ``test_fraction`` is not applied (a warning says so
        and ``meta["test_split"]`` records it); without one, ``test_fraction`` (default 0.2) of the
        only available split becomes the test split.
        """
        if raw.test is not None:
            raw.meta.setdefault("test_split", "official test split")
            if self.test_fraction is not None:
                warnings.warn(
                    f"dataset {self.name!r} has an official test split; "
                    f"test_fraction={self.test_fraction} is not applied",
                    stacklevel=3,
                )
                raw.meta["test_fraction_ignored"] = self.test_fraction
            return raw
        frac = DEFAULT_TEST_FRACTION if self.test_fraction is None else self.test_fraction
        keep, held = stratified_split(raw.train.y, frac, self.rng("test-split"))
        raw.meta["test_split"] = (
            f"carved: {frac:g} of the {len(raw.train)} available records (stratified by label, seed {self.seed}); "
            f"the rest is the training pool"
        )
        raw.test, raw.train = raw.train.take(held), raw.train.take(keep)
        return raw


def _check_fraction(name: str, value: Any, *, allow_none: bool, allow_zero: bool) -> None:
    if value is None and allow_none:
        return
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (0 <= value < 1 if allow_zero else 0 < value < 1)
    )
    if not ok:
        rng = "[0, 1)" if allow_zero else "(0, 1)"
        raise ConfigError(f"{name} must be a number in {rng}{' or None' if allow_none else ''}, got {value!r}")


def load_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    val_fraction: float = 0.0,
    test_fraction: float | None = None,
    standardize: bool = True,
    max_train: int | None = None,
    **options: Any,
) -> Dataset:
    """Load a registered dataset with seeded, deterministic splits.

    Args:
        name: registry name (see :func:`available_datasets`).
        data_dir: folder holding one sub-folder per dataset (``mnist/``, ``cifar10/`` ...);
            defaults to ``$PRIVOPT_DATA``. Not needed for embedded datasets (``digits``,
            ``breast-cancer``, ``digits-st``).
        seed: seed of every random choice (carved splits, subsampling, imbalance).
        val_fraction: share of the training split moved to a validation split (stratified).
        test_fraction: share carved as test split when the data directory holds only one split
            (default 0.2); ignored (with a warning) when an official test split exists.
        standardize: standardise features with training-split statistics (per channel for
            images, per feature for tabular data). Images are first scaled to [0, 1].
        max_train: cap the training split (stratified subsample, after the validation split).
        **options: dataset-specific options (see :func:`dataset_options`), e.g. ``imratio``.

    Returns:
        A :class:`Dataset`.

    Raises:
        ConfigError: unknown dataset or option, or an invalid value.
        DataError: files missing or corrupt.

    Example:
        >>> ds = load_dataset("digits-st", seed=0, imratio=0.1)
        >>> ds.num_classes, ds.input_shape
        (2, (1, 8, 8))
        >>> round(float(ds.y_train.float().mean()), 2)
        0.1
    """
    spec = _spec(name)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        allowed = ", ".join(sorted(spec.options)) or "none"
        raise ConfigError(f"unknown option(s) {unknown} for dataset {name!r}; its options: {allowed}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    _check_fraction("val_fraction", val_fraction, allow_none=False, allow_zero=True)
    _check_fraction("test_fraction", test_fraction, allow_none=True, allow_zero=False)
    if max_train is not None and (
        isinstance(max_train, bool) or not isinstance(max_train, (int, np.integer)) or max_train < 1
    ):
        raise ConfigError(f"max_train must be a positive integer or None, got {max_train!r}")

    ctx = BuildContext(name=name, data_dir=data_dir, seed=int(seed), test_fraction=test_fraction)
    raw = spec.builder(ctx, **{**spec.options, **options})
    if raw.test is None:
        raw = ctx.with_test(raw)
    return _finish(
        raw, ctx=ctx, val_fraction=float(val_fraction), max_train=max_train, standardize=standardize,
        options={**spec.options, **options},
    )  # fmt: skip


def _finish(raw: RawData, *, ctx: BuildContext, val_fraction: float, max_train, standardize: bool, options) -> Dataset:
    meta = dict(raw.meta)
    train, test = raw.train, raw.test
    val = train.take(np.zeros(0, dtype=np.int64))
    if val_fraction > 0:
        keep, held = stratified_split(train.y, val_fraction, ctx.rng("val-split"))
        train, val = train.take(keep), train.take(held)
        meta["val_split"] = f"carved: {val_fraction:g} of the training split (stratified by label, seed {ctx.seed})"
    if max_train is not None and max_train < len(train):
        before = len(train)
        train = train.take(stratified_subsample(train.y, int(max_train), ctx.rng("max-train")))
        meta["max_train"] = (
            f"training split subsampled from {before} to {len(train)} records (stratified, seed {ctx.seed})"
        )

    # In-place arithmetic below: full CIFAR-10 is 600 MB as float32, so avoid extra copies.
    xs = {k: p.x.astype(np.float32) for k, p in (("train", train), ("val", val), ("test", test))}
    if raw.x_scale != 1.0:
        for x in xs.values():
            x /= np.float32(raw.x_scale)
    for k, x in xs.items():
        if not np.isfinite(x).all():
            raise DataError(f"dataset {ctx.name!r}: non-finite feature values in the {k} split")
    prep = list(meta.pop("preprocessing", []))
    if raw.x_scale != 1.0:
        prep.append(f"features divided by {raw.x_scale:g}")
    axes = (0, 2, 3) if raw.kind == "image" else (0,)
    if raw.scaling == "minmax_unit_norm":
        lo, hi = xs["train"].min(axis=0), xs["train"].max(axis=0)
        span = np.where(hi > lo, hi - lo, 1.0).astype(np.float32)
        for k in xs:
            # Clip val/test into the training range so the unit-norm bound holds for every split.
            m = np.clip((xs[k] - lo) / span, 0.0, 1.0).reshape(xs[k].shape[0], int(np.prod(xs[k].shape[1:])))
            norms = np.linalg.norm(m, axis=1, keepdims=True)
            xs[k] = (m / np.where(norms > 0, norms, 1.0)).reshape(xs[k].shape).astype(np.float32)
        prep.append(
            "min-max scaled to [0, 1] with training min/max (val/test clipped), then rows scaled to unit L2 norm"
        )
        if standardize:
            prep.append("standardize=True not applied: unit_norm scaling replaces it")
    elif standardize:
        mean = xs["train"].mean(axis=axes, keepdims=True, dtype=np.float64)
        std = xs["train"].std(axis=axes, keepdims=True, dtype=np.float64)
        const = std < 1e-12
        std = np.where(const, 1.0, std)
        for x in xs.values():
            x -= mean.astype(np.float32)
            x /= std.astype(np.float32)
        unit = "channel" if raw.kind == "image" else "feature"
        prep.append(
            f"standardised per {unit} with training-split mean/std"
            + (f" ({int(const.sum())} constant {unit}s left centred only)" if const.any() else "")
        )
        meta["standardization"] = {"mean": mean.ravel().tolist(), "std": std.ravel().tolist()}
    meta["preprocessing"] = prep

    k = raw.num_classes
    parts = {"train": train, "val": val, "test": test}
    for s, p in parts.items():
        if len(p) and (p.y.min() < 0 or p.y.max() >= k):
            raise DataError(f"dataset {ctx.name!r}: {s} labels outside 0..{k - 1}")
    meta.update(
        name=ctx.name,
        seed=ctx.seed,
        options=_jsonable(options),
        splits={s: len(p) for s, p in parts.items()},
        label_histogram={s: label_histogram(p.y, k) for s, p in parts.items()},
    )
    has_groups = train.g is not None
    if has_groups:
        ng = len(meta.get("group_names", ())) or int(max(p.g.max() for p in parts.values() if len(p)) + 1)
        meta["group_histogram"] = {s: label_histogram(p.g, ng) for s, p in parts.items()}

    def t(a, dtype):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)

    return Dataset(
        name=ctx.name,
        x_train=torch.from_numpy(xs["train"]), y_train=t(train.y, torch.int64),
        x_val=torch.from_numpy(xs["val"]), y_val=t(val.y, torch.int64),
        x_test=torch.from_numpy(xs["test"]), y_test=t(test.y, torch.int64),
        num_classes=k,
        input_shape=tuple(int(d) for d in train.x.shape[1:]),
        g_train=t(train.g, torch.int64) if has_groups else None,
        g_val=t(val.g, torch.int64) if has_groups else None,
        g_test=t(test.g, torch.int64) if has_groups else None,
        meta=meta,
    )  # fmt: skip


def _jsonable(options: dict) -> dict:
    out = {}
    for key, v in options.items():
        out[key] = list(v) if isinstance(v, (tuple, range)) else v
    return out
