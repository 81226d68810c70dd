"""Where one optimiser step's time goes: ``privopt bench --breakdown`` (step mode).

The per-step ratios of ``privopt bench`` say how much slower a DP step is than a non-private one;
this says where the difference is spent. Each method's step is run again under a
:class:`~privopt.bench_profile.Breakdown` with the components below (median over rounds, the
methods interleaved): the non-private step's forward, backward and update beside the ghost
engine's forward, its backward pass (autograd alone), the per-layer work done inside it (layer
rules, per-sample gradient blocks), norms and clip factors, the clipped sums and the rest of the
query, the noise draw, and the update. The components of a step add up to its wall time (the
update and anything outside the listed functions is ``step: update and other``).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from privopt.grads import get_engine
    >>> model, x, y = nn.Linear(3, 2), torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    >>> step = lambda: get_engine("ghost").clipped_sum(model, loss, x, y, clip=1.0)
    >>> parts = step_breakdowns({"dp": step}, repeats=1)["dp"]
    >>> parts["engine: forward"] > 0 and parts["engine: norms and clip factors"] > 0
    True
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

import torch
from torch import nn

from privopt.bench_profile import ENGINE_QUERIES, STEP, Breakdown

__all__ = ["STEP_COMPONENTS", "format_breakdown", "nonprivate_backward", "nonprivate_forward", "step_breakdowns"]

_GHOST, _CAPTURE = "privopt.grads.ghost.engine", "privopt.grads.ghost.capture"
_TARGETS = (
    ("forward (non-private)", True, (("privopt.bench_breakdown", "nonprivate_forward"),)),
    ("backward (non-private)", True, (("privopt.bench_breakdown", "nonprivate_backward"),)),
    ("engine: forward", True, ((_CAPTURE, "Capture._forward"),)),
    ("engine: per-layer work in the backward pass", True, ((_CAPTURE, "_Collector.process"),)),
    ("engine: backward pass (autograd)", False, ((_CAPTURE, "Capture._backward"),)),
    ("engine: norms and clip factors", True, ((_GHOST, "build_term"), (_GHOST, "clip_terms"))),
    ("engine: clipped sums and rest", False, ENGINE_QUERIES),
    ("noise", True, (("privopt.grads.release", "draw_gaussian_noise"),)),
)
STEP_COMPONENTS = tuple(c for c, _, _ in _TARGETS) + (STEP,)


def nonprivate_forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The non-private step's forward pass and mean loss (a function, so that it can be timed)."""
    return nn.functional.cross_entropy(model(x), y)


def nonprivate_backward(loss: torch.Tensor) -> None:
    """The non-private step's backward pass."""
    loss.backward()


def step_breakdowns(steps: Mapping[str, Callable[[], None]], *, repeats: int) -> dict[str, dict[str, float]]:
    """``{method: {component: median seconds per step}}`` over ``repeats`` interleaved rounds (one
    step per method per round), each step timed under its own :class:`~privopt.bench_profile.Breakdown`."""
    got: dict[str, list[dict[str, float]]] = {m: [] for m in steps}
    for _ in range(repeats):
        for m, step in steps.items():
            with Breakdown(targets=_TARGETS, components=STEP_COMPONENTS, loop=False) as bd:
                bd.wrap_step(step)()
            got[m].append(bd.as_dict())
    return {m: {c: statistics.median(r[c] for r in rounds) for c in STEP_COMPONENTS} for m, rounds in got.items()}


def format_breakdown(rows: list[dict]) -> str:
    """A Markdown table per (model, batch size) of the rows' ``breakdown`` (ms per step).

    Example:
        >>> rows = [{"model": "mlp", "batch_size": 8, "method": "nonprivate", "breakdown": {"noise": 0.0}},
        ...         {"model": "mlp", "batch_size": 8, "method": "dp-sgd", "breakdown": {"noise": 0.002}}]
        >>> print(format_breakdown(rows).splitlines()[3])
        | noise | 0.00 | 2.00 |
    """
    blocks: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("breakdown"):
            blocks.setdefault((r["model"], r["batch_size"]), []).append(r)
    out = []
    for (model, bs), block in blocks.items():
        out.append(f"Where the time goes, {model} at batch {bs} (ms per step, median):")
        out.append("| component | " + " | ".join(r["method"] for r in block) + " |")
        out.append("|---|" + "---:|" * len(block))
        for c in block[0]["breakdown"]:
            out.append(f"| {c} | " + " | ".join(f"{1000 * r['breakdown'].get(c, 0.0):.2f}" for r in block) + " |")
        out.append("| total | " + " | ".join(f"{1000 * sum(r['breakdown'].values()):.2f}" for r in block) + " |")
        out.append("")
    return "\n".join(out).rstrip()
