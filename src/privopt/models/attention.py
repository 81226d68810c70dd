"""Multi-head attention whose every parameter sits in an ``nn.Linear`` (docs/models.md, "Attention").

``nn.MultiheadAttention`` computes with its ``out_proj``'s parameters without calling ``out_proj``
(and with ``in_proj_weight`` through ``F.multi_head_attention_forward``), so the ghost engine
cannot attribute them to a layer call and answers the whole query with the vmap engine, which has
no batching rule for torch's CPU attention kernel: a DP-SGD query on a one-layer attention text
classifier cost 7-10x a non-private step against 1.7x for this module. :class:`MultiheadAttention`
takes the same arguments and masks and returns the same values; its projections are four
``nn.Linear`` layers (ghost rules), and the attention itself, which has no parameters, is
``F.scaled_dot_product_attention``. It also replaces ``self_attn`` in ``nn.TransformerEncoderLayer``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["MultiheadAttention"]


class MultiheadAttention(nn.Module):
    """``nn.MultiheadAttention`` with ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` as ``nn.Linear``.

    Args:
        embed_dim, num_heads, dropout, bias, kdim, vdim, batch_first: as for ``nn.MultiheadAttention``
            (``dropout``: on the attention weights, in training mode).

    ``add_bias_kv`` and ``add_zero_attn`` are not supported. :meth:`from_torch` copies the weights
    of an ``nn.MultiheadAttention``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> _ = torch.manual_seed(0)
        >>> ref = nn.MultiheadAttention(8, 2, batch_first=True)
        >>> ours = MultiheadAttention.from_torch(ref)
        >>> x, pad = torch.randn(3, 5, 8), torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 5])
        >>> a = ours(x, x, x, key_padding_mask=pad)[0]
        >>> bool(torch.allclose(a, ref(x, x, x, key_padding_mask=pad)[0], atol=1e-6))
        True
    """

    # Read by nn.TransformerEncoderLayer's fast-path checks (eval mode), which this module must fail:
    # the fast path would call torch's fused kernel with an in_proj_weight this module does not have.
    _qkv_same_embed_dim = False
    in_proj_bias = None

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, kdim=None, vdim=None, batch_first=False):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(kdim or embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(vdim or embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiheadAttention:
        """A copy of ``mha`` (same weights, masks and outputs)."""
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        bias = mha.out_proj.bias is not None
        new = cls(mha.embed_dim, mha.num_heads, mha.dropout, bias, mha.kdim, mha.vdim, mha.batch_first)
        new.to(device=mha.out_proj.weight.device, dtype=mha.out_proj.weight.dtype)
        d = mha.embed_dim
        with torch.no_grad():
            for i, proj in enumerate((new.q_proj, new.k_proj, new.v_proj)):
                w = mha.in_proj_weight[i * d : (i + 1) * d] if mha._qkv_same_embed_dim else None
                proj.weight.copy_(w if w is not None else getattr(mha, "qkv"[i] + "_proj_weight"))
                if bias:
                    proj.bias.copy_(mha.in_proj_bias[i * d : (i + 1) * d])
            new.out_proj.load_state_dict(mha.out_proj.state_dict())
        return new

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        """As ``nn.MultiheadAttention.forward``: ``(output, weights or None)``."""
        if not self.batch_first:  # [L, B, E] -> [B, L, E]
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        B, L, _ = query.shape
        S, h = key.shape[1], self.num_heads

        def heads(t, n):  # [B, n, E] -> [B, heads, n, E / heads]
            return t.reshape(B, n, h, self.embed_dim // h).transpose(1, 2)

        q, k, v = heads(self.q_proj(query), L), heads(self.k_proj(key), S), heads(self.v_proj(value), S)
        mask = _additive_mask(key_padding_mask, attn_mask, is_causal, B, h, L, S, q.dtype, q.device)
        p = self.dropout if self.training else 0.0
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            # dropped out, as torch returns them
            weights = F.dropout(torch.softmax(scores if mask is None else scores + mask, -1), p)
            out = weights @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        out = self.out_proj(out.transpose(1, 2).reshape(B, L, self.embed_dim))
        if not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, weights.mean(1) if average_attn_weights else weights


def _additive_mask(key_padding_mask, attn_mask, is_causal, B, h, L, S, dtype, device):
    """``[B or 1, heads or 1, L, S]`` float mask to add to the scores (``-inf``: not attended), or None.

    Boolean masks mean "not allowed" where ``True``, as in ``nn.MultiheadAttention``; float ones are added.
    """
    parts = []
    if key_padding_mask is not None:
        parts.append(_as_float(key_padding_mask, dtype).reshape(B, 1, 1, S))
    if attn_mask is not None:
        m = _as_float(attn_mask, dtype)
        parts.append(m.reshape(1, 1, L, S) if m.dim() == 2 else m.reshape(B, h, L, S))
    elif is_causal:
        parts.append(_as_float(torch.ones(L, S, dtype=torch.bool, device=device).triu(1), dtype).reshape(1, 1, L, S))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def _as_float(mask: torch.Tensor, dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask.to(dtype)
