"""Where a training run's time goes: a breakdown by component for ``privopt bench --end-to-end``.

:class:`Breakdown` wraps a fixed list of functions (data loading, noise calibration, the gradient
engine and its phases, noise draws, batch sampling, ledger updates, evaluation, writing outputs)
for the duration of a ``with`` block and charges each call's wall time to its component.

* An *absorbing* component (calibration, evaluation, outputs, ...) keeps everything that runs
  inside it: the accounting a calibration does is calibration time.
* A *container* component (the algorithm's step, the engine) keeps only its own time: the engine
  calls inside a step are charged to the engine, the rest to ``step: update and other``.

The components add up to the measured wall time of the ``with`` block, up to ``other`` (anything
outside them: building the model and algorithm, the loop's callbacks, Python overhead).
Wrapping costs about a microsecond per call; only the benchmark uses it.

Example:
    >>> import torch
    >>> from privopt.grads import get_engine
    >>> from torch import nn
    >>> model = nn.Linear(3, 2)
    >>> loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    >>> with Breakdown() as bd:
    ...     _ = get_engine("ghost").clipped_sum(model, loss, torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), clip=1.0)
    >>> bd.counts["grad_evals"], bd.times["engine: forward+backward"] > 0
    (4, True)
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable

__all__ = ["COMPONENTS", "ENGINE_QUERIES", "Breakdown"]

# The engines' queries: each is timed, and counts its per-record gradients (see Breakdown).
_QUERIES = ("clipped_sum", "scaled_sum", "scaled_diff_sum")
# Every engine's queries, as (module, "Class.method") targets.
ENGINE_QUERIES = tuple(
    (module, f"{cls}.{query}")
    for module, cls in (("privopt.grads.engine", "VmapEngine"), ("privopt.grads.ghost.engine", "GhostEngine"))
    for query in _QUERIES
)

# (component, absorbing, [(module, attribute path)]): module-level functions are replaced in every
# privopt module that imported them by name; "Class.method" paths are patched on the class.
_TARGETS: tuple[tuple[str, bool, tuple[tuple[str, str], ...]], ...] = (
    ("setup: data loading", True, (("privopt.training.builder", "_dataset"),)),
    ("setup: model checks", True, (("privopt.training.builder", "check_engine_fits"),)),
    ("setup: noise calibration", True, (("privopt.privacy.calibration", "calibrate"),)),
    (
        "evaluation",
        True,
        (("privopt.training.metrics", "evaluate"), ("privopt.training.metrics", "compute_run_metrics")),
    ),
    (
        "accounting",
        True,
        (("privopt.privacy.ledger", "PrivacyLedger.record"), ("privopt.privacy.ledger", "PrivacyLedger.spent")),
    ),
    (
        "outputs and checkpoints",
        True,
        (("privopt.checkpoint", "save_checkpoint"), ("privopt.training.outputs", "write_outputs")),
    ),
    (
        "sampling",
        True,
        (("privopt.sampling", "PoissonSampler.sample"), ("privopt.sampling", "WithoutReplacementSampler.sample")),
    ),
    (
        "noise",
        True,
        (("privopt.grads.release", "draw_gaussian_noise"), ("privopt.grads.release", "draw_laplace_noise")),
    ),
    ("forward-only losses", True, (("privopt.grads.sums", "batch_losses"),)),
    ("engine: rest (vmap, sums)", False, ENGINE_QUERIES),
    ("engine: forward+backward", True, (("privopt.grads.ghost.engine", "GhostEngine._collect"),)),
    (
        "engine: norms and clip factors",
        True,
        (("privopt.grads.ghost.engine", "build_term"), ("privopt.grads.ghost.engine", "clip_terms")),
    ),
)
STEP = "step: update and other"
COMPONENTS = tuple(c for c, _, _ in _TARGETS) + (STEP, "other")


class Breakdown:
    """Context manager: per-component wall time (``times``), call counts (``calls``) and
    ``counts["grad_evals"]`` (per-record gradients the engines' queries computed; two per record
    in a difference query, whatever the number of passes an engine takes for it) and
    ``counts["sampled"]`` (records drawn by the samplers)."""

    def __init__(self, *, targets=None, components=COMPONENTS, loop: bool = True) -> None:
        """``targets``: ``(component, absorbing, [(module, attribute path)])`` entries (default: a
        training run's); ``components``: their report order; ``loop``: wrap the training loop's step."""
        self.targets, self.components, self.loop = _TARGETS if targets is None else targets, components, loop
        self.times: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.counts: dict[str, int] = defaultdict(int)
        self.wall_s = 0.0
        self._stack: list[list] = []  # [component, absorbing, time of wrapped children]
        self._undo: list[tuple[object, str, object]] = []
        self._engine_depth: list[int] = []

    # ------------------------------------------------------------------ wrapping
    def wrap(self, fn: Callable, component: str, absorbing: bool) -> Callable:
        """``fn`` timed as ``component`` (see the module docstring for absorbing/container)."""
        stack, times, calls = self._stack, self.times, self.calls

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if stack and stack[-1][1]:
                return fn(*args, **kwargs)
            frame = [component, absorbing, 0.0]
            stack.append(frame)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                stack.pop()
                times[component] += dt - frame[2]
                calls[component] += 1
                if stack:
                    stack[-1][2] += dt

        timed.__privopt_timed__ = fn
        return timed

    def wrap_step(self, step: Callable) -> Callable:
        """The algorithm's step function, as a container component."""
        return self.wrap(step, STEP, False)

    def _set(self, owner: object, name: str, value: object) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _patch(self, module_name: str, path: str, component: str, absorbing: bool) -> None:
        module = importlib.import_module(module_name)
        if "." in path:
            cls_name, meth = path.split(".")
            cls = getattr(module, cls_name)
            self._set(cls, meth, self._counting(self.wrap(cls.__dict__[meth], component, absorbing), path))
            return
        fn = getattr(module, path)
        timed = self.wrap(fn, component, absorbing)
        if path == "check_engine_fits":  # its per-example gradients check the model; no batch was sampled
            timed = self._uncounted(timed)
        for mod in [m for name, m in list(sys.modules.items()) if name.startswith("privopt") and m is not None]:
            for attr, value in list(vars(mod).items()):
                if value is fn:
                    self._set(mod, attr, timed)

    def _uncounted(self, fn: Callable) -> Callable:
        depth = self._engine_depth

        @functools.wraps(fn)
        def call(*args, **kwargs):
            depth.append(1)  # engine calls inside are not counted as gradient evaluations
            try:
                return fn(*args, **kwargs)
            finally:
                depth.pop()

        return call

    def _counting(self, fn: Callable, path: str) -> Callable:
        counts, depth = self.counts, self._engine_depth
        if path.split(".")[-1] in _QUERIES:

            def engine_call(self_, model, loss_fn, inputs, *args, **kwargs):
                # Count a query once, not the queries it makes (a fallback, a default's passes).
                if not depth:
                    two = "scale_prev" in kwargs or kwargs.get("params_prev") is not None
                    counts["grad_evals"] += int(inputs.shape[0]) * (2 if two else 1)
                depth.append(1)
                try:
                    return fn(self_, model, loss_fn, inputs, *args, **kwargs)
                finally:
                    depth.pop()

            return functools.wraps(fn)(engine_call)
        if path.endswith(".sample"):

            def sample(self_):
                idx = fn(self_)
                counts["sampled"] += int(idx.numel())
                return idx

            return functools.wraps(fn)(sample)
        return fn

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Breakdown:
        for mod in ("privopt.training", "privopt.algorithms", "privopt.grads.ghost", "privopt.training.run"):
            importlib.import_module(mod)
        for component, absorbing, targets in self.targets:
            for module_name, path in targets:
                self._patch(module_name, path, component, absorbing)
        if self.loop:
            run_mod = importlib.import_module("privopt.training.run")
            original_loop = run_mod.run_loop
            self._set(run_mod, "run_loop", lambda step, *a, **k: original_loop(self.wrap_step(step), *a, **k))
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.perf_counter() - self._t0
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()
        self.times["other"] = max(0.0, self.wall_s - sum(v for k, v in self.times.items() if k != "other"))

    def as_dict(self) -> dict[str, float]:
        """``{component: seconds}`` for every component (0.0 when unused), in report order."""
        return {c: float(self.times.get(c, 0.0)) for c in self.components}
