"""privopt.data: real-format dataset parsers, a dataset registry with seeded splits, and samplers.

Example:
    >>> from privopt.data import load_dataset, available_datasets
    >>> "mnist-st" in available_datasets()
    True
    >>> ds = load_dataset("breast-cancer", seed=1, val_fraction=0.1)
    >>> ds.input_shape, ds.num_classes
    ((30,), 2)
"""

from privopt.data.dataset import Dataset
from privopt.data.registry import (
    BuildContext,
    available_datasets,
    dataset_options,
    describe_datasets,
    load_dataset,
    register_dataset,
    resolve_data_dir,
)
from privopt.data.splits import shard_by_label
from privopt.sampling import DisjointPartition, PoissonSampler, WithoutReplacementSampler  # re-exported

__all__ = [
    "Dataset",
    "BuildContext",
    "available_datasets",
    "dataset_options",
    "describe_datasets",
    "load_dataset",
    "register_dataset",
    "resolve_data_dir",
    "PoissonSampler",
    "WithoutReplacementSampler",
    "DisjointPartition",
    "shard_by_label",
]
