"""The :class:`Dataset` returned by :func:`privopt.data.load_dataset` (or built from your own tensors
with :meth:`Dataset.from_tensors` / :meth:`Dataset.from_numpy`), and the raw containers dataset
builders work with before the generic pipeline (selection, scaling, tensors) runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from privopt.data.public import PublicScaling

__all__ = ["Dataset", "Part", "RawData", "MAX_ABS_FEATURE"]

# Features scaled with public constants are O(1)..O(100); anything beyond this is raw data (or a
# corrupt value) that overflows float32 norms in per-sample clipping.
MAX_ABS_FEATURE = 1e6


@dataclass
class Dataset:
    """A ready-to-train dataset: float32 features (int64 for integer ids, e.g. tokens), int64 labels,
    optional int64 group ids.

    Build one from your own data with :meth:`from_tensors` or :meth:`from_numpy` (features must
    already be scaled with public constants, see ``docs/data.md``).

    Attributes:
        name: registry name (e.g. ``"mnist-st"``).
        x_train, y_train, x_val, y_val, x_test, y_test: features ``[N, C, H, W]`` (images) or
            ``[N, d]`` (tabular) and labels ``[N]``. The validation split may be empty (``N = 0``).
        num_classes: number of labels.
        input_shape: shape of one example, e.g. ``(1, 28, 28)`` or ``(54,)``.
        g_train, g_val, g_test: per-example group ids ``0..num_groups-1`` (``None`` when the
            dataset has no groups); names in :attr:`group_names`.
        meta: ``{"public": ..., "private": ...}``. ``public`` holds facts that do not depend on
            the private records (source files, options, selection rule, preprocessing constants,
            class/group/feature names); ``private`` holds exact statistics of the loaded records
            (split sizes, label/group histograms). Only ``public`` may be published; ``private`` is
            for a non-private diagnostics file.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    g_train: torch.Tensor | None = None
    g_val: torch.Tensor | None = None
    g_test: torch.Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_tensors(cls, x, y, **kwargs: Any) -> Dataset:
        """A validated :class:`Dataset` from your own tensors (float64 features are cast to float32,
        integer features stay integer).

        Args:
            x, y: training features ``[N, ...]`` and integer labels ``[N]``.
            **kwargs: keyword-only ``x_test``, ``y_test``, ``x_val``, ``y_val`` (optional splits),
                ``groups``, ``groups_test``, ``groups_val`` (integer group ids per record),
                ``num_classes``, ``group_names``, ``class_names``, ``name``. Pass ``num_classes``
                (and ``group_names``): inferring them reads the private labels (a warning says so).

        Floating features are cast to float32: float64 values are rounded to the nearest float32
        (values beyond float32's range raise :class:`~privopt.errors.DataError`), float16/bfloat16
        and bool features are converted exactly. Integer features stay integer (int64: token ids
        reach an ``nn.Embedding`` as they are) and must be >= 0; a model of float inputs needs
        ``x.float()``. Labels and groups must be integer or bool tensors. No scaling is applied:
        scale features with PUBLIC constants first.

        Raises:
            DataError: a non-tensor argument, wrong shapes or lengths, float labels, NaN/inf or
                absurdly large features, labels or groups out of range.

        Example:
            >>> import torch
            >>> x = torch.rand(100, 3, dtype=torch.float64)
            >>> y = (x[:, 0] > 0.5).long()
            >>> ds = Dataset.from_tensors(x, y, x_test=x[:10], y_test=y[:10], num_classes=2)
            >>> ds.x_train.dtype, ds.input_shape, ds.n_train
            (torch.float32, (3,), 100)
        """
        from privopt.data.user import dataset_from_tensors

        return dataset_from_tensors(x, y, **kwargs)

    @classmethod
    def from_numpy(cls, x, y, **kwargs: Any) -> Dataset:
        """Like :meth:`from_tensors` for NumPy arrays (same keywords and rules).

        Example:
            >>> import numpy as np
            >>> x = np.random.default_rng(0).random((50, 4))
            >>> ds = Dataset.from_numpy(x, (x[:, 0] > 0.5).astype(int), num_classes=2)
            >>> ds.x_train.dtype, len(ds.y_test)
            (torch.float32, 0)
        """
        from privopt.data.user import dataset_from_numpy

        return dataset_from_numpy(x, y, **kwargs)

    @property
    def n_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def public_meta(self) -> dict[str, Any]:
        """Facts that do not depend on the private records (safe to publish)."""
        return self.meta.get("public", {})

    @property
    def private_stats(self) -> dict[str, Any]:
        """Exact statistics of the loaded records: NOT private, for a diagnostics file only."""
        return self.meta.get("private", {})

    @property
    def group_names(self) -> list[str]:
        """Names of the groups (empty when the dataset has none)."""
        if self.g_train is None:
            return []
        return list(self.public_meta.get("group_names") or self.meta.get("group_names") or [])

    @property
    def class_names(self) -> list[str]:
        return list(self.public_meta.get("class_names") or self.meta.get("class_names") or [])

    @property
    def num_groups(self) -> int:
        """Number of groups (0 when the dataset has none)."""
        return len(self.group_names)

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of ``"train"``, ``"val"`` or ``"test"``."""
        if which not in ("train", "val", "test"):
            from privopt.errors import ConfigError

            raise ConfigError(f"unknown split {which!r}; use 'train', 'val' or 'test'")
        return getattr(self, f"x_{which}"), getattr(self, f"y_{which}")

    def groups(self, which: str) -> torch.Tensor | None:
        """Group ids of ``"train"``, ``"val"`` or ``"test"`` (``None`` without groups)."""
        self.split(which)
        return getattr(self, f"g_{which}")

    def validate(self, *, max_abs: float = MAX_ABS_FEATURE) -> Dataset:
        """Check a dataset (e.g. one built from your own tensors) before training on it.

        Casts float64/float16 features to float32 and integer features, labels and groups to int64
        (the rule of :meth:`from_tensors`), then raises :class:`privopt.errors.DataError` naming the
        split and the problem: mismatched lengths, a feature shape other than ``input_shape``,
        NaN/inf features, floating features larger than ``max_abs`` in magnitude (unscaled data:
        scale with public constants), negative integer features, labels outside
        ``0..num_classes-1``, bad group ids, or an empty training split.

        Example:
            >>> import torch
            >>> bad = Dataset(name="mine", x_train=torch.tensor([[0.0], [float("nan")]]),
            ...               y_train=torch.tensor([0, 1]), x_val=torch.zeros(0, 1),
            ...               y_val=torch.zeros(0, dtype=torch.long), x_test=torch.zeros(1, 1),
            ...               y_test=torch.zeros(1, dtype=torch.long), num_classes=2, input_shape=(1,))
            >>> bad.validate()
            Traceback (most recent call last):
            ...
            privopt.errors.DataError: dataset 'mine': the train split has NaN or infinite feature values (e.g. ...
        """
        from privopt.data.user import validate_dataset

        validate_dataset(self, max_abs=max_abs)
        return self

    def __repr__(self) -> str:  # the default repr would print whole tensors
        return (
            f"Dataset(name={self.name!r}, train={self.n_train}, val={len(self.y_val)}, test={len(self.y_test)}, "
            f"num_classes={self.num_classes}, input_shape={self.input_shape}, groups={self.num_groups})"
        )


@dataclass
class Part:
    """One split as NumPy arrays (features may still be uint8 pixels).

    ``u`` caches the per-record selection uniforms (:func:`privopt.data.selection.record_uniforms`)
    of the records' original content, so later label changes (binarisation) do not change them.
    """

    x: np.ndarray
    y: np.ndarray
    g: np.ndarray | None = None
    u: np.ndarray | None = None

    def take(self, idx: np.ndarray) -> Part:
        pick = lambda a: None if a is None else a[idx]
        return Part(self.x[idx], self.y[idx], pick(self.g), pick(self.u))

    def __len__(self) -> int:
        return int(len(self.y))


@dataclass
class RawData:
    """What a dataset builder hands to the generic pipeline.

    Attributes:
        train, test: the splits (``test`` may be ``None`` until the pipeline carves it).
        kind: ``"image"`` (``x`` is ``[N, C, H, W]``) or ``"tabular"`` (``[N, d]``).
        num_classes: number of labels.
        scaling: the dataset's public bounds and normalisation constants.
        unit_norm: after min-max scaling with the public bounds, scale every record to unit L2 norm.
        meta: PUBLIC facts (class/group/feature names, sources, rules), merged into
            ``Dataset.meta["public"]``; ``meta["preprocessing"]`` is a list of steps.
        stats: exact statistics of the records (counts), merged into ``Dataset.meta["private"]``.
    """

    train: Part
    test: Part | None
    kind: str
    num_classes: int
    scaling: PublicScaling
    unit_norm: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def note(self, step: str) -> None:
        """Append a preprocessing step to the public description."""
        self.meta.setdefault("preprocessing", []).append(step)

    def per_record(self, step: str) -> None:
        """Name a step that keeps or drops each training record on its own (its hash, label or cells):
        a record replaced by another may then enter or leave the training split (n changes)."""
        self.meta.setdefault("per_record_selection", []).append(step)
