"""Shared pieces of the second-order (Paper C) tests: a small 3-class problem and runs built on it."""

import torch

from privopt.config import RunConfig
from privopt.data import Dataset
from privopt.training import build_run

N, D, K = 600, 6, 3


def make_dataset(n=N, seed=0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    centers = 2.0 * torch.randn(K, D, generator=g)
    y = torch.randint(0, K, (n + 200,), generator=g)
    x = centers[y] + torch.randn(n + 200, D, generator=g)
    return Dataset.from_tensors(x[:n], y[:n], x_test=x[n:], y_test=y[n:], num_classes=K, name="blobs")


def config(algorithm, params, *, epsilon=2.0, seed=3, **extra) -> RunConfig:
    return RunConfig.from_dict(
        {
            "algorithm": algorithm,
            "algorithm_params": params,
            "model": "mlp",
            "model_params": {"hidden": 8},
            "engine": "vmap",
            "privacy": {"epsilon": epsilon, "delta": 1e-5},
            "insecure_seed": seed,
            **extra,
        }
    )


def build(algorithm, params, *, dataset=None, **kw):
    """A run ready to step (its algorithm set up), on the blobs unless ``dataset`` is given."""
    return build_run(config(algorithm, params, **kw), dataset=dataset or make_dataset())


def run_to_end(run, max_steps=None):
    """Step until the algorithm is done (or the schedule ends); returns the number of steps."""
    t = 0
    while t < run.total and not run.algo.done and (max_steps is None or t < max_steps):
        run.algo.step(t)
        t += 1
    run.algo.finalize()
    return t
