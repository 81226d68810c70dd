"""The checks a model passes before a run starts: it takes the inputs, the loss gives one value per
example, and (private runs) the gradient engine computes its per-example gradients. Each is tried on
two records; an error's text is reported only when the same call also fails on public zeros of the
same shapes (the text of an error on the records could quote one). Used by
:func:`privopt.training.build_run` and :meth:`privopt.PrivacyEngine.make_private`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from privopt.errors import ModelError

__all__ = ["check_engine_fits", "check_model_fits", "probe_rows"]


def check_model_fits(
    model: nn.Module,
    loss_fn: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    what: str,
    num_classes: int | None = None,
    engine: Any = None,
) -> None:
    """One forward pass on two examples (nothing is kept): the model must take the inputs and the
    loss must return one value per example; with an ``engine`` (a private run), also
    :func:`check_engine_fits`. Raises :class:`ModelError` naming the problem.

    Example:
        >>> from torch import nn
        >>> loss = lambda out, y: nn.functional.cross_entropy(out, y)  # mean: not per example
        >>> check_model_fits(nn.Linear(3, 2), loss, torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), what="x")
        Traceback (most recent call last):
        ...
        privopt.errors.ModelError: the loss must return one value per example (reduction='none'), got shape ()
    """
    x, y = x[:2], y[:2]
    out, problem = _forward_probe(model, x)
    if problem:
        ids = not x.is_floating_point() and x.dtype != torch.bool and problem != _VALUE_DEPENDENT
        hint = "; integer inputs reach the model as they are (token ids): convert numeric ones with x.float()"
        raise ModelError(
            f"the model cannot take {what} (one example: shape {tuple(x.shape[1:])}, {x.dtype}): {problem}"
            + (hint if ids else _float_hint(model, x))
        )
    width = out.shape[1] if isinstance(out, torch.Tensor) and out.dim() == 2 else num_classes
    # A binary model may output the logit of class 1 only (loss: logistic).
    if num_classes is not None and width != num_classes and not (num_classes == 2 and width == 1):
        raise ModelError(f"the model outputs {width} values per example but the dataset has {num_classes} classes")

    def losses_of(o, t):
        with torch.no_grad():
            if num_classes is not None and t.shape[0] == 2:  # both extreme class ids, whatever the data's two are
                loss_fn(o, torch.tensor([0, num_classes - 1], dtype=t.dtype, device=t.device))
            return loss_fn(o, t)

    losses, problem = _probe(losses_of, (out, y), (_public_like(out), _public_like(y)))
    if problem:  # the model ran: the targets (dtype, range, shape) or the loss are what to fix
        got = tuple(out.shape[1:]) if isinstance(out, torch.Tensor) else type(out).__name__
        hint = "; one logit per example needs loss: logistic" if got == (1,) else ""
        raise ModelError(
            f"the loss cannot take the model's outputs on {what} (shape {got} per example) and their targets "
            f"(shape {tuple(y.shape[1:])} per example, {y.dtype}){hint}: {problem}"
        )
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (x.shape[0],):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ModelError(f"the loss must return one value per example (reduction='none'), got shape {shape}")
    if engine is not None:
        check_engine_fits(engine, model, loss_fn, x, y, what=what)


def _float_hint(model: nn.Module, x: torch.Tensor) -> str:
    """Floating inputs of another precision than the model's (e.g. float64 from NumPy, a float32 model)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if not x.is_floating_point() or len(dtypes) != 1 or x.dtype in dtypes:
        return ""
    (dtype,) = dtypes
    return f"; the inputs are {x.dtype} and the model's parameters {dtype}: pass x.to({dtype}) (NumPy gives float64)"


_PROBE_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, AttributeError)


def check_engine_fits(engine: Any, model: nn.Module, loss_fn: Any, x: torch.Tensor, y: torch.Tensor, *, what: str):
    """Clipped per-example gradients of two examples (nothing is kept, nothing released): a layer the
    engine cannot differentiate per example (e.g. data-dependent Python control flow under
    ``torch.func``) fails here with a :class:`ModelError`, before any output, not at the first step.

    Example:
        >>> from torch import nn
        >>> from privopt.grads import get_engine
        >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
        >>> x, y = torch.zeros(4, 3), torch.zeros(4, dtype=torch.long)
        >>> check_engine_fits(get_engine("vmap"), nn.Linear(3, 2), loss, x, y, what="x")  # fits: returns None
    """

    def clipped(xs, ys):
        with torch.random.fork_rng(devices=[]):
            engine.clipped_sum(model, loss_fn, xs, ys, clip=1.0)

    _, problem = _probe(clipped, (x[:2], y[:2]), (_public_like(x[:2]), _public_like(y[:2])))
    if problem:
        raise ModelError(
            f"the gradient engine ({type(engine).__name__}) cannot compute per-example gradients of the model on "
            f"{what} (a layer it cannot differentiate example by example?): {problem}{_recurrent_hint(model)}"
        )


def _recurrent_hint(model: nn.Module) -> str:
    """What to change when the model has recurrent layers, which ``torch.func`` (both engines'
    per-example gradients) runs only with an initial state given and without packed sequences."""
    kinds = sorted({type(m).__name__ for m in model.modules() if isinstance(m, (nn.RNNBase, nn.RNNCellBase))})
    if not kinds:
        return ""
    return (
        f"; the model has {', '.join(kinds)}: pass the initial hidden state, built from the layer's input "
        "(e.g. h0 = torch.zeros_like(x[:, 0, :1]).expand(num_layers * num_directions, -1, hidden_size) for "
        "batch_first inputs x; (h0, h0) for an LSTM), and mask padded positions instead of packing sequences "
        '(docs/engines.md, "Sequence models")'
    )


def _forward_probe(model: nn.Module, x: torch.Tensor) -> tuple[Any, str | None]:
    """:func:`_probe` of the model in eval mode on ``x`` (its mode restored, its randomness unused)."""

    def forward(inputs):
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            return model(inputs)

    was_training = model.training
    model.eval()
    try:
        return _probe(forward, (x,), (_public_like(x),))
    finally:
        model.train(was_training)


_VALUE_DEPENDENT = (
    "it fails on these records but not on zeros of the same shape and dtype; the error's text is withheld "
    "(it could quote a private record): check the records' values (e.g. labels out of range, token ids beyond "
    "an embedding's table)"
)


def _probe(fn: Any, private: tuple, public: tuple) -> tuple[Any, str | None]:
    """``(fn(*private), None)``, or ``(None, problem)`` when it fails. The problem is the first line
    of the error ``fn`` raises on ``public`` placeholders of the same shapes and dtypes, never of
    the error on the private records (it may quote them: "Target 12 is out of bounds")."""
    try:
        return fn(*private), None
    except _PROBE_ERRORS:
        pass
    try:
        fn(*public)
    except _PROBE_ERRORS as e:
        return None, _first_line(e)
    return None, _VALUE_DEPENDENT


def _public_like(t: Any) -> Any:
    """Zeros shaped like ``t`` (a placeholder that carries no record); non-tensors pass through."""
    return torch.zeros_like(t) if isinstance(t, torch.Tensor) else t


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def probe_rows(x: torch.Tensor) -> torch.Tensor:
    """The two records the model is checked on: the first two, or for integer ids (kept as int64 by
    :meth:`Dataset.validate`) those holding the largest and the smallest id, so an id beyond an
    embedding's table fails now rather than when a batch first holds it (the check's errors quote no
    value)."""
    if x.is_floating_point() or x.dtype == torch.bool or x.shape[0] < 2 or x[0].numel() == 0:
        return torch.arange(min(2, x.shape[0]), device=x.device)
    flat = x.reshape(x.shape[0], -1)
    return torch.stack([flat.amax(dim=1).argmax(), flat.amin(dim=1).argmin()])
