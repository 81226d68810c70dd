"""The private data loader of :meth:`privopt.PrivacyEngine.make_private`: Poisson batches.

Each batch includes every training record independently with probability ``q`` (the sampling
rate the noise was calibrated for), drawn from a :mod:`privopt.rng` source (secret unless the
engine was given an insecure seed). The rate is an explicit number (``batch_size / n`` or
``sample_rate``), never inferred from a loader's length, and a batch may be empty or larger than
the expected size: that randomness is what the privacy amplification by sampling relies on.
See ``docs/api.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torch.utils.data import Dataset as TorchDataset

from privopt.data.dataset import Dataset
from privopt.errors import DataError
from privopt.sampling import PoissonSampler

__all__ = ["PoissonLoader", "TrainingData", "training_data"]


class TrainingData:
    """The private training records as an indexable source of ``(inputs, targets)`` batches.

    Tensors are indexed directly; any other map-style dataset is read item by item and collated
    (with the given loader's ``collate_fn``, else torch's default).
    """

    def __init__(self, *, n: int, take: Callable[[torch.Tensor], tuple[Any, Any]], targets: Any = None):
        self.n, self._take = n, take
        self.targets = targets  # all targets when they are one in-memory tensor, else None

    def probe_indices(self) -> torch.Tensor:
        """Two records for the checks before training: those holding the smallest and the largest
        target when the targets are one in-memory vector (so a class id beyond the model's outputs
        fails now, not in the middle of the run when a batch first holds it), else the first two."""
        y = self.targets
        if isinstance(y, torch.Tensor) and y.dim() == 1 and y.dtype != torch.bool and not y.is_complex():
            return torch.stack([torch.argmin(y), torch.argmax(y)])
        return torch.arange(min(2, self.n))

    def batch(self, idx: torch.Tensor) -> tuple[Any, Any]:
        """The records at ``idx`` (an int64 index tensor, possibly empty)."""
        return self._take(idx)


def _check_finite(x: torch.Tensor, y: torch.Tensor, what: str) -> None:
    for name, t in (("inputs", x), ("targets", y)):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise DataError(f"{what}: the {name} hold NaN or infinite values")


def _tensor_pair(x: Any, y: Any, what: str) -> TrainingData:
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        raise DataError(f"{what} must hold two tensors (inputs, targets), got {type(x).__name__}, {type(y).__name__}")
    if x.dim() == 0 or y.dim() == 0:
        raise DataError(
            f"{what}: inputs and targets need a first (record) dimension, got shapes "
            f"{list(x.shape)} and {list(y.shape)}"
        )
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{what}: {x.shape[0]} inputs but {y.shape[0]} targets (one target per record)")
    if x.shape[0] == 0:
        raise DataError(f"{what} is empty: there is nothing to train on")
    _check_finite(x, y, what)
    return TrainingData(n=int(x.shape[0]), take=lambda idx: (x[idx], y[idx]), targets=y)


def _collated(dataset: Any, collate: Callable | None, what: str) -> TrainingData:
    from torch.utils.data import default_collate

    collate = collate or default_collate
    try:
        n = len(dataset)
    except TypeError:
        raise DataError(f"{what} has no length: privopt needs a map-style dataset (len() and [i])") from None
    if n == 0:
        raise DataError(f"{what} is empty: there is nothing to train on")

    def take(idx: torch.Tensor):
        # An empty Poisson batch still takes a step: give it record 0's structure with no rows.
        items = [dataset[int(i)] for i in idx] if idx.numel() else [dataset[0]]
        batch = collate(items)
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise DataError(f"{what}: a batch must be a pair (inputs, targets), got {type(batch).__name__}")
        x, y = batch
        for name, t in (("inputs", x), ("targets", y)):
            if not isinstance(t, torch.Tensor):  # the gradient engines take one tensor of each
                raise DataError(f"{what}: a batch's {name} must collate to one tensor, got {type(t).__name__}")
        return (x, y) if idx.numel() else (x[:0], y[:0])

    return TrainingData(n=n, take=take)


def training_data(*, dataset: Any = None, data_loader: Any = None) -> TrainingData:
    """The training records from exactly one of ``dataset`` / ``data_loader``.

    ``dataset``: a :class:`privopt.data.Dataset` (its training split), an ``(inputs, targets)``
    pair of tensors, a ``TensorDataset`` of two tensors, or any map-style torch dataset whose
    items are ``(input, target)`` pairs. ``data_loader``: a ``DataLoader`` over such a dataset;
    only its dataset and ``collate_fn`` are used (its batch size, sampler and shuffling are not:
    the private loader draws Poisson batches).

    Raises:
        DataError: neither or both given, mismatched lengths, an empty or iterable-only dataset,
            NaN/inf values.

    Example:
        >>> import torch
        >>> data = training_data(dataset=(torch.zeros(5, 3), torch.arange(5)))
        >>> data.n, [t.shape[0] for t in data.batch(torch.tensor([0, 4]))]
        (5, [2, 2])
        >>> training_data(dataset=(torch.zeros(5, 3), torch.arange(4)))
        Traceback (most recent call last):
        ...
        privopt.errors.DataError: dataset: 5 inputs but 4 targets (one target per record)
    """
    if (dataset is None) == (data_loader is None):
        raise DataError("pass exactly one of dataset= or data_loader= (the private training records)")
    collate = None
    if data_loader is not None:
        if not isinstance(data_loader, DataLoader):
            raise DataError(f"data_loader must be a torch DataLoader, got {type(data_loader).__name__}")
        dataset, collate, what = data_loader.dataset, data_loader.collate_fn, "data_loader.dataset"
    else:
        what = "dataset"
    if isinstance(dataset, Dataset):
        dataset.validate()
        return _tensor_pair(dataset.x_train, dataset.y_train, f"dataset {dataset.name!r}")
    if isinstance(dataset, (tuple, list)):
        if len(dataset) != 2:
            raise DataError(f"{what} as a sequence must be a pair (inputs, targets), got {len(dataset)} items")
        return _tensor_pair(*dataset, what)
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        if data_loader is None:
            return _tensor_pair(*dataset.tensors, what)
        _check_finite(*dataset.tensors, what)  # in memory: checked now, batched by the loader's collate_fn
        data = _collated(dataset, collate, what)
        data.targets = dataset.tensors[1]  # only picks the records probed before training
        return data
    if isinstance(dataset, IterableDataset) or not isinstance(dataset, TorchDataset):
        raise DataError(
            f"{what} must be a privopt Dataset, an (inputs, targets) pair of tensors or a map-style torch "
            f"Dataset, got {type(dataset).__name__}"
        )
    return _collated(dataset, collate, what)


class PoissonLoader:
    """Iterates over Poisson-sampled batches ``(inputs, targets)`` of the private training records.

    One pass yields the batches of one epoch; over ``epochs`` passes it yields exactly the
    ``steps`` batches the noise was calibrated for (epoch ``e`` ends when ``ceil((e+1)·steps/epochs)``
    batches have been drawn in total). Every batch it yields is handed to the paired
    :class:`~privopt.api.optimizer.DPOptimizer`, whose next ``step()`` releases its noisy gradient.
    Iterating further is allowed; the optimizer's budget guard refuses steps beyond the target ε.

    Attributes:
        sampling: the accountant's description, ``Poisson(rate=q)``.
        expected_batch_size: ``q·n``, the data-independent normaliser of the noisy gradient sum.
    """

    def __init__(self, data: TrainingData, *, rate: float, steps: int, epochs: float, rng, on_batch):
        self._data, self._steps, self._epochs = data, steps, epochs
        self._sampler = PoissonSampler(n=data.n, rate=rate, rng=rng)
        self._on_batch = on_batch
        self._drawn = 0  # batches drawn so far (over all passes)
        self._passes = 0

    @property
    def sampling(self):
        return self._sampler.sampling

    @property
    def expected_batch_size(self) -> float:
        return self._sampler.expected_batch_size

    def _end_of_pass(self, p: int) -> int:
        """Total batches drawn once pass ``p`` (0-based) is over."""
        end = math.ceil(round((p + 1) * self._steps / self._epochs, 9))
        if p + 1 >= self._epochs and p < math.ceil(self._epochs):  # the last planned (maybe partial) pass
            end = self._steps
        return max(end, self._drawn + 1)

    def __len__(self) -> int:
        """Batches in the next pass."""
        return self._end_of_pass(self._passes) - self._drawn

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        end = self._end_of_pass(self._passes)
        self._passes += 1
        while self._drawn < end:
            idx = self._sampler.sample()
            self._drawn += 1
            batch = self._data.batch(idx)
            self._on_batch(batch)
            yield batch
