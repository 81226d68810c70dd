"""Opacus's DP-SGD step (its hooks and its ghost clipping), timed by ``privopt bench`` beside privopt's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["opacus_step"]


def opacus_step(method: str, model: nn.Module, x, y, *, lr: float, clip: float, sigma: float) -> Callable[[], None]:
    """One DP-SGD step closure with Opacus 1.6 (``method``: ``opacus-hooks`` or ``opacus-ghost``);
    raises ``ImportError`` when Opacus is not installed."""
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    B = x.shape[0]
    if method == "opacus-hooks":
        gsm = GradSampleModule(model)
        opt = DPOptimizer(
            torch.optim.SGD(gsm.parameters(), lr=lr), noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=B
        )

        def step():
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(gsm(x), y).backward()
            opt.step()

        return step
    gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=clip, use_ghost_clipping=True)
    opt = DPOptimizerFastGradientClipping(
        torch.optim.SGD(gsm.parameters(), lr=lr), noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=B
    )
    crit = DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss(), loss_reduction="mean")

    def ghost_step():
        opt.zero_grad(set_to_none=True)
        crit(gsm(x), y).backward()
        opt.step()

    return ghost_step
