"""``PrivacyEngine``: DP-SGD inside your own training loop.

:meth:`PrivacyEngine.make_private` takes your module, optimizer and data, calibrates the noise
exactly for the target (ε, δ) and the planned number of steps, opens a privacy ledger whose
budget guard refuses any step beyond the target, and returns the module, a
:class:`~privopt.api.optimizer.DPOptimizer` and a :class:`~privopt.api.loader.PoissonLoader`.
It is DP-SGD exactly as ``privopt train --set algorithm=dp-sgd`` runs it (same calibration,
sampling, clipping and update); see ``docs/api.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from privopt.api.guards import claim
from privopt.api.loader import PoissonLoader, TrainingData, training_data
from privopt.api.losses import LossFn, per_sample_loss
from privopt.api.optimizer import DPOptimizer, check_optimizer
from privopt.errors import ConfigError, ModelError, known_keywords
from privopt.grads import get_engine, validate_model
from privopt.privacy import Calibration, Inventory, PlannedStep, Poisson, PrivacyLedger, calibrate
from privopt.privacy.checks import check_accountant, check_count, check_delta_for_size, check_epsilon, is_real
from privopt.training.builder import check_model_fits, run_sources

__all__ = ["PrivacyEngine"]


def _schedule(*, batch_size: Any, sample_rate: Any, epochs: float, n: int) -> tuple[float, float, int]:
    """``(q, expected batch size, steps)`` from exactly one of ``batch_size`` / ``sample_rate``, as
    DP-SGD plans it (:mod:`privopt.algorithms.dpsgd`): ``ceil(epochs·n/b)`` steps at rate ``b/n``."""
    if (batch_size is None) == (sample_rate is None):
        raise ConfigError(
            "pass exactly one of batch_size= (expected Poisson batch size) or sample_rate= (probability that a "
            "record is in a batch); privopt never infers the rate from a data loader"
        )
    if batch_size is not None:
        b = check_count(batch_size, name="batch_size", minimum=1)
        if b > n:
            raise ConfigError(f"batch_size={b} exceeds the number of training records n={n}")
        return b / n, float(b), max(1, math.ceil(epochs * n / b))
    if not is_real(sample_rate) or not 0 < float(sample_rate) <= 1:
        raise ConfigError(f"sample_rate must be a number in (0, 1], got {sample_rate!r}")
    q = float(sample_rate)
    return q, q * n, max(1, math.ceil(round(epochs / q, 9)))


# Arguments of Opacus's make_private(_with_epsilon) a user brings along, and what they are here.
_OPACUS_HINTS = {
    "noise_multiplier": "privopt calibrates the noise exactly from epsilon= and delta= for the planned epochs "
    "(engine.noise_multiplier reports it after make_private)",
    "target_epsilon": "pass epsilon=",
    "target_delta": "pass delta=",
    "poisson_sampling": "batches are always Poisson-sampled, at batch_size= / sample_rate=",
    "grad_sample_mode": "the per-example gradient engine is PrivacyEngine(engine=...)",
    "engine": "the per-example gradient engine is chosen when the engine is made: PrivacyEngine(engine=...)",
    "clipping": "clipping is per example with one threshold, max_grad_norm=",
}


@dataclass(frozen=True)
class _Request:
    """What :meth:`PrivacyEngine.make_private` was asked for, checked and resolved once."""

    module: nn.Module
    optimizer: Any  # the user's torch optimizer, checked to update only ``module``'s parameters
    loss_fn: LossFn  # per example, from ``criterion``
    data: TrainingData
    epsilon: float
    delta: float
    clip: float  # max_grad_norm
    epochs: float
    rate: float  # Poisson sampling rate q
    expected_batch_size: float
    steps: int
    chunk: int | None  # max_physical_batch_size

    @classmethod
    def checked(
        cls,
        engine: Any,
        *,
        module: Any,
        optimizer: Any,
        epsilon: Any,
        delta: Any,
        epochs: Any,
        max_grad_norm: Any,
        dataset: Any,
        data_loader: Any,
        batch_size: Any,
        sample_rate: Any,
        criterion: Any,
        allow_large_delta: bool,
        max_physical_batch_size: Any,
    ) -> _Request:
        """``make_private``'s arguments checked in the documented order, nothing computed on the data
        before they pass; ``engine`` computes the per-example gradients of the probe."""
        if not isinstance(module, nn.Module):
            raise ModelError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        validate_model(module)
        optimizer = check_optimizer(optimizer, module)
        epsilon, clip = check_epsilon(epsilon), check_epsilon(max_grad_norm, name="max_grad_norm")
        epochs = check_epsilon(epochs, name="epochs")
        chunk = max_physical_batch_size
        if chunk is not None:
            chunk = check_count(chunk, name="max_physical_batch_size (None or a positive int)", minimum=1)
        data = training_data(dataset=dataset, data_loader=data_loader)
        delta = check_delta_for_size(
            delta, dataset_size=data.n, allow_large=allow_large_delta, override="allow_large_delta=True"
        )
        rate, expected, steps = _schedule(batch_size=batch_size, sample_rate=sample_rate, epochs=epochs, n=data.n)
        loss_fn = per_sample_loss(criterion)
        two = data.batch(data.probe_indices())  # per-example gradients too: fail here, not at a step
        check_model_fits(module, loss_fn, *two, what="the training inputs", engine=engine)
        return cls(module, optimizer, loss_fn, data, epsilon, delta, clip, epochs, rate, expected, steps, chunk)


class PrivacyEngine:
    """DP-SGD for your own training loop: Poisson batches, per-example clipping, calibrated noise.

    Each engine has its own ledger and budget, so a module (or optimizer) made private once is
    refused by any later ``make_private``: a second engine would hide the ε already spent on it.

    Args:
        accountant: ``"auto"`` (default: the smaller ε of PLD and RDP), ``"pld"`` or ``"rdp"``.
        engine: per-example gradient engine (:func:`privopt.grads.get_engine`; ``"auto"``: ghost).
        insecure_seed: seed the noise and the batch sampling (reproducible, but anyone who knows
            the seed can replay the noise: NOT private). Default: secret OS-entropy randomness.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> import privopt
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(500, 4, generator=g)
        >>> y = (x[:, 0] > 0.5).long()
        >>> model = nn.Linear(4, 2)
        >>> engine = privopt.PrivacyEngine()
        >>> model, optimizer, loader = engine.make_private(
        ...     module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), dataset=(x, y),
        ...     batch_size=50, epochs=2, epsilon=1.0, delta=1e-4, max_grad_norm=1.0)
        >>> for epoch in range(2):
        ...     for xb, yb in loader:
        ...         optimizer.zero_grad()
        ...         nn.functional.cross_entropy(model(xb), yb).backward()
        ...         optimizer.step()
        >>> engine.steps_taken, engine.get_epsilon() <= 1.0
        (20, True)
    """

    def __init__(self, *, accountant: str = "auto", engine: str = "auto", insecure_seed: int | None = None):
        self._accountant = check_accountant(accountant)
        self._engine = get_engine(engine)
        # As in ``privopt train``: the next step's noise is drawn in a background thread while the
        # user's loop and the engine run, with the same values in the same order (docs/engines.md).
        self._sources = run_sources(insecure_seed)
        self.insecure_seed = insecure_seed
        self._ledger: PrivacyLedger | None = None
        self._calibration: Calibration | None = None
        self._optimizer: DPOptimizer | None = None
        self._planned_steps = 0

    # ------------------------------------------------------------------ what has been spent
    @property
    def accountant(self) -> PrivacyLedger:
        """The privacy ledger of the training (every step is recorded before its noise is drawn)."""
        if self._ledger is None:
            raise ConfigError("call make_private(...) first")
        return self._ledger

    def get_epsilon(self) -> float:
        """ε spent so far, at the target δ (never above the target: the ledger refuses such a step)."""
        return self.accountant.epsilon()

    @property
    def calibration(self) -> Calibration:
        """The calibration: noise multiplier, the ε it achieves over all planned steps, accountant."""
        if self._calibration is None:
            raise ConfigError("call make_private(...) first")
        return self._calibration

    @property
    def noise_multiplier(self) -> float:
        """z: the noise std on the clipped gradient sum is ``z · max_grad_norm``."""
        return self.calibration.noise["grad"]

    @property
    def planned_steps(self) -> int:
        return self._planned_steps

    @property
    def steps_taken(self) -> int:
        return 0 if self._optimizer is None else self._optimizer.steps_taken

    # ------------------------------------------------------------------ building
    # The signature and the call packed: the docstring alone takes 41 of the 60 lines a function may have.
    # fmt: off
    @known_keywords(_OPACUS_HINTS)
    def make_private(
        self, *, module: nn.Module, optimizer: Any, epsilon: float, delta: float, epochs: float,
        max_grad_norm: float, dataset: Any = None, data_loader: Any = None, batch_size: int | None = None,
        sample_rate: float | None = None, criterion: Any = None, allow_large_delta: bool = False,
        max_physical_batch_size: int | None = None,
    ) -> tuple[nn.Module, DPOptimizer, PoissonLoader]:
        """Calibrate, open the ledger, and return ``(module, optimizer, data_loader)`` for your loop.

        Args:
            module: your ``nn.Module`` (returned unchanged; no layer may mix examples, e.g. BatchNorm).
            optimizer: a torch optimizer over ``module``'s parameters (SGD, Adam, ...; frozen ones stay as they are).
            epsilon: target ε (> 0). The noise is calibrated so that ``epochs`` passes spend at most it.
            delta: target δ, below 1/n (``allow_large_delta=True`` to override).
            epochs: planned passes (may be fractional): ``ceil(epochs / q)`` steps, ``q`` the sampling rate.
            max_grad_norm: per-example clipping threshold C (the L2 sensitivity of each step's sum).
            dataset: the training records: a :class:`privopt.data.Dataset`, an ``(inputs, targets)``
                pair of tensors, or a map-style torch dataset of ``(input, target)`` items.
            data_loader: instead of ``dataset``: a ``DataLoader`` whose dataset (and ``collate_fn``)
                are used; its own batching is replaced by Poisson sampling.
            batch_size: expected batch size b (``q = b / n``); or
            sample_rate: ``q`` directly (expected batch size ``q·n``).
            criterion: the loss whose per-example gradients are clipped: ``None`` (cross-entropy),
                a torch loss module (``reduction`` is set to ``"none"`` on a copy) or a callable
                returning one loss per example. ``step()`` uses it, not the loss of your loop.
            allow_large_delta: accept δ ≥ 1/n (such a δ lets a mechanism publish a record).
            max_physical_batch_size: ``None`` (default) or a positive int: ``step()`` computes the
                clipped sum of each Poisson batch in chunks of at most this many records, to bound
                memory. Same batch, one noise draw, one ledger charge: only the summation order changes.

        Returns ``(module, optimizer, data_loader)``: call ``optimizer.step()`` once per batch. Raises
        ConfigError, DataError or ModelError for an invalid argument (named), before anything is
        computed on the data.

        Example:
            >>> import torch, privopt
            >>> x = torch.rand(1000, 4, generator=torch.Generator().manual_seed(0))
            >>> model, y = torch.nn.Linear(4, 2), (x[:, 0] > 0.5).long()
            >>> engine = privopt.PrivacyEngine()
            >>> model, optimizer, loader = engine.make_private(
            ...     module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), dataset=(x, y),
            ...     batch_size=500, epochs=1, epsilon=1.0, delta=1e-4, max_grad_norm=1.0, max_physical_batch_size=64)
            >>> for xb, yb in loader:  # ~500 records per batch, clipped and summed 64 at a time
            ...     optimizer.step()
            >>> engine.steps_taken, engine.accountant.num_steps
            (2, 2)
        """
        if self._ledger is not None:
            raise ConfigError("this PrivacyEngine already made a training private; use a new engine for another")
        request = _Request.checked(
            self._engine, module=module, optimizer=optimizer, epsilon=epsilon, delta=delta, epochs=epochs,
            max_grad_norm=max_grad_norm, dataset=dataset, data_loader=data_loader, batch_size=batch_size,
            sample_rate=sample_rate, criterion=criterion, allow_large_delta=allow_large_delta,
            max_physical_batch_size=max_physical_batch_size,
        )
        dp_optimizer = self._attach(request)
        loader = PoissonLoader(
            request.data, rate=request.rate, steps=request.steps, epochs=request.epochs,
            rng=self._sources["sampler"], on_batch=dp_optimizer._set_batch, on_pass_end=dp_optimizer._pass_ended,
        )
        return request.module, dp_optimizer, loader
    # fmt: on

    def _attach(self, request: _Request) -> DPOptimizer:
        """Calibrate the noise for the request's Poisson schedule and (ε, δ) target, open the ledger,
        wrap the optimizer."""
        inventory = Inventory((PlannedStep(Poisson(request.rate), (("grad", 1.0),), request.steps),))
        cal = calibrate(inventory, epsilon=request.epsilon, delta=request.delta, accountant=self._accountant)
        ledger = PrivacyLedger(
            delta=request.delta,
            accountant=self._accountant,
            target_epsilon=request.epsilon,
            planned=inventory.steps_for(cal.noise),
        )
        dp_optimizer = DPOptimizer(
            request.optimizer,
            module=request.module,
            loss_fn=request.loss_fn,
            engine=self._engine,
            ledger=ledger,
            sampling=Poisson(request.rate),
            noise_multiplier=cal.noise["grad"],
            max_grad_norm=request.clip,
            expected_batch_size=request.expected_batch_size,
            noise_rng=self._sources["noise"],
            max_physical_batch_size=request.chunk,
        )
        self._ledger, self._calibration, self._optimizer = ledger, cal, dp_optimizer
        self._planned_steps = request.steps
        claim(
            request.module,
            request.optimizer,
            lambda: f"by a PrivacyEngine that spent epsilon={ledger.epsilon():.4g} so far",
        )
        return dp_optimizer

    def __repr__(self) -> str:
        if self._ledger is None:
            return f"PrivacyEngine(accountant={self._accountant!r}, not yet used)"
        return (
            f"PrivacyEngine(steps={self.steps_taken}/{self._planned_steps}, epsilon_spent={self.get_epsilon():.4g}, "
            f"target={self._ledger.target_epsilon:g}, delta={self._ledger.delta:g})"
        )
