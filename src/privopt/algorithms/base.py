"""The algorithm contract: a short composition of estimators, an update and a release plan.

The shared training loop (:mod:`privopt.training`) owns everything else: data sampling seeds,
evaluation, logging, checkpoints, the privacy ledger and the budget guard. An algorithm

1. declares its *planned* noisy steps (:meth:`Algorithm.inventory`, derived from its
   :class:`~privopt.algorithms.releases.ReleasePlan`) so noise can be calibrated exactly from a
   target (epsilon, delta) before any data is touched;
2. receives a :class:`RunContext` in :meth:`Algorithm.setup` (model, loss, data, engine, ledger,
   calibrated noise multipliers, seeded generators);
3. performs one iteration per :meth:`Algorithm.step`, recording every release in ``ctx.ledger``
   through :class:`privopt.grads.release.PrivateBatch` BEFORE drawing its noise (the plan's
   runtime opens those batches and refuses releases the plan does not declare);
4. exposes its resumable state (:meth:`state_dict` / :meth:`load_state_dict`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from privopt.algorithms.config import AlgorithmConfig
from privopt.algorithms.releases import PlanRun, ReleasePlan
from privopt.errors import ConfigError
from privopt.registry import Registry
from privopt.rng import RandomSource, as_source

__all__ = ["Algorithm", "RunContext", "register_algorithm", "get_algorithm", "available_algorithms"]


@dataclass
class RunContext:
    """What the training loop hands an algorithm.

    Attributes:
        model: the ``nn.Module`` being trained (already validated for DP use).
        loss_fn: per-sample loss ``(outputs, targets) -> [B]``.
        x_train, y_train: the private training set (tensors; indices are sampled by the algorithm
            through ``ctx.sampler_rng``).
        engine: the per-sample gradient engine (:func:`privopt.grads.get_engine`).
        ledger: the run's :class:`privopt.privacy.PrivacyLedger` (``None`` for non-private runs).
        noise: calibrated noise multipliers by mechanism name (from the inventory).
        noise_rng: dedicated source of privacy noise (never used for anything else; a
            :class:`privopt.rng.RandomSource`, secret unless the run opted into an insecure seed).
        sampler_rng: source for batch sampling and data-independent random choices (same kind).

    A plain ``torch.Generator`` given for either is wrapped (insecure, reproducible).
    """

    model: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    x_train: torch.Tensor
    y_train: torch.Tensor
    engine: Any
    ledger: Any
    noise: dict[str, float]
    noise_rng: RandomSource
    sampler_rng: RandomSource
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.noise_rng = as_source(self.noise_rng)
        self.sampler_rng = as_source(self.sampler_rng)

    @property
    def n(self) -> int:
        return int(self.x_train.shape[0])


class Algorithm(abc.ABC):
    """Base class of every optimiser.

    Subclasses set ``name`` and ``Config`` (an :class:`~privopt.algorithms.config.AlgorithmConfig`)
    and register with :func:`register_algorithm`. They are built from keyword hyper-parameters
    (``DPSGD(lr=0.5)``) or from a config object (``DPSGD(config=cfg)``); either way ``self.config``
    holds the frozen, validated hyper-parameters, which is what the run record stores.
    """

    name: ClassVar[str] = "abstract"
    private: ClassVar[bool] = True
    summary: ClassVar[str] = ""
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig

    def __init__(self, *, config: AlgorithmConfig | None = None, **params: Any):
        if config is None:
            config = self.Config.from_params(params)
        elif params:
            raise ConfigError(f"pass either config= or keyword hyper-parameters to {self.name!r}, not both")
        elif not isinstance(config, self.Config):
            raise ConfigError(f"{self.name!r} needs a {self.Config.__name__}, got {type(config).__name__}")
        self.config = config
        # A DP algorithm run with ``private=False`` makes the same clipped updates without noise.
        self.private = type(self).private and bool(getattr(config, "private", True))

    def release_plan(self, n: int) -> ReleasePlan | None:
        """Every noisy release of a run on ``n`` records, declared once
        (:class:`~privopt.algorithms.releases.ReleasePlan`); ``None`` when nothing is released."""
        return None

    def inventory(self, *, n: int) -> Any:
        """Planned noisy steps for a dataset of ``n`` records (a :class:`privopt.privacy.Inventory`,
        derived from :meth:`release_plan`); ``None`` for non-private algorithms."""
        plan = self.release_plan(n) if self.private else None
        return None if plan is None else plan.inventory()

    def _bind_releases(self, ctx: RunContext) -> None:
        """Bind the release plan to the run: ``self.releases`` opens batches and counts releases."""
        plan = self.release_plan(ctx.n)
        self.releases = None if plan is None else PlanRun(plan, ctx, private=self.private)

    @abc.abstractmethod
    def setup(self, ctx: RunContext) -> None:
        """Bind to a run (called once, before :meth:`step` or :meth:`load_state_dict`)."""

    @abc.abstractmethod
    def num_steps(self) -> int:
        """Total number of iterations the loop will call :meth:`step` for (after :meth:`setup`)."""

    def steps_for(self, *, n: int) -> int:
        """Iterations planned for a dataset of ``n`` records, before :meth:`setup` (for schedules
        and budgets computed ahead of a run). Algorithms override it when they can say."""
        raise NotImplementedError(f"{type(self).__name__} does not report its step count ahead of setup")

    @abc.abstractmethod
    def step(self, t: int) -> dict[str, float]:
        """Iteration ``t`` (0-based). Returns scalars to log (e.g. ``{"train_loss": ...}``);
        they must be data-independent or already privatised for private algorithms."""

    def state_dict(self) -> dict[str, Any]:
        """Estimator state to checkpoint (model parameters are saved by the loop)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def finalize(self) -> None:
        """Called once after the last step (e.g. load a randomly selected iterate into the model)."""

    def hyperparameters(self) -> dict[str, Any]:
        """All hyper-parameters, for the run record (the config as a dict)."""
        return self.config.to_dict()


_ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make an :class:`Algorithm` subclass available by its own ``name`` to configs,
    :func:`privopt.fit` and the CLI of the process that registers it. A subclass that does not set
    ``name`` itself (it would inherit its parent's) is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"register_algorithm needs an Algorithm subclass, got {cls!r}")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"register_algorithm: {cls.__name__} needs its own class attribute `name` (a string)")
    return _ALGORITHMS.register(cls)


def available_algorithms() -> dict[str, type[Algorithm]]:
    import privopt.algorithms  # noqa: F401  (registers the built-ins)

    return _ALGORITHMS.entries()


def get_algorithm(name: str, **hparams: Any) -> Algorithm:
    """Build a registered algorithm; unknown names and unknown hyper-parameters fail clearly."""
    available_algorithms()  # registers the built-ins
    return _ALGORITHMS.lookup(name)(**hparams)
