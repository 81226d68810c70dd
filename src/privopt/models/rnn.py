"""Recurrent layers whose every parameter sits in an ``nn.Linear`` (docs/models.md, "Recurrent layers").

The ghost engine has no rule for ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` (torch's fused kernels), so
it takes their per-sample gradients with the vmap rule, which torch cannot batch well around those
kernels (no batching rule at all for the LSTM's). :class:`GRU`, :class:`LSTM` and :class:`RNN` take
the same arguments, inputs and initial states and return the same values, computed with two
``nn.Linear`` layers per layer and direction: ``ih`` applied once to the whole sequence
(``[B, T, in] -> [B, T, gates * hidden]``) and ``hh`` called once per time step on the hidden
state. Both have ghost rules. :meth:`from_torch` copies the weights of torch's layer.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import PackedSequence

from privopt.errors import PrivoptWarning

__all__ = ["GRU", "LSTM", "RNN"]


class _Recurrent(nn.Module):
    """Layers and directions of one recurrent kind; subclasses give ``gates`` and ``_cell``."""

    gates = 1
    torch_type: type = nn.RNNBase

    def __init__(self, input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype):
        super().__init__()
        if num_layers < 1 or hidden_size < 1:
            raise ValueError(f"num_layers ({num_layers}) and hidden_size ({hidden_size}) must be positive")
        if not 0 <= dropout <= 1:
            raise ValueError(f"dropout must be in [0, 1], got {dropout}")
        if dropout > 0 and num_layers == 1:  # as torch's layers warn
            warnings.warn(
                f"{type(self).__name__}: dropout={dropout} has no effect with num_layers=1 (dropout is applied "
                "between layers, after every layer but the last): use num_layers >= 2, or dropout=0",
                PrivoptWarning,
                stacklevel=3,
            )
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bidirectional
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.ih, self.hh = nn.ModuleDict(), nn.ModuleDict()
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * self.num_directions
            for key in self._keys(layer):
                self.ih[key] = nn.Linear(width, self.gates * hidden_size, **kw)
                self.hh[key] = nn.Linear(hidden_size, self.gates * hidden_size, **kw)

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _keys(self, layer: int) -> list[str]:
        """``l0``, ``l0_reverse``: the suffixes of torch's parameter names (``weight_ih_l0_reverse``)."""
        return [f"l{layer}", f"l{layer}_reverse"][: self.num_directions]

    @classmethod
    def _options(cls, module) -> dict:
        return {}

    @classmethod
    def from_torch(cls, module: nn.RNNBase):
        """A copy of ``module`` (a torch layer of this kind): same weights, inputs and outputs."""
        if not isinstance(module, cls.torch_type):
            want, got = cls.torch_type.__name__, type(module).__name__
            raise TypeError(f"{cls.__name__}.from_torch needs an nn.{want}, got {got}")
        w = module.weight_ih_l0
        new = cls(
            module.input_size, module.hidden_size, num_layers=module.num_layers, bias=module.bias,
            batch_first=module.batch_first, dropout=module.dropout, bidirectional=module.bidirectional,
            device=w.device, dtype=w.dtype, **cls._options(module),
        )  # fmt: skip
        with torch.no_grad():
            for key in new.ih:
                for kind, lin in (("ih", new.ih[key]), ("hh", new.hh[key])):
                    lin.weight.copy_(getattr(module, f"weight_{kind}_{key}"))
                    if module.bias:
                        lin.bias.copy_(getattr(module, f"bias_{kind}_{key}"))
        return new

    def flatten_parameters(self) -> None:
        """Nothing to flatten (kept so code written for torch's layers runs unchanged)."""

    def _cell(self, gi: torch.Tensor, state: tuple, hh: nn.Linear) -> tuple:
        raise NotImplementedError

    def _initial(self, x: torch.Tensor, hx, batched: bool) -> list[tuple]:
        """Per layer and direction, the state tuple (``(h,)`` or ``(h, c)``), each ``[B, hidden]``."""
        n, B = self.num_layers * self.num_directions, x.shape[0]
        if hx is None:  # zeros built from the input: batched like it under torch.func
            zero = torch.zeros_like(x[:, 0, :1]).expand(B, self.hidden_size)
            return [(zero,) * self._n_states for _ in range(n)]
        parts = tuple(hx) if self._n_states == 2 else (hx,)
        if len(parts) != self._n_states or not all(isinstance(p, torch.Tensor) for p in parts):
            raise ValueError(f"{type(self).__name__}: the initial state must be {self._state_doc}")
        want = (n, B, self.hidden_size) if batched else (n, self.hidden_size)
        if any(tuple(p.shape) != want for p in parts):
            got = [tuple(p.shape) for p in parts]
            raise ValueError(f"{type(self).__name__}: the initial state must have shape {want}, got {got}")
        if not batched:
            parts = tuple(p.unsqueeze(1) for p in parts)
        return [tuple(p[k] for p in parts) for k in range(n)]

    _n_states = 1
    _state_doc = "a tensor h0"

    def _direction(self, x: torch.Tensor, state: tuple, key: str, reverse: bool):
        """Output ``[B, T, hidden]`` and final state of one layer and direction."""
        gi = self.ih[key](x)  # the whole sequence at once: one Linear call over [B, T, in]
        T = x.shape[1]
        outs: list = [None] * T
        for t in range(T - 1, -1, -1) if reverse else range(T):
            state = self._cell(gi[:, t], state, self.hh[key])
            outs[t] = state[0]
        return torch.stack(outs, 1), state

    def forward(self, input, hx=None):
        """As torch's layer: ``(output, h_n)`` (LSTM: ``(output, (h_n, c_n))``).

        ``input`` is ``[T, B, in]`` (``[B, T, in]`` with ``batch_first``) or ``[T, in]`` (unbatched).
        Packed sequences are not supported: pad on the right and mask the outputs.
        """
        if isinstance(input, PackedSequence):
            raise ValueError(
                f"privopt's {type(self).__name__} does not take packed sequences (their lengths are read "
                "per batch): pad on the right and mask the outputs at padded positions (docs/models.md, "
                '"Recurrent layers")'
            )
        if input.dim() not in (2, 3) or input.shape[-1] != self.input_size:
            raise ValueError(
                f"{type(self).__name__}: input must be [T, B, {self.input_size}], [B, T, {self.input_size}] "
                f"(batch_first) or [T, {self.input_size}], got {tuple(input.shape)}"
            )
        batched = input.dim() == 3
        x = input.unsqueeze(0) if not batched else input if self.batch_first else input.transpose(0, 1)
        states, finals = self._initial(x, hx, batched), []
        for layer in range(self.num_layers):
            outs = []
            for d, key in enumerate(self._keys(layer)):
                seq, last = self._direction(x, states[layer * self.num_directions + d], key, reverse=d == 1)
                outs.append(seq)
                finals.append(last)
            x = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
            if self.dropout and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, self.training)
        out = x.squeeze(0) if not batched else x if self.batch_first else x.transpose(0, 1)
        last = [torch.stack([f[i] for f in finals]) for i in range(self._n_states)]
        if not batched:
            last = [h.squeeze(1) for h in last]
        return out, (last[0] if self._n_states == 1 else tuple(last))

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        return s + f", batch_first={self.batch_first}, dropout={self.dropout}, bidirectional={self.bidirectional}"


class GRU(_Recurrent):
    """``nn.GRU`` with ``ih[l{k}]``, ``hh[l{k}]`` (``l{k}_reverse``) as ``nn.Linear`` layers (gates r, z, n).

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype:
            as for ``nn.GRU`` (``dropout``: on the outputs of every layer but the last, in training mode).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> _ = torch.manual_seed(0)
        >>> ref = nn.GRU(4, 6, num_layers=2, bidirectional=True, batch_first=True)
        >>> x = torch.randn(3, 5, 4)
        >>> ours, theirs = GRU.from_torch(ref)(x), ref(x)
        >>> all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, theirs))
        True
    """

    gates, torch_type = 3, nn.GRU

    def __init__(
        self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
        bidirectional=False, device=None, dtype=None,
    ):  # fmt: skip
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype)

    def _cell(self, gi, state, hh):
        (h,) = state
        gh = hh(h)
        H = self.hidden_size
        rz = torch.sigmoid(gi[:, : 2 * H] + gh[:, : 2 * H])
        r, z = rz[:, :H], rz[:, H:]
        n = torch.tanh(gi[:, 2 * H :] + r * gh[:, 2 * H :])  # the n-gate's hidden bias inside r * (...)
        return (n + z * (h - n),)  # (1 - z) * n + z * h


class LSTM(_Recurrent):
    """``nn.LSTM`` with ``ih[l{k}]``, ``hh[l{k}]`` (``l{k}_reverse``) as ``nn.Linear`` layers (gates i, f, g, o).

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype:
            as for ``nn.LSTM``.
        proj_size: must be 0 (projections are not supported).

    The initial state is a tuple ``(h0, c0)``; the output is ``(output, (h_n, c_n))``.
    """

    gates, torch_type, _n_states, _state_doc = 4, nn.LSTM, 2, "a tuple (h0, c0)"
    proj_size = 0

    def __init__(
        self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
        bidirectional=False, proj_size=0, device=None, dtype=None,
    ):  # fmt: skip
        if proj_size:
            raise ValueError(f"privopt's LSTM does not support proj_size (got {proj_size}): use proj_size=0")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype)

    @classmethod
    def from_torch(cls, module: nn.LSTM) -> LSTM:
        """A copy of ``module``: same weights, inputs and outputs (``proj_size`` must be 0)."""
        if getattr(module, "proj_size", 0):
            raise ValueError(f"privopt's LSTM does not support proj_size (got {module.proj_size})")
        return super().from_torch(module)

    def _cell(self, gi, state, hh):
        h, c = state
        gates = gi + hh(h)
        H = self.hidden_size
        ifo = torch.sigmoid(torch.cat([gates[:, : 2 * H], gates[:, 3 * H :]], 1))
        g = torch.tanh(gates[:, 2 * H : 3 * H])
        c = ifo[:, H : 2 * H] * c + ifo[:, :H] * g
        return ifo[:, 2 * H :] * torch.tanh(c), c


class RNN(_Recurrent):
    """``nn.RNN`` with ``ih[l{k}]``, ``hh[l{k}]`` (``l{k}_reverse``) as ``nn.Linear`` layers.

    Args:
        input_size, hidden_size, num_layers, nonlinearity, bias, batch_first, dropout, bidirectional,
            device, dtype: as for ``nn.RNN`` (``nonlinearity``: ``"tanh"`` or ``"relu"``).
    """

    torch_type = nn.RNN

    def __init__(
        self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
        dropout=0.0, bidirectional=False, device=None, dtype=None,
    ):  # fmt: skip
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device, dtype)
        self.nonlinearity = nonlinearity

    @classmethod
    def _options(cls, module) -> dict:
        return {"nonlinearity": module.nonlinearity}

    def _cell(self, gi, state, hh):
        pre = gi + hh(state[0])
        return (torch.tanh(pre) if self.nonlinearity == "tanh" else torch.relu(pre),)
