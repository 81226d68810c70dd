"""privopt.data: real-format dataset parsers, a registry with per-record selection and public
preprocessing, group data, your own tensors as a Dataset, and samplers. Guide: ``docs/data.md``.

Example:
    >>> from privopt.data import load_dataset, available_datasets
    >>> "mnist-st" in available_datasets()
    True
    >>> ds = load_dataset("breast-cancer", seed=1, val_fraction=0.1)
    >>> ds.input_shape, ds.num_classes
    ((30,), 2)
"""

from privopt.data.dataset import Dataset
from privopt.data.preprocess import PrivatePreprocessingWarning
from privopt.data.public import PublicScaling
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
from privopt.data.user import ensure_dataset
from privopt.sampling import DisjointPartition, PoissonSampler, WithoutReplacementSampler  # re-exported

__all__ = [
    "Dataset",
    "ensure_dataset",
    "PrivatePreprocessingWarning",
    "PublicScaling",
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
