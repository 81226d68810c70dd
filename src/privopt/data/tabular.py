"""Public encoding of tabular records, shared by the Adult loader and the ``csv`` dataset.

A layout is fixed before any record is read: numeric columns with public bounds (min-max scaled
with them by :class:`~privopt.data.public.PublicScaling`), then categorical columns one-hot over a
public vocabulary. Nothing here looks at more than one record to encode it.

Example:
    >>> import numpy as np
    >>> one_hot(np.array(["b", "a"], dtype=object), ("a", "b")).tolist()
    [[0.0, 1.0], [1.0, 0.0]]
    >>> names, scaling = tabular_layout({"age": (17.0, 90.0)}, {"sex": ("F", "M")}, source="docs")
    >>> names, scaling.upper.tolist()
    (['age', 'sex=F', 'sex=M'], [90.0, 1.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from privopt.data.public import PublicScaling
from privopt.errors import debug_enabled

__all__ = ["TRANSFORMS", "one_hot", "record_where", "tabular_layout", "transform"]

# Fixed per-record transforms of a numeric column, applied before its public range (which is in the
# transformed units). Each is defined for values >= 0; ``identity`` for any value.
TRANSFORMS = {"identity": None, "log1p": np.log1p, "sqrt": np.sqrt}


def record_where(ok: np.ndarray, lines: np.ndarray) -> str:
    """``"some record"``; under ``--debug`` the file line of the first record not ``ok`` (which record
    it is, and its value, are data: never named otherwise, nor how many)."""
    if not debug_enabled():
        return "some record"
    return f"line {int(lines[np.flatnonzero(~ok)[0]])}"


def transform(name: str, values: np.ndarray) -> np.ndarray:
    """``values`` under the fixed transform ``name`` of :data:`TRANSFORMS` (callers check the domain:
    values >= 0 unless ``identity``)."""
    fn = TRANSFORMS[name]
    return values if fn is None else fn(values)


def one_hot(values: np.ndarray, categories: Sequence[str]) -> np.ndarray:
    """float64 ``[N, len(categories)]``: row i has a 1 at the category equal to ``values[i]`` (all 0
    for a value outside ``categories``: callers check membership first)."""
    return (values[:, None] == np.array(list(categories), dtype=object)[None, :]).astype(np.float64)


def tabular_layout(
    numeric: Mapping[str, tuple[float, float]], vocabularies: Mapping[str, Sequence[str]], *, source: str
) -> tuple[list[str], PublicScaling]:
    """Feature names and public scaling of ``numeric`` columns (``name -> (lower, upper)``, in order)
    followed by the one-hot columns of ``vocabularies`` (``name -> categories``; bounds 0/1)."""
    names = list(numeric)
    lo = [float(b[0]) for b in numeric.values()]
    hi = [float(b[1]) for b in numeric.values()]
    for col, cats in vocabularies.items():
        names += [f"{col}={v}" for v in cats]
        lo += [0.0] * len(cats)
        hi += [1.0] * len(cats)
    return names, PublicScaling.box(np.array(lo), np.array(hi), source=source)
