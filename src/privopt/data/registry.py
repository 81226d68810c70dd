"""Dataset registry and the generic loading pipeline shared by every dataset.

A dataset is a *builder* registered under a name with its options and their defaults. The builder
reads its files (through a :class:`BuildContext`), makes sure a test split exists
(:meth:`BuildContext.with_test`) and applies its task transform (binarisation, imbalance, class
selection). :func:`load_dataset` then runs the same steps for everyone:

1. carve a validation split from the training split (``val_fraction``);
2. thin the training split (``train_fraction``) and/or cap it (``max_train``);
3. scale features with PUBLIC constants (``scaling``; see :mod:`privopt.data.preprocess`);
4. convert to tensors; public facts go to ``meta["public"]``, exact statistics of the records to
   ``meta["private"]``.

Every selection is decided per record by a keyed hash of the record's content (stage and public
``seed`` as key), so one record added or removed changes each split by at most that record; see
``docs/data.md`` ("Selection and the protected unit").
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

from privopt.data.dataset import Dataset, Part, RawData
from privopt.data.preprocess import check_mode
from privopt.data.splits import carve
from privopt.errors import ConfigError, DataError, PrivoptDeprecationWarning, PrivoptWarning, close_name
from privopt.registry import Registry

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


_DATASETS: Registry[_Spec] = Registry("dataset")


def register_dataset(name: str, *, needs_files: bool = True) -> Callable:
    """Decorator registering ``builder(ctx, **options) -> RawData`` under ``name``.

    The builder's keyword-only parameters (with their defaults) are the dataset's options; any
    other option passed to :func:`load_dataset` is rejected with :class:`ConfigError`.
    ``needs_files=False`` marks datasets embedded in a library (no ``data_dir`` needed).
    """

    def deco(fn: Callable[..., RawData]) -> Callable[..., RawData]:
        params = inspect.signature(fn).parameters.values()
        opts = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        doc = (inspect.getdoc(fn) or "").split("\n")[0]
        _DATASETS.add(name, _Spec(name, fn, opts, needs_files, doc))
        return fn

    return deco


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_dataset`."""
    _ensure_builtin()
    return list(_DATASETS.names())


def dataset_options(name: str) -> dict[str, Any]:
    """The dataset-specific options of ``name`` and their defaults."""
    return dict(_spec(name).options)


def describe_datasets() -> dict[str, dict[str, Any]]:
    """``{name: {"description", "needs_files", "options"}}`` for every registered dataset (for CLIs/docs)."""
    _ensure_builtin()
    return {
        n: {"description": s.description, "needs_files": s.needs_files, "options": dict(s.options)}
        for n, s in _DATASETS.entries().items()
    }


OWN_DATA_HINT = (
    "for your own CSV file use dataset csv with its columns declared in dataset_params (docs/data.md, 'Your own "
    "CSV file from the command line'); for arrays build a privopt.data.Dataset in Python and pass it to "
    "privopt.fit or train(dataset=...) (docs/data.md, 'Bring your own data')"
)


def _spec(name: str) -> _Spec:
    _ensure_builtin()
    if not isinstance(name, str) or name not in _DATASETS:  # a path or a typo: say how to use one's own data
        raise ConfigError(f"unknown dataset {name!r}; available: {', '.join(_DATASETS.names())}; {OWN_DATA_HINT}")
    return _DATASETS.lookup(name)


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
        where = "" if path.is_absolute() else f" ({Path.cwd().joinpath(path).resolve()}, from the current directory)"
        raise DataError(f"data directory {path}{where} does not exist (or is not a directory)")
    return path


class BuildContext:
    """Handed to dataset builders: file lookup, per-record selection, seeded generators, test carving."""

    def __init__(self, *, name: str, data_dir: str | os.PathLike | None, seed: int, test_fraction: float | None):
        self.name = name
        self._data_dir = data_dir
        self.seed = seed
        self.test_fraction = test_fraction

    def rng(self, stage: str) -> np.random.Generator:
        """A generator that depends only on ``(seed, stage)`` (for generating synthetic data, not for selection)."""
        return np.random.default_rng([self.seed, zlib.crc32(stage.encode())])

    def carve(self, part: Part, fraction: float, stage: str) -> tuple[Part, Part]:
        """``(kept, held_out)`` by per-record keyed coins (see :func:`privopt.data.splits.carve`)."""
        return carve(part, fraction, seed=self.seed, stage=stage)

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
        """Ensure ``raw.test`` exists: keep an official test split, else carve one per record.

        With an official test split an explicit ``test_fraction`` is not applied (a warning says so
        and the public metadata records it); without one, each record of the only available split
        goes to the test split with probability ``test_fraction`` (default 0.2), decided by its
        keyed hash.
        """
        if raw.test is not None:
            raw.meta.setdefault("test_split", "official test split")
            if self.test_fraction is not None:
                warnings.warn(
                    f"dataset {self.name!r} has an official test split; "
                    f"test_fraction={self.test_fraction} is not applied",
                    PrivoptWarning,
                    stacklevel=3,
                )
                raw.meta["test_fraction_ignored"] = self.test_fraction
            return raw
        frac = DEFAULT_TEST_FRACTION if self.test_fraction is None else self.test_fraction
        raw.train, raw.test = self.carve(raw.train, frac, "test")
        raw.per_record(f"test carve: test_fraction {frac:g}")
        raw.meta["test_split"] = (
            f"carved per record: each record of the available data goes to the test split with probability "
            f"{frac:g} (keyed hash of its content, seed {self.seed}); the rest is the training pool"
        )
        return raw


def is_int(value: Any) -> bool:
    """A Python/NumPy integer that is not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite int/float that is not a bool."""
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and bool(np.isfinite(value))
    )


def _check_fraction(name: str, value: Any, *, allow_none: bool, allow_zero: bool) -> None:
    if value is None and allow_none:
        return
    ok = is_real(value) and (0 <= value < 1 if allow_zero else 0 < value < 1)
    if not ok:
        rng = "[0, 1)" if allow_zero else "(0, 1)"
        raise ConfigError(f"{name} must be a number in {rng}{' or None' if allow_none else ''}, got {value!r}")


def _check_arguments(seed, val_fraction, test_fraction, train_fraction, max_train) -> None:
    if not is_int(seed) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
    _check_fraction("val_fraction", val_fraction, allow_none=False, allow_zero=True)
    _check_fraction("test_fraction", test_fraction, allow_none=True, allow_zero=False)
    _check_fraction("train_fraction", train_fraction, allow_none=True, allow_zero=False)
    if max_train is not None and not (is_int(max_train) and max_train >= 1):
        raise ConfigError(f"max_train must be a positive integer or None, got {max_train!r}")


def _check_options(spec: Any, name: str, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        allowed = ", ".join(sorted(spec.options)) or "none"
        common = ["val_fraction", "test_fraction", "scaling", "max_train", "train_fraction"]
        hint = close_name(unknown[0], [*spec.options, *common])
        raise ConfigError(
            f"unknown option(s) {unknown} for dataset {name!r}{hint}; its options: {allowed} "
            f"(and, for every dataset: {', '.join(common)})"
        )


def _scaling_mode(scaling: Any, standardize: Any) -> str:
    if standardize is None:
        return check_mode(scaling)
    if not isinstance(standardize, bool):
        raise ConfigError(f"standardize must be True or False, got {standardize!r}")
    warnings.warn(
        "load_dataset(standardize=...) is deprecated: use scaling='public' (standardize=True; public "
        "constants, no longer training statistics) or scaling='unit' (standardize=False)",
        PrivoptDeprecationWarning,
        stacklevel=3,
    )
    return "public" if standardize else "unit"


def load_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    val_fraction: float = 0.0,
    test_fraction: float | None = None,
    scaling: str = "public",
    max_train: int | None = None,
    train_fraction: float | None = None,
    standardize: bool | None = None,
    **options: Any,
) -> Dataset:
    """Load a registered dataset: per-record selection, public preprocessing, tensors.

    Args:
        name: registry name (see :func:`available_datasets`).
        data_dir: folder holding one sub-folder per dataset (``mnist/``, ``cifar10/`` ...);
            defaults to ``$PRIVOPT_DATA``. Not needed for embedded/synthetic datasets.
        seed: public key of every selection (carved splits, subsampling, imbalance).
        val_fraction: probability that a training record moves to the validation split.
        test_fraction: probability that a record goes to the test split when the data directory
            holds only one split (default 0.2); ignored (with a warning) when an official test
            split exists.
        scaling: ``"public"`` (default; clip into public bounds, normalise with published
            constants), ``"unit"`` (public bounds to [0, 1]; pixels / 255), ``"none"``, or
            ``"data"`` (training-split mean/std: NOT private, warns). See ``docs/data.md``.
        max_train: keep at most this many training records (the lowest-ranked by keyed hash:
            one record changes the selection by at most one swap).
        train_fraction: keep each training record with this probability (per record).
        standardize: deprecated alias (True -> ``"public"``, False -> ``"unit"``).
        **options: dataset-specific options (see :func:`dataset_options`), e.g. ``imratio``.

    Returns a :class:`Dataset` (``meta["public"]``: publishable facts, ``loaded_with`` the arguments;
    ``meta["private"]``: exact statistics of the records). Raises ConfigError (unknown dataset or
    option, an invalid value) or DataError (files missing or corrupt).

    Example:
        >>> ds = load_dataset("digits-st", seed=0, imratio=0.1)
        >>> ds.num_classes, ds.input_shape
        (2, (1, 8, 8))
        >>> 0.05 < float(ds.y_train.float().mean()) < 0.15
        True
    """
    spec = _spec(name)
    _check_options(spec, name, options)
    _check_arguments(seed, val_fraction, test_fraction, train_fraction, max_train)
    mode = _scaling_mode(scaling, standardize)
    ctx = BuildContext(name=name, data_dir=data_dir, seed=int(seed), test_fraction=test_fraction)
    raw = spec.builder(ctx, **{**spec.options, **options})
    if raw.test is None:
        raw = ctx.with_test(raw)
    from privopt.data.pipeline import finish

    data = finish(raw, ctx=ctx, val_fraction=float(val_fraction), max_train=max_train, train_fraction=train_fraction,
                  mode=mode, options={**spec.options, **options})  # fmt: skip
    given = dict(val_fraction=val_fraction, test_fraction=test_fraction, scaling=scaling, max_train=max_train,
                 train_fraction=train_fraction, standardize=standardize, **options)  # fmt: skip
    data.meta["public"]["loaded_with"] = explicit_load_params(given)  # train() checks dataset_params against it
    return data


def explicit_load_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` of :func:`load_dataset` without those at their default (``{"max_train": None}`` says
    nothing a config without it does not).

    Example:
        >>> explicit_load_params({"max_train": 100, "scaling": "public", "val_fraction": 0.0})
        {'max_train': 100}
    """
    defaults = {k: p.default for k, p in inspect.signature(load_dataset).parameters.items() if p.kind == p.KEYWORD_ONLY}
    return {k: v for k, v in params.items() if k not in defaults or v != defaults[k]}
