"""The DP optimizer of :meth:`privopt.PrivacyEngine.make_private`: one noisy release per step.

``step()`` takes the batch the private loader yielded last and

1. records the step in the privacy ledger (the budget guard refuses it, before anything is
   computed, if it would push ε above the target);
2. computes the sum of per-example gradients of ``criterion(module(x), y)``, each clipped to
   ``max_grad_norm``, with a privopt gradient engine (:func:`privopt.grads.get_engine`),
   in chunks of at most ``max_physical_batch_size`` records when one was given: the same sum,
   up to the order of the float additions, with bounded memory;
3. adds Gaussian noise of std ``z·max_grad_norm`` from the engine's noise source and divides by
   the EXPECTED batch size (never the realised one, which is private);
4. writes that gradient into ``.grad`` and steps the wrapped torch optimizer (any optimizer:
   what it does with a released gradient is post-processing).

Whatever ``.grad`` held before (e.g. from the user's ``loss.backward()``) is replaced, so a
non-private gradient never reaches the update. A ``backward()`` on a second batch before
``step()`` (gradient accumulation) and a model changed since ``make_private`` are refused
(:mod:`privopt.api.guards`). See ``docs/api.md``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from privopt.api.guards import ACCUMULATION, AGAIN, AccumulationGuard, ModelFingerprint, check_unclaimed
from privopt.errors import ConfigError, PrivoptWarning
from privopt.grads.flat import set_flat_grad, trainable_parameters, zero_flat
from privopt.grads.release import PrivateBatch
from privopt.grads.sums import BoundedSum, chunked_clipped_sum

__all__ = ["DPOptimizer"]


_FOREIGN = (
    "the optimizer updates a parameter that is not a parameter of the module: every updated "
    "parameter must get its gradient through per-example clipping (build the optimizer from "
    "module.parameters(); frozen ones, requires_grad=False, may be in it: they are not updated)"
)


def check_optimizer(optimizer: Any, module: nn.Module) -> torch.optim.Optimizer:
    """The optimizer must update only the module's parameters, with a finite learning rate; frozen
    ones get no gradient, so ``step()`` leaves them as they are (``torch.optim.SGD(model.parameters())``
    with a frozen backbone). Neither the optimizer nor the module may have been made private already
    (:func:`~privopt.api.guards.check_unclaimed`)."""
    if isinstance(optimizer, DPOptimizer):
        raise ConfigError(f"the optimizer is a DPOptimizer returned by make_private: {AGAIN}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer must be a torch.optim.Optimizer over the module, got {type(optimizer).__name__}")
    own = {id(p) for p in module.parameters()}
    for group in optimizer.param_groups:
        lr = group.get("lr")
        if lr is not None and not (isinstance(lr, (int, float, torch.Tensor)) and math.isfinite(float(lr))):
            raise ConfigError(f"the optimizer's learning rate must be a finite number, got {lr!r}")
        if any(id(p) not in own for p in group["params"]):
            raise ConfigError(_FOREIGN)
    check_unclaimed(module, optimizer)
    return optimizer


class DPOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer; ``step()`` applies DP-SGD's noisy clipped gradient of the last batch.

    Built by :meth:`privopt.PrivacyEngine.make_private`; shares ``param_groups`` and ``state``
    with the wrapped optimizer, so learning-rate schedulers work on it.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        module: nn.Module,
        loss_fn: Callable,
        engine: Any,
        ledger: Any,
        sampling: Any,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: float,
        noise_rng: Any,
        max_physical_batch_size: int | None = None,
    ):
        # No Optimizer.__init__: it would build new param groups; these are the wrapped optimizer's.
        self.original_optimizer = optimizer
        self.param_groups, self.state, self.defaults = optimizer.param_groups, optimizer.state, optimizer.defaults
        self._module, self._loss_fn, self._engine, self._ledger = module, loss_fn, engine, ledger
        self._sampling, self._z, self._clip = sampling, float(noise_multiplier), float(max_grad_norm)
        self._normalizer, self._noise_rng = float(expected_batch_size), noise_rng
        self._chunk = max_physical_batch_size
        self._pending: tuple[Any, Any] | None = None
        # Accumulation guard: batches drawn, and the draw of the user's last backward() since step/zero_grad.
        self._draws, self._backward_draw, self._in_step = 0, None, False
        self._step_draw = 0  # the draw the last step() released (a pass without one is warned about)
        self._hook = module.register_forward_hook(AccumulationGuard(self))
        self._fingerprint = ModelFingerprint(module)  # after its own hook: another one is the user's

    @property
    def steps_taken(self) -> int:
        """Steps charged to the ledger: read from it, so also a step that failed after its charge
        (the failure may depend on the private batch) is counted."""
        return self._ledger.num_steps

    def _set_batch(self, batch: tuple[Any, Any]) -> None:
        """Called by the private loader with each batch it yields."""
        self._pending = batch
        self._draws += 1

    def _pass_ended(self, batches: int) -> None:
        """Called by the private loader after a whole pass: none of its batches stepped is a forgotten
        ``step()`` (the loop trained nothing), which would otherwise pass silently."""
        if self._draws - batches >= self._step_draw:
            warnings.warn(
                f"a whole pass over the private loader ({batches} batches) had no optimizer.step(): nothing was "
                "trained nor charged to the budget (call optimizer.step() after each batch)",
                PrivoptWarning,
                stacklevel=3,
            )

    def _on_backward(self, grad: torch.Tensor) -> None:
        """Hook on the module's output: the user's ``backward()`` reached the module."""
        if self._in_step:
            return
        earlier = self._backward_draw not in (None, self._draws)
        # model.zero_grad() (grads set to None) also ends the earlier batch's backward.
        if earlier and any(p.grad is not None for p in trainable_parameters(self._module)):
            raise ConfigError(ACCUMULATION)
        self._backward_draw = self._draws

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's, for parameters of the module only (trainable ones get the released gradient)."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        own = {id(p) for p in self._module.parameters()}
        if any(id(p) not in own for p in params):
            raise ConfigError(_FOREIGN)
        self.original_optimizer.add_param_group({**param_group, "params": params})

    def _guard_updates(self) -> None:
        """Before the step is charged: the optimizer must update nothing that does not get the
        released gradient. A parameter frozen since ``make_private`` gets none: its ``.grad``
        (e.g. from the user's ``backward()``, not private) is cleared so it is not updated."""
        trainable = {id(p) for p in trainable_parameters(self._module)}
        if not trainable:
            raise ConfigError("the module has no trainable parameter left: there is nothing to release a gradient for")
        module_params = {id(p) for p in self._module.parameters()}
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in module_params:
                    raise ConfigError(_FOREIGN)
                if id(p) not in trainable:
                    p.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none=set_to_none)
        self._backward_draw = None

    def state_dict(self) -> dict[str, Any]:
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.original_optimizer.load_state_dict(state_dict)

    def _release(self, batch: PrivateBatch, x: Any, y: Any) -> None:
        """The charged step: clipped sum, noise, ``.grad``, the wrapped optimizer's update."""
        m = self._module
        if len(y) == 0:  # an empty Poisson batch still releases (pure) noise
            # In the parameters' dtype, as a non-empty batch's sum: float32 noise in a float64
            # release would show that the (private) batch size was 0.
            clipped: Any = BoundedSum(zero_flat(m), bound=self._clip)
        elif self._chunk is not None:  # one logical batch, one noise draw; only the memory is bounded
            clipped = chunked_clipped_sum(self._engine, m, self._loss_fn, x, y, clip=self._clip, chunk=self._chunk)
        else:
            clipped = self._engine.clipped_sum(m, self._loss_fn, x, y, clip=self._clip)
        set_flat_grad(m, batch.gaussian("grad", clipped, normalizer=self._normalizer))
        self.original_optimizer.step()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Release the noisy clipped gradient of the last batch the private loader yielded and step.

        Args:
            closure: optional, as for any torch optimizer: re-evaluates the loss, whose value is
                returned (its gradient is not used).

        Raises:
            ConfigError: no new batch since the last step (iterate the loader ``make_private``
                returned: each batch pays for exactly one step), or the optimizer updates a
                parameter that is not the module's (e.g. added by ``add_param_group``).
            ModelError: the model changed since ``make_private`` (a layer or parameter added,
                removed, replaced or reshaped; ``forward`` replaced; a hook registered or removed);
                nothing was charged.
            PrivacyBudgetExceeded: this step would push ε above the target; nothing was released.

        A step that fails after it was charged (e.g. in the gradient engine or the wrapped
        optimizer) stays charged and counted in ``steps_taken``, and its batch is used up.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._pending is None:
            raise ConfigError(
                "optimizer.step() needs a new batch from the data loader returned by make_private (one step per "
                "private batch)"
            )
        self._fingerprint.check(self._module)
        self._guard_updates()
        (x, y), self._pending, self._backward_draw = self._pending, None, None
        self._step_draw = self._draws
        self._in_step = True
        try:
            # Recorded before anything is computed: the budget guard may refuse the step here.
            batch = PrivateBatch(self._ledger, self._sampling, {"grad": self._z}, rng=self._noise_rng)
            self._release(batch, x, y)
        finally:
            self._in_step = False
        return loss

    def __repr__(self) -> str:
        return (
            f"DPOptimizer({type(self.original_optimizer).__name__}, noise_multiplier={self._z:.4g}, "
            f"max_grad_norm={self._clip:g}, expected_batch_size={self._normalizer:g}"
            + ("" if self._chunk is None else f", max_physical_batch_size={self._chunk}")
            + ")"
        )
