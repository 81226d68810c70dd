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
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
from torch.utils.data import Dataset as TorchDataset

from privopt.data.dataset import Dataset
from privopt.errors import DataError, PrivoptWarning
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
        _warn_own_sampler(data_loader)
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


def _warn_own_sampler(loader: DataLoader) -> None:
    """Batch size and shuffling are replaced as documented; a sampler of the user's own (e.g. a
    ``WeightedRandomSampler`` balancing a rare class) changes what is trained, so it is named."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    own = [type(loader.sampler).__name__] if type(loader.sampler) not in (SequentialSampler, RandomSampler) else []
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        own.append(type(loader.batch_sampler).__name__)
    if own:
        warnings.warn(
            f"data_loader's {' and '.join(own)} is not used: the private loader draws Poisson batches (every "
            "record with probability q), the sampling the noise is calibrated for; to weight records (e.g. a "
            "rare class), weight the loss instead, e.g. criterion=nn.CrossEntropyLoss(weight=...)",
            PrivoptWarning,
            stacklevel=4,
        )


class PoissonLoader:
    """Iterates over Poisson-sampled batches ``(inputs, targets)`` of the private training records.

    Each ``for`` over the loader (each ``iter()``) is one pass, an epoch. Pass ``e`` of the plan
    yields ``ceil((e+1)·steps/epochs) − ceil(e·steps/epochs)`` batches and the last planned pass
    ends at ``steps`` (a fractional ``epochs`` makes it shorter), so ``epochs`` passes yield exactly
    the ``steps`` batches the noise was calibrated for. Iterating further is allowed (passes beyond
    the plan repeat the plan's rhythm from ``steps`` on); the optimizer's budget guard refuses the
    steps beyond the target ε. Every batch it yields is handed to the paired
    :class:`~privopt.api.optimizer.DPOptimizer`, whose next ``step()`` releases its noisy gradient.

    A pass left early (``break``, or an exception such as the budget guard's
    ``PrivacyBudgetExceeded``) is over: the next ``iter()`` starts the next pass, and an iterator of
    an earlier pass yields nothing more. Its batches not drawn cost nothing (as a torch
    ``DataLoader`` starts a new epoch at each ``iter()``).

    ``len(loader)`` is the number of batches the next pass yields, i.e. of the next ``for`` over the
    loader: ``len(loader) == len(list(loader))`` holds at any time, also during a pass (it then
    counts the next one, which differs from the current one by at most a batch, unless one of them
    is the short last pass of a fractional ``epochs``) and after the budget guard refused a step
    (the refused batch's pass is over). It never depends on the batches drawn (their sizes are
    private).

    Attributes:
        sampling: the accountant's description, ``Poisson(rate=q)``.
        expected_batch_size: ``q·n``, the data-independent normaliser of the noisy gradient sum.
    """

    def __init__(self, data: TrainingData, *, rate: float, steps: int, epochs: float, rng, on_batch, on_pass_end=None):
        self._data, self._steps, self._epochs = data, steps, epochs
        self._sampler = PoissonSampler(n=data.n, rate=rate, rng=rng)
        self._on_batch, self._on_pass_end = on_batch, on_pass_end
        self._passes = 0  # passes started (the next pass's 0-based index)

    @property
    def sampling(self):
        return self._sampler.sampling

    @property
    def expected_batch_size(self) -> float:
        return self._sampler.expected_batch_size

    def _pass_size(self, p: int) -> int:
        """Batches of pass ``p`` (0-based): the plan's passes, then the same rhythm from ``steps`` on."""
        planned = math.ceil(self._epochs)
        if p >= planned:
            p -= planned
        elif p == planned - 1:  # the last planned (maybe partial) pass ends the plan
            return self._steps - self._mark(p)
        return self._mark(p + 1) - self._mark(p)

    def _mark(self, p: int) -> int:
        """Batches of the plan's rhythm in its first ``p`` passes."""
        return math.ceil(round(p * self._steps / self._epochs, 9))

    def __len__(self) -> int:
        """Batches the next pass yields (the next ``for`` over the loader); see the class docstring."""
        return self._pass_size(self._passes)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        size = self._pass_size(self._passes)
        self._passes += 1  # now, not at the first next(): len() counts the pass after this one
        return self._pass(self._passes, size)

    def _pass(self, started: int, size: int) -> Iterator[tuple[Any, Any]]:
        for _ in range(size):
            if self._passes != started:  # a later pass has started: this one is over
                return
            idx = self._sampler.sample()
            batch = self._data.batch(idx)
            self._on_batch(batch)
            yield batch
        if size and self._on_pass_end is not None:  # a whole pass: public (its size is the plan's)
            self._on_pass_end(size)
