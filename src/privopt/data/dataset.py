"""The :class:`Dataset` returned by :func:`privopt.data.load_dataset` and the raw containers
dataset builders work with before the generic pipeline (splits, scaling, tensors) runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["Dataset", "Part", "RawData"]


@dataclass
class Dataset:
    """A ready-to-train dataset: float32 features, int64 labels, optional int64 group ids.

    Attributes:
        name: registry name (e.g. ``"mnist-st"``).
        x_train, y_train, x_val, y_val, x_test, y_test: features ``[N, C, H, W]`` (images) or
            ``[N, d]`` (tabular) and labels ``[N]``. The validation split may be empty (``N = 0``).
        num_classes: number of labels.
        input_shape: shape of one example, e.g. ``(1, 28, 28)`` or ``(54,)``.
        g_train, g_val, g_test: per-example group ids (``None`` when the dataset has no groups);
            group names are in ``meta["group_names"]``.
        meta: JSON-friendly provenance: source files and record counts, how each split was made,
            label (and group) histograms, preprocessing steps and standardisation statistics.
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

    @property
    def n_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_groups(self) -> int:
        """Number of groups (0 when the dataset has none)."""
        return len(self.meta.get("group_names", ())) if self.g_train is not None else 0

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of ``"train"``, ``"val"`` or ``"test"``."""
        if which not in ("train", "val", "test"):
            from privopt.errors import ConfigError

            raise ConfigError(f"unknown split {which!r}; use 'train', 'val' or 'test'")
        return getattr(self, f"x_{which}"), getattr(self, f"y_{which}")

    def validate(self) -> Dataset:
        """Check a dataset (e.g. one built from your own tensors) before training on it.

        Raises :class:`privopt.errors.DataError` naming the split and the problem: mismatched
        lengths, a feature shape other than ``input_shape``, NaN/inf features, labels outside
        ``0..num_classes-1``, or an empty training split.

        Example:
            >>> import torch
            >>> bad = Dataset(name="mine", x_train=torch.tensor([[0.0], [float("nan")]]),
            ...               y_train=torch.tensor([0, 1]), x_val=torch.zeros(0, 1),
            ...               y_val=torch.zeros(0, dtype=torch.long), x_test=torch.zeros(1, 1),
            ...               y_test=torch.zeros(1, dtype=torch.long), num_classes=2, input_shape=(1,))
            >>> bad.validate()
            Traceback (most recent call last):
            ...
            privopt.errors.DataError: dataset 'mine': the train split has NaN or infinite feature values
        """
        from privopt.errors import DataError

        if self.n_train == 0:
            raise DataError(f"dataset {self.name!r}: the training split is empty")
        for split in ("train", "val", "test"):
            x, y = self.split(split)
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                raise DataError(f"dataset {self.name!r}: the {split} split must hold torch tensors")
            if x.shape[0] != y.shape[0]:
                raise DataError(
                    f"dataset {self.name!r}: the {split} split has {x.shape[0]} feature rows but {y.shape[0]} labels"
                )
            if x.shape[0] == 0:
                continue
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise DataError(
                    f"dataset {self.name!r}: {split} features have shape {tuple(x.shape[1:])}, "
                    f"expected input_shape {tuple(self.input_shape)}"
                )
            if not torch.isfinite(x).all():
                raise DataError(f"dataset {self.name!r}: the {split} split has NaN or infinite feature values")
            if y.dtype.is_floating_point or y.dim() != 1:
                raise DataError(f"dataset {self.name!r}: {split} labels must be a 1-D integer tensor")
            if int(y.min()) < 0 or int(y.max()) >= self.num_classes:
                raise DataError(f"dataset {self.name!r}: {split} labels outside 0..{self.num_classes - 1}")
        return self

    def __repr__(self) -> str:  # the default repr would print whole tensors
        return (
            f"Dataset(name={self.name!r}, train={self.n_train}, val={len(self.y_val)}, test={len(self.y_test)}, "
            f"num_classes={self.num_classes}, input_shape={self.input_shape}, groups={self.num_groups})"
        )


@dataclass
class Part:
    """One split as NumPy arrays (features may still be uint8 pixels)."""

    x: np.ndarray
    y: np.ndarray
    g: np.ndarray | None = None

    def take(self, idx: np.ndarray) -> Part:
        return Part(self.x[idx], self.y[idx], None if self.g is None else self.g[idx])

    def __len__(self) -> int:
        return int(len(self.y))


@dataclass
class RawData:
    """What a dataset builder hands to the generic pipeline.

    Attributes:
        train, test: the splits (``test`` may be ``None`` until the pipeline carves it).
        kind: ``"image"`` (``x`` is ``[N, C, H, W]``) or ``"tabular"`` (``[N, d]``).
        num_classes: number of labels.
        x_scale: features are divided by this before scaling (255 for uint8 pixels).
        scaling: ``"standardize"`` (default; obeys ``load_dataset(standardize=...)``) or
            ``"minmax_unit_norm"`` (min-max to [0, 1] with training statistics, then each row to
            unit L2 norm; replaces standardisation).
        meta: provenance entries merged into :attr:`Dataset.meta`.
    """

    train: Part
    test: Part | None
    kind: str
    num_classes: int
    x_scale: float = 1.0
    scaling: str = "standardize"
    meta: dict[str, Any] = field(default_factory=dict)
