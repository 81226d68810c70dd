"""Audited training runs: canaries in, the real pipeline, scores and a bound out.

Every audited run is built by :func:`privopt.training.build_run` (the builder ``privopt train``
uses: calibration, ledger, secret randomness, the algorithm from the registry) and stepped by
:func:`privopt.training.run_loop`; only the run's files are not written. The canaries enter as
records of the training set (:class:`privopt.data.Dataset`), so the run treats them like any
other record: n counts them, the accountant calibrates for that n, the sampler samples them.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from privopt.audit.canaries import CANARY_LABEL, AuditModel, LinearAuditModel, with_id_column, wrong_labels
from privopt.audit.scores import WhiteBoxScorer, black_box_scores, release_kinds
from privopt.config import RunConfig
from privopt.errors import ConfigError

__all__ = ["CanaryRun", "load_base", "white_box_run", "black_box_run", "input_canaries"]


@dataclass
class CanaryRun:
    """One audited training run: per-canary scores and what the run accounted."""

    scores: np.ndarray
    epsilon: float
    delta: float
    n: int
    steps: int
    wall_time_s: float
    test_accuracy: float | None = None
    releases: dict[str, Any] = field(default_factory=dict)


def load_base(cfg: RunConfig):
    """The config's dataset, loaded as ``privopt train`` loads it (public preprocessing)."""
    from privopt.training.data_files import load_config_dataset

    return load_config_dataset(cfg)[0]  # a csv file of a config file: relative to its folder


def _with_records(base, extra: tuple, *, x_fn):
    """``base``'s training split plus the ``extra = (x, y, groups)`` records, as a user dataset;
    the features of ``base`` (both splits) mapped by ``x_fn``."""
    from privopt.data import Dataset

    x_extra, y_extra, g_extra = extra
    kw: dict[str, Any] = {}
    if base.g_train is not None:
        kw.update(groups=torch.cat([base.g_train, g_extra]), groups_test=base.g_test, group_names=base.group_names)
    return Dataset.from_tensors(
        torch.cat([x_fn(base.x_train), x_extra]),
        torch.cat([base.y_train, y_extra.to(torch.int64)]),
        x_test=x_fn(base.x_test),
        y_test=base.y_test,
        num_classes=base.num_classes,
        name=f"{base.name}+canaries",
        **kw,
    )


def _train(cfg: RunConfig, dataset, model=None, observer=None):
    """Build the run with privopt's builder and step it with privopt's loop; returns the Run."""
    from privopt.grads.release import observe_releases
    from privopt.training import LoopState, build_run, run_loop
    from privopt.training.callbacks import DivergenceGuard

    # The audit loaded the data (and built the model) with the config's params already.
    cfg = replace(cfg, dataset_params={}, model_params=cfg.model_params if model is None else {})
    run = build_run(cfg, dataset=dataset, model=model)
    if run.ledger is None:
        raise ConfigError(f"algorithm {cfg.algorithm!r} is not private: there is no privacy claim to audit")
    state = LoopState(step=0, total=run.total)
    if observer is None:
        run_loop(run.algo.step, state, [DivergenceGuard(run.model)])
    else:
        with observe_releases(observer):
            run_loop(run.algo.step, state, [DivergenceGuard(run.model)])
    run.algo.finalize()
    return run


def _accuracy(model, x, y) -> float | None:
    if len(y) == 0:
        return None
    with torch.no_grad():
        out = model(x)
        pred = (out[:, 0] > 0).long() if out.shape[1] == 1 else out.argmax(dim=1)  # one logit: class 1's
        return float((pred == y).float().mean())


def _gradient_canaries(cfg: RunConfig, base, algo, included: torch.Tensor):
    """The audit model, the training data with the included canaries, and the model whose test
    accuracy is reported: head canaries (:class:`AuditModel`) for algorithms that train the model
    through its gradients, linear canaries (:class:`LinearAuditModel`) for the closed-form linear
    ERM algorithms, which read the features and one linear weight, never the model's forward."""
    from privopt.algorithms.erm_common import LinearERMAlgorithm
    from privopt.models import build_model

    m = int(included.numel())
    torch.manual_seed(cfg.seed)  # public: the model's initialisation, as in privopt train
    inner = build_model(cfg.model, input_shape=base.input_shape, num_classes=base.num_classes, **cfg.model_params)
    numbers = torch.nonzero(included).squeeze(1) + 1
    if isinstance(algo, LinearERMAlgorithm):
        model = LinearAuditModel(inner, canaries=m, clip=algo.config.clip)
        x_extra, x_fn = model.canary_records(numbers), model.extend
        accuracy = lambda: _accuracy(model, model.extend(base.x_test), base.y_test)
    else:
        model = AuditModel(inner, input_shape=base.input_shape, canaries=m)
        x_extra, x_fn = with_id_column(torch.zeros(len(numbers), *base.input_shape), numbers), with_id_column
        accuracy = lambda: _accuracy(inner, base.x_test, base.y_test)
    extra = (x_extra, torch.full((len(numbers),), CANARY_LABEL), torch.zeros(len(numbers), dtype=torch.int64))
    data = _with_records(base, extra, x_fn=x_fn)  # gradient canaries join group 0 (public)
    return model, data, accuracy


def white_box_run(
    cfg: RunConfig, base, included: torch.Tensor, *, families: Collection[str] | None = None
) -> CanaryRun:
    """One run with ``len(included)`` gradient canaries (those flagged True inserted); scores from
    the released noisy gradients (only those of ``families`` when given, e.g. ``{"x-diff"}`` to
    audit the difference queries alone)."""
    from privopt.algorithms import get_algorithm

    algo = get_algorithm(cfg.algorithm, **cfg.algorithm_params)
    model, data, accuracy = _gradient_canaries(cfg, base, algo, included)
    t0 = time.perf_counter()
    kinds = release_kinds(algo.release_plan(data.n_train))
    if families is not None:
        kinds = {name: kind if name in families else "other" for name, kind in kinds.items()}
    scorer = WhiteBoxScorer(model, kinds)
    run = _train(cfg, data, model=model, observer=scorer)
    if not scorer.used:
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} made no release the white-box audit can score "
            f"(seen: {sorted(scorer.skipped)}); use the black-box audit"
        )
    return _finish(run, scorer.scores.numpy(), t0, accuracy(), releases=scorer.summary())


def input_canaries(base, count: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first ``count`` test inputs with a wrong label drawn from ``seed`` (public canaries):
    ``(x, wrong label, true label)``."""
    if len(base.y_test) < 2:
        raise ConfigError(f"dataset {base.name!r} has too small a test split to draw input canaries from")
    k = min(count, len(base.y_test))
    gen = torch.Generator().manual_seed(seed)
    y_true = base.y_test[:k]
    return base.x_test[:k], wrong_labels(y_true, num_classes=base.num_classes, generator=gen), y_true


def black_box_run(cfg: RunConfig, base, canaries: tuple, included) -> CanaryRun:
    """One run with input canaries (those flagged True inserted); scores from the released model.
    The test split stays as it is (its inputs carry their true labels there)."""
    x_c, y_c, y_true = canaries
    g_c = None if base.g_test is None else base.g_test[: len(y_c)][included]
    data = _with_records(base, (x_c[included], y_c[included], g_c), x_fn=lambda x: x)
    t0 = time.perf_counter()
    run = _train(cfg, data)
    scores = black_box_scores(run.model, run.loss_fn, x_c, y_c, reference=y_true)
    return _finish(run, scores, t0, _accuracy(run.model, base.x_test, base.y_test))


def _finish(run, scores, t0: float, acc, *, releases=None) -> CanaryRun:
    return CanaryRun(
        scores=np.asarray(scores, dtype=np.float64),
        epsilon=float(run.ledger.epsilon()),
        delta=float(run.cfg.privacy.delta),
        n=run.n,
        steps=int(run.total),
        wall_time_s=time.perf_counter() - t0,
        test_accuracy=acc,
        releases=releases or {},
    )
