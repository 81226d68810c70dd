"""Canaries: records an audit inserts into the training data, each with probability ½.

* **Gradient canaries** (white-box audits). :class:`AuditModel` wraps the model under audit and
  adds a :class:`CanaryHead` with one coordinate per canary. A record carries its canary number
  in one extra input column (0 for an ordinary record). Canary ``i``'s loss has a gradient only
  in coordinate ``i`` of the head, of norm far above any clip threshold and of sign ``h(clock)``,
  where ``h`` is a pseudo-random ±1 function of one more head parameter (the *clock*) that no
  record's gradient touches: it moves only with the privacy noise of the releases, so the sign
  changes unpredictably from step to step but is known to anyone who sees the iterates. Hence,
  per release that samples it, canary ``i`` adds exactly ``±bound·e_i`` to the clipped sum: to a
  gradient release at every sampled step, to a difference release (two points) whenever the sign
  flipped between the points. Ordinary records have no gradient in the head and the model under
  audit gets none from canaries: the real model trains as it would without the audit, except
  through what the loss VALUE of a canary feeds (e.g. the dual variable of a DRO objective).
* **Linear canaries** (white-box audits of the closed-form linear ERM algorithms, which need one
  linear weight and compute gradients from the features, never through the model).
  :class:`LinearAuditModel` is that weight over the features plus one coordinate per canary and a
  clock coordinate; canary ``i`` is the record ``LINEAR_MAGNITUDE·clip·e_i`` with label 0, so its
  gradient lies in coordinate ``i`` alone, always positive, of norm ``clip`` (clipped) while its
  weight stays below ``≈ 0.28/clip``; ordinary records are 0 there and in the clock's coordinate.
* **Input canaries** (black-box audits): test-split inputs (public) with a wrong label drawn by
  the audit; the released model's loss on them is the membership score.

Inclusion is drawn from a secure random source (:func:`draw_inclusion`), never from a run's seed.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = AuditModel(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), input_shape=(4,), canaries=2)
    >>> x = torch.zeros(3, 5); x[1, -1] = 2.0          # row 1 is canary number 2 (head coordinate 1)
    >>> ce = nn.functional.cross_entropy(model(x), torch.zeros(3, dtype=torch.long), reduction="none")
    >>> ce[1].backward()
    >>> g = model.head.table.weight.grad.squeeze(1)      # rows: ordinary, canary 1, canary 2, clock
    >>> g[[0, 1, 3]].tolist(), bool(abs(g[2]) > 1e3), bool(model.inner[1].weight.grad.abs().sum() == 0)
    ([0.0, 0.0, 0.0], True, True)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from privopt.errors import ConfigError
from privopt.rng import RandomSource, SecureSource

__all__ = [
    "AuditModel",
    "CanaryHead",
    "CANARY_LABEL",
    "LinearAuditModel",
    "draw_inclusion",
    "with_id_column",
    "wrong_labels",
]

# Canary i's gradient norm is about MAGNITUDE times its DRO weight (>= 1 at the loss clamp):
# far above any clip threshold, far below float32 overflow even at a weight of e^30.
MAGNITUDE = 1e4
# Logit margin of a canary: its cross-entropy is about 20 + log(K − 1), at or above every DRO loss
# clamp, so a DRO objective gives it the largest weight and its gradient never vanishes.
CANARY_MARGIN = 20.0
CANARY_LABEL = 0
# sign(sin(FREQUENCY * clock)): steps of the clock (noise of size >= 1e-4) change it at random.
CLOCK_FREQUENCY = 1e5
CLOCK_START = 0.123456
# A linear canary's feature over the clip threshold: its logistic gradient u·σ(u·w)·clip stays at
# or above the threshold for weights w >= -log(u - 1)/(u·clip), a range largest (≈ 0.28/clip) at
# u ≈ 4.6; beyond it the canary adds less than the bound (scored as if it added the bound: the
# score loses power, the bound stays valid).
LINEAR_MAGNITUDE = 4.6


def draw_inclusion(count: int, *, rng: RandomSource | None = None) -> torch.Tensor:
    """``count`` independent fair coins (True: the canary is inserted), from a secure source by default.

    Example:
        >>> draw_inclusion(1000).float().mean().item() > 0.4
        True
    """
    if not (isinstance(count, int) and count >= 1):
        raise ConfigError(f"the number of canaries must be an integer >= 1, got {count!r}")
    source = rng if rng is not None else SecureSource()
    return source.uniform((count,)) < 0.5


def with_id_column(x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Flatten ``x`` to ``[N, d]`` and append the canary-number column (default 0: ordinary records)."""
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:])).to(torch.float32)
    col = torch.zeros(x.shape[0], 1) if ids is None else ids.reshape(-1, 1).to(torch.float32)
    return torch.cat([flat, col], dim=1)


def wrong_labels(y: torch.Tensor, *, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """A label different from each of ``y``, uniformly among the other classes (public choice).

    Example:
        >>> y = torch.tensor([0, 1, 2, 2])
        >>> bool((wrong_labels(y, num_classes=3, generator=torch.Generator().manual_seed(0)) != y).all())
        True
    """
    shift = torch.randint(1, num_classes, y.shape, generator=generator)
    return (y + shift) % num_classes


class CanaryHead(nn.Module):
    """The canary coordinates and the clock (see the module docstring), as one embedding table:
    row 0 serves ordinary records (never used), rows 1..m the canaries, row m + 1 is the clock. An
    embedding keeps the head on the fast path of the ghost engine; the clock is read detached, so
    it adds no gradient anywhere.

    Args:
        canaries: number of canary coordinates m (canary numbers 1..m).
        num_classes: number of model outputs K.
    """

    def __init__(self, *, canaries: int, num_classes: int):
        super().__init__()
        if not (isinstance(canaries, int) and canaries >= 1):
            raise ConfigError(f"the number of gradient canaries must be an integer >= 1, got {canaries!r}")
        self.canaries, self.num_classes = canaries, num_classes
        self.table = nn.Embedding(canaries + 2, 1)
        with torch.no_grad():
            self.table.weight.zero_()
            self.table.weight[canaries + 1] = CLOCK_START
        base = torch.zeros(num_classes)
        base[CANARY_LABEL] = -CANARY_MARGIN
        self.register_buffer("base_logits", base)
        label = torch.zeros(num_classes)
        label[CANARY_LABEL] = 1.0
        self.register_buffer("label", label)

    def clock(self) -> float:
        """The clock's current value (a public iterate)."""
        return float(self.table.weight[self.canaries + 1].detach())

    @staticmethod
    def sign(clock) -> torch.Tensor:
        """``h = sign(sin(FREQUENCY·clock))``, computed in float64 (±1, detached)."""
        c = torch.as_tensor(clock).detach().to(torch.float64)
        return torch.sign(torch.sin(c * CLOCK_FREQUENCY)).to(torch.float32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` of canary records (rows of ordinary records are unused)."""
        weight = self.table.weight
        h = self.sign(weight[self.canaries + 1]).to(weight.dtype)
        s = MAGNITUDE * h * self.table(ids.long().clamp(0, self.canaries)).squeeze(1)
        push = s - s.detach()  # value 0 (the loss value stays fixed), gradient ±MAGNITUDE·e_i
        return self.base_logits.unsqueeze(0) - push.unsqueeze(1) * self.label.unsqueeze(0)


class AuditModel(nn.Module):
    """The model under audit plus a :class:`CanaryHead`; inputs are ``[N, d + 1]``
    (:func:`with_id_column`): the flattened features and the canary number (0: ordinary record).

    Args:
        inner: the model under audit (its outputs are used for ordinary records).
        input_shape: the shape ``inner`` expects for one example.
        canaries: number of gradient canaries.
    """

    def __init__(self, inner: nn.Module, *, input_shape: tuple[int, ...], canaries: int):
        super().__init__()
        self.inner = inner
        self.input_shape = tuple(int(s) for s in input_shape)
        self.features = math.prod(self.input_shape)
        with torch.no_grad():
            outputs = int(inner(torch.zeros(1, *self.input_shape)).shape[-1])
        self.head = CanaryHead(canaries=canaries, num_classes=outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x[:, self.features]
        real = self.inner(x[:, : self.features].reshape(-1, *self.input_shape))
        canary = self.head(ids)
        return torch.where((ids > 0).unsqueeze(1), canary, real)

    @property
    def canaries(self) -> int:
        """Number of canary coordinates."""
        return self.head.canaries

    def clock(self) -> float:
        """The clock's current value (a public iterate)."""
        return self.head.clock()

    def release_sign(self, kind: str, before: float | None, now: float) -> float:
        """The sign a canary's term has in a ``kind`` release, from the clock before and now (0: not
        scored): a plain release carries ``h(now)``; a difference only when ``h`` flipped since ``before``."""
        h = float(self.head.sign(now))
        if kind == "gradient":
            return h
        if before is None:
            return 0.0
        return h if float(self.head.sign(before)) != h else 0.0  # no flip: the difference is unknown

    def head_offset(self) -> int:
        """Index of canary 1's coordinate in the flat trainable-parameter vector."""
        offset = 0
        for p in (p for p in self.parameters() if p.requires_grad):
            if p is self.head.table.weight:
                return offset + 1  # row 0 serves ordinary records
            offset += p.numel()
        raise ConfigError("the canary head's parameters are not trainable")


class LinearAuditModel(nn.Module):
    """One linear weight ``[1, p + m + 1]``: the model under audit's weight (``p`` features), then
    ``m`` canary coordinates and the clock's coordinate (both start at 0); inputs are
    ``[N, p + m + 1]`` (:meth:`extend`). See "Linear canaries" in the module docstring.

    Args:
        inner: the model under audit: a linear map with one trainable weight of ``p`` entries.
        canaries: number of canaries m.
        clip: the algorithm's per-record gradient bound (sets the canaries' feature).

    Example:
        >>> model = LinearAuditModel(nn.Linear(3, 1, bias=False), canaries=2, clip=1.0)
        >>> model.canary_records(torch.tensor([2])).tolist()
        [[0.0, 0.0, 0.0, 0.0, 4.599999904632568, 0.0]]
    """

    def __init__(self, inner: nn.Module, *, canaries: int, clip: float):
        super().__init__()
        if not (isinstance(canaries, int) and canaries >= 1):
            raise ConfigError(f"the number of gradient canaries must be an integer >= 1, got {canaries!r}")
        params = [p for p in inner.parameters() if p.requires_grad]
        if len(params) != 1 or params[0].shape[0] != 1:
            shapes = [tuple(p.shape) for p in params]
            raise ConfigError(
                "a linear audit needs a model with one trainable weight of shape [1, p] "
                f"(model: logreg, model_params: {{bias: false, single_logit: true}}); got {shapes}"
            )
        self.canaries, self.features, self.magnitude = canaries, params[0].numel(), LINEAR_MAGNITUDE * float(clip)
        self.linear = nn.Linear(self.features + canaries + 1, 1, bias=False)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[0, : self.features] = params[0].detach().reshape(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def extend(self, x: torch.Tensor) -> torch.Tensor:
        """Features ``[N, p]`` (any shape flattening to it) with zeros in the canaries' and clock's columns."""
        flat = x.reshape(x.shape[0], -1).to(torch.float32)
        return torch.cat([flat, torch.zeros(x.shape[0], self.canaries + 1)], dim=1)

    def canary_records(self, numbers: torch.Tensor) -> torch.Tensor:
        """The inputs of canaries ``numbers`` (1..m): the feature in the canary's own column only."""
        x = torch.zeros(len(numbers), self.features + self.canaries + 1)
        x[torch.arange(len(numbers)), self.features + numbers.long() - 1] = self.magnitude
        return x

    def head_offset(self) -> int:
        """Index of canary 1's coordinate in the flat weight."""
        return self.features

    def clock(self) -> float:
        """The clock coordinate's current value (a public iterate; it moves with the noise alone)."""
        return float(self.linear.weight[0, -1].detach())

    def release_sign(self, kind: str, before: float | None, now: float) -> float:
        """A canary's gradient is always positive (label 0): plain releases carry ``+bound``; a
        difference of two clipped gradients has no known value, so it is not scored."""
        return 1.0 if kind == "gradient" else 0.0
