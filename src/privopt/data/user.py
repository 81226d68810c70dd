"""Your own data as a :class:`~privopt.data.Dataset`: conversion rules, checks and clear errors.

The dtype rule (also applied by :meth:`Dataset.validate`): floating and bool features become
float32 (float64 is rounded to nearest; values beyond float32's range are an error); integer
features become int64 and stay integer (token ids for an ``nn.Embedding``; they must be >= 0);
labels and group ids become int64 (they must be integer or bool: float labels are an error, not
silently truncated). No scaling happens
here: features must already be scaled with public constants (``docs/data.md``, "Bring your own
data").
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from privopt.data.dataset import MAX_ABS_FEATURE, Dataset
from privopt.data.preprocess import PrivatePreprocessingWarning
from privopt.data.splits import label_histogram
from privopt.errors import DataError

__all__ = ["dataset_from_tensors", "dataset_from_numpy", "validate_dataset", "ensure_dataset"]

_F32_MAX = float(torch.finfo(torch.float32).max)
_SPLITS = ("train", "val", "test")


def ensure_dataset(obj: Any) -> Dataset:
    """``obj`` if it is a :class:`Dataset`; a clear :class:`DataError` otherwise (e.g. a tuple).

    Example:
        >>> import torch
        >>> ensure_dataset((torch.zeros(2, 1), torch.zeros(2)))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        privopt.errors.DataError: expected a privopt.data.Dataset, got tuple; build one with Dataset.from_tensors(...
    """
    if isinstance(obj, Dataset):
        return obj
    raise DataError(
        f"expected a privopt.data.Dataset, got {type(obj).__name__}; build one with "
        "Dataset.from_tensors(x, y, x_test=..., y_test=..., num_classes=...)"
    )


def _features(x: Any, what: str, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        hint = " (use Dataset.from_numpy for NumPy arrays)" if isinstance(x, np.ndarray) else ""
        raise DataError(f"dataset {name!r}: {what} must be a torch.Tensor{hint}, got {type(x).__name__}")
    if x.dim() < 2:
        raise DataError(
            f"dataset {name!r}: {what} must have shape [N, features...], got {list(x.shape)}"
            + ("; for a single feature use x.unsqueeze(1)" if x.dim() == 1 else "")
        )
    if x.is_complex():
        raise DataError(f"dataset {name!r}: {what} is complex ({x.dtype}); features must be real")
    if x.dtype == torch.float32:
        return x
    if not x.is_floating_point() and x.dtype != torch.bool:  # token ids: an Embedding takes them as they are
        return x.to(torch.int64)
    if x.dtype == torch.float64:
        big = x.abs()[torch.isfinite(x)]
        if big.numel() and float(big.max()) > _F32_MAX:
            # No value in the message: it would be one private record's feature.
            raise DataError(
                f"dataset {name!r}: {what} holds a value beyond float32's range (|x| > {_F32_MAX:.3g}); "
                "scale features with public constants first"
            )
    return x.to(torch.float32)


def _ids(v: Any, what: str, name: str, n: int) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise DataError(f"dataset {name!r}: {what} must be a torch.Tensor, got {type(v).__name__}")
    if v.dim() != 1:
        raise DataError(f"dataset {name!r}: {what} must be 1-D [N], got shape {list(v.shape)}")
    if v.dtype.is_floating_point or v.is_complex():
        raise DataError(
            f"dataset {name!r}: {what} must be integer ids, got {v.dtype} (if they are whole numbers: "
            ".long() on a tensor, .astype(np.int64) on a NumPy array)"
        )
    if v.shape[0] != n:
        raise DataError(f"dataset {name!r}: {what} has {v.shape[0]} entries for {n} feature rows")
    return v.to(torch.int64)


def _max_id(*tensors: torch.Tensor | None) -> int:
    return max((int(t.max()) for t in tensors if t is not None and t.numel()), default=-1)


def _convert_splits(raw: dict, name: str) -> tuple[dict, dict, dict]:
    """Features, labels and group ids of every given split, converted and shape-checked."""
    xs, ys, gs = {}, {}, {}
    has_groups = raw["train"][2] is not None
    for split, (xi, yi, gi) in raw.items():
        suffix = "" if split == "train" else f"_{split}"
        if split != "train" and xi is None and yi is None:
            if gi is not None:
                raise DataError(f"dataset {name!r}: groups_{split} given without x_{split}/y_{split}")
            continue
        if (xi is None) != (yi is None):
            raise DataError(f"dataset {name!r}: give both x_{split} and y_{split} (or neither)")
        xs[split] = _features(xi, f"x{suffix}", name)
        n = xs[split].shape[0]
        ys[split] = _ids(yi, f"y{suffix}", name, n)
        if (gi is None) == has_groups:
            raise DataError(f"dataset {name!r}: groups given for some splits only; pass groups{suffix} too")
        gs[split] = None if gi is None else _ids(gi, f"groups{suffix}", name, n)
    return xs, ys, gs


def dataset_from_tensors(
    x,
    y,
    *,
    x_test=None,
    y_test=None,
    x_val=None,
    y_val=None,
    groups=None,
    groups_test=None,
    groups_val=None,
    num_classes: int | None = None,
    group_names=None,
    class_names=None,
    name: str = "custom",
) -> Dataset:
    """Implementation of :meth:`Dataset.from_tensors` (see there)."""
    if not isinstance(name, str) or not name:
        raise DataError(f"dataset name must be a non-empty string, got {name!r}")
    raw = {"train": (x, y, groups), "test": (x_test, y_test, groups_test), "val": (x_val, y_val, groups_val)}
    xs, ys, gs = _convert_splits(raw, name)
    shape = tuple(int(d) for d in xs["train"].shape[1:])
    inferred = []
    if num_classes is None:
        num_classes = max(_max_id(*ys.values()) + 1, 2)
        inferred.append(f"num_classes={num_classes}")
    if groups is not None and group_names is None:
        group_names = [f"group {i}" for i in range(_max_id(*gs.values()) + 1)]
        inferred.append(f"{len(group_names)} groups")
    if inferred:
        warnings.warn(
            f"dataset {name!r}: {' and '.join(inferred)} inferred from the private labels/groups; "
            "pass num_classes= (and group_names=) so the model's shape is a public choice",
            PrivatePreprocessingWarning,
            stacklevel=3,
        )
    _check_names(name, num_classes, class_names, ys)
    empty = lambda like: like.new_zeros((0, *like.shape[1:]))
    for split in ("val", "test"):
        if split not in xs:
            xs[split], ys[split] = empty(xs["train"]), torch.zeros(0, dtype=torch.int64)
            gs[split] = None if groups is None else torch.zeros(0, dtype=torch.int64)
    meta = _user_meta(name, ys, gs, num_classes, group_names, class_names, x.dtype)
    if inferred:  # the model's shape then depends on the private labels: the run's record says so
        meta["public"]["inferred_from_private_data"] = inferred
    ds = Dataset(
        name=name, x_train=xs["train"], y_train=ys["train"], x_val=xs["val"], y_val=ys["val"],
        x_test=xs["test"], y_test=ys["test"], num_classes=int(num_classes), input_shape=shape,
        g_train=gs["train"], g_val=gs["val"], g_test=gs["test"], meta=meta,
    )  # fmt: skip
    return ds.validate()


def _check_names(name: str, num_classes: Any, class_names: Any, ys: dict) -> None:
    """``num_classes`` a positive integer that covers every label; ``class_names`` one per class."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise DataError(f"dataset {name!r}: num_classes must be an integer >= 1, got {num_classes!r}")
    lo = min((int(t.min()) for t in ys.values() if t.numel()), default=0)
    if lo < 0 or _max_id(*ys.values()) >= num_classes:
        raise DataError(f"dataset {name!r}: labels outside 0..{num_classes - 1}")
    if class_names is not None and len(class_names) != num_classes:
        raise DataError(f"dataset {name!r}: {len(class_names)} class_names for num_classes={num_classes}")


def _cast(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return ""
    if not dtype.is_floating_point and dtype != torch.bool:
        return f"; {dtype} features kept as int64 (integer ids)"
    return f"; {dtype} features cast to float32 (round to nearest)"


def _user_meta(name, ys, gs, num_classes, group_names, class_names, dtype) -> dict:
    public: dict[str, Any] = {
        "name": name,
        "source": "user tensors (Dataset.from_tensors / from_numpy)",
        "preprocessing": ["none: features must already be scaled with public constants (docs/data.md)" + _cast(dtype)],
    }
    if class_names is not None:
        public["class_names"] = [str(c) for c in class_names]
    if group_names is not None:
        public["group_names"] = [str(g) for g in group_names]
    private: dict[str, Any] = {
        "splits": {s: int(ys[s].shape[0]) for s in _SPLITS},
        "label_histogram": {s: label_histogram(ys[s].numpy(), int(num_classes)) for s in _SPLITS},
    }
    if gs["train"] is not None and group_names is not None:
        private["group_histogram"] = {s: label_histogram(gs[s].numpy(), len(group_names)) for s in _SPLITS}
    return {"public": public, "private": private}


def dataset_from_numpy(x, y, **kwargs: Any) -> Dataset:
    """Implementation of :meth:`Dataset.from_numpy`: arrays to tensors, then :func:`dataset_from_tensors`."""
    name = kwargs.get("name", "custom")

    def conv(key: str, v: Any) -> torch.Tensor | None:
        if v is None:
            return None
        if isinstance(v, torch.Tensor):
            raise DataError(f"dataset {name!r}: {key} is a torch.Tensor; use Dataset.from_tensors")
        if not isinstance(v, np.ndarray):
            raise DataError(f"dataset {name!r}: {key} must be a NumPy array, got {type(v).__name__}")
        if v.dtype == object or v.dtype.kind in "USV":
            raise DataError(f"dataset {name!r}: {key} has dtype {v.dtype}; {_NOT_NUMBERS[key[0]]}")
        return torch.from_numpy(np.ascontiguousarray(v))

    arrays = ("x_test", "y_test", "x_val", "y_val", "groups", "groups_test", "groups_val")
    x, y = conv("x", x), conv("y", y)  # the training split's arrays first: the error names the first one wrong
    conv_kwargs = {k: (conv(k, v) if k in arrays else v) for k, v in kwargs.items()}
    return dataset_from_tensors(x, y, **conv_kwargs)


# What to do with text or objects (e.g. a CSV column read as strings), by the first letter of the array's name.
_NOT_NUMBERS = {
    "x": "features must be numbers (a missing value read as '' or None: drop the record or fill in a public constant)",
    "y": "labels must be integer ids 0..K-1: map the strings to ids with a fixed mapping, e.g. {'no': 0, 'yes': 1}",
    "g": "group ids must be integers 0..G-1: map the strings to ids with a fixed mapping and pass group_names",
}


def validate_dataset(ds: Dataset, *, max_abs: float = MAX_ABS_FEATURE) -> None:
    """Implementation of :meth:`Dataset.validate` (see there); casts dtypes in place."""
    if ds.n_train == 0:
        raise DataError(f"dataset {ds.name!r}: the training split is empty")
    num_groups = ds.num_groups
    for split in _SPLITS:
        x, y = ds.split(split)
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            raise DataError(f"dataset {ds.name!r}: the {split} split must hold torch tensors")
        if x.shape[0] != y.shape[0]:
            raise DataError(
                f"dataset {ds.name!r}: the {split} split has {x.shape[0]} feature rows but {y.shape[0]} labels"
            )
        if y.dtype.is_floating_point or y.dim() != 1:
            raise DataError(f"dataset {ds.name!r}: {split} labels must be a 1-D integer tensor")
        x = _features(x, f"{split} features", ds.name) if x.dim() >= 2 else x
        setattr(ds, f"x_{split}", x)
        setattr(ds, f"y_{split}", y.to(torch.int64))
        _check_groups(ds, split, num_groups)
        if x.shape[0] == 0:
            continue
        _check_values(ds, split, x, y, max_abs)


def _check_values(ds: Dataset, split: str, x: torch.Tensor, y: torch.Tensor, max_abs: float) -> None:
    if tuple(x.shape[1:]) != tuple(ds.input_shape):
        raise DataError(
            f"dataset {ds.name!r}: {split} features have shape {tuple(x.shape[1:])}, "
            f"expected input_shape {tuple(ds.input_shape)}"
        )
    if not x.is_floating_point():  # integer ids (kept as int64): no magnitude rule, but no negative id
        if x.numel() and int(x.min()) < 0:
            raise DataError(
                f"dataset {ds.name!r}: the {split} split has a negative integer feature; integer features are "
                "kept as int64 token ids (e.g. for nn.Embedding) and must be >= 0 (for numeric features pass x.float())"
            )
    elif not torch.isfinite(x).all():
        raise DataError(
            f"dataset {ds.name!r}: the {split} split has NaN or infinite feature values (e.g. a missing value: "
            "drop the record or fill in a public constant)"
        )
    elif (biggest := float(x.abs().max())) > max_abs:
        # The value itself is one record's feature: named only for the (public) test split.
        found = f"{biggest:.3g} (> {max_abs:g})" if split == "test" else f"above {max_abs:g}"
        raise DataError(
            f"dataset {ds.name!r}: the {split} split has a feature of magnitude {found}: "
            "features must be scaled with public constants (e.g. pixels / 255, documented value ranges) "
            "before training; see docs/data.md"
        )
    if int(y.min()) < 0 or int(y.max()) >= ds.num_classes:
        raise DataError(f"dataset {ds.name!r}: {split} labels outside 0..{ds.num_classes - 1}")


def _check_groups(ds: Dataset, split: str, num_groups: int) -> None:
    g = getattr(ds, f"g_{split}")
    if ds.g_train is None:
        if g is not None:
            raise DataError(f"dataset {ds.name!r}: {split} has group ids but the training split has none")
        return
    n = getattr(ds, f"y_{split}").shape[0]
    if g is None:
        raise DataError(f"dataset {ds.name!r}: the training split has group ids but {split} has none")
    g = _ids(g, f"{split} group ids", ds.name, n)
    setattr(ds, f"g_{split}", g)
    if g.numel() and num_groups and (int(g.min()) < 0 or int(g.max()) >= num_groups):
        raise DataError(f"dataset {ds.name!r}: {split} group ids outside 0..{num_groups - 1}")
