"""A max-pool layer with torch's fast CPU kernels (docs/models.md, "Max-pooling on CPU").

torch's CPU max-pool over a contiguous ``[B, C, H, W]`` tensor runs a scalar loop per plane, while
its channels-last kernel is vectorised over channels: on one thread the 2x2 pool of the ``cnn``
model's first block (``[128, 16, 28, 28]``) took about 9 ms channels-first against 2 ms
channels-last, a third of the whole non-private step. The backward kernel is the other way round
(fast channels-first). :class:`MaxPool2d` takes the fast kernel of each direction and returns
exactly what ``nn.MaxPool2d`` returns: the same values, the same argmax indices, hence the same
gradients, double backward included.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MaxPool2d"]


class _MaxPool2dCPU(torch.autograd.Function):
    """Channels-last forward, channels-first backward; indices are per-plane, so both agree."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, kernel_size, stride, padding, dilation, ceil_mode):
        out, idx = torch.ops.aten.max_pool2d_with_indices(
            x.contiguous(memory_format=torch.channels_last), kernel_size, stride, padding, dilation, ceil_mode
        )
        return out.contiguous(), idx.contiguous()

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, ctx.kernel_size, ctx.stride, ctx.padding, ctx.dilation, ctx.ceil_mode = inputs
        ctx.save_for_backward(x, output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad_out, _grad_idx):
        x, idx = ctx.saved_tensors
        # Built from a differentiable aten op, so a double backward (Hessian-vector products) works.
        grad_in = torch.ops.aten.max_pool2d_with_indices_backward(
            grad_out.contiguous(), x, ctx.kernel_size, ctx.stride, ctx.padding, ctx.dilation, ctx.ceil_mode, idx
        )
        return grad_in, None, None, None, None, None


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` with the fast CPU kernel of each direction; same outputs and gradients.

    A drop-in replacement (same arguments; an instance of ``nn.MaxPool2d``). It takes the fast route
    for a 4-D CPU input outside ``torch.func`` transforms (the vmap gradient engine), and defers to
    ``nn.MaxPool2d`` elsewhere (CUDA, 3-D input, ``return_indices=True``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from privopt.models.pooling import MaxPool2d
        >>> x = torch.randn(8, 4, 6, 6)
        >>> torch.equal(MaxPool2d(2)(x), nn.MaxPool2d(2)(x))
        True
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.return_indices or x.dim() != 4 or x.device.type != "cpu" or _in_functorch_transform():
            return super().forward(x)
        pair = nn.modules.utils._pair
        stride = pair(self.stride if self.stride is not None else self.kernel_size)
        args = (pair(self.kernel_size), stride, pair(self.padding), pair(self.dilation), bool(self.ceil_mode))
        return _MaxPool2dCPU.apply(x, *args)[0]


def _in_functorch_transform() -> bool:
    # Channels-last layouts cannot be queried inside vmap; the plain layer is correct there.
    return torch._C._are_functorch_transforms_active()
