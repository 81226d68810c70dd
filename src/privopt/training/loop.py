"""The step loop every training job shares, and the callback interface around it.

:func:`run_loop` only calls ``step(t)`` until the schedule ends or a callback asks it to stop,
timing the steps alone (evaluation and writing outputs are not part of an algorithm's wall time).
Everything else (evaluation, checkpoints, progress, signals, divergence checks) is a
:class:`Callback`.

Example:
    >>> seen = []
    >>> state = run_loop(lambda t: {"t": t}, LoopState(step=0, total=5),
    ...                  [Every(2, lambda st, logs: seen.append(st.step))])
    >>> state.step, seen
    (5, [2, 4, 5])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from privopt.grads.alloc import retain_freed_memory

__all__ = ["Callback", "Every", "LoopState", "StepLimit", "run_loop"]


@dataclass
class LoopState:
    """Where a loop is. ``stop`` is set by a callback (``"paused"``, ``"interrupted"``) to end it
    after the current step; ``algo_time_s`` sums the time spent inside ``step`` only."""

    step: int
    total: int
    start_step: int | None = None
    algo_time_s: float = 0.0
    stop: str | None = None
    logs: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.start_step is None:
            self.start_step = self.step


class Callback:
    """Hooks called by :func:`run_loop`; override the ones you need."""

    def on_loop_start(self, state: LoopState) -> None:
        """Before the first step of this call (also when resuming)."""

    def on_step_end(self, state: LoopState, logs: dict[str, float]) -> None:
        """After each step; ``state.step`` already counts it."""

    def on_loop_end(self, state: LoopState) -> None:
        """After the loop, also when a step raised."""


def run_loop(
    step: Callable[[int], dict[str, float]], state: LoopState, callbacks: Sequence[Callback] = ()
) -> LoopState:
    """Call ``step(t)`` for ``t = state.step .. state.total - 1`` unless a callback sets ``state.stop``."""
    # Every run (private or not) steps with the same allocator policy as the engines' queries.
    retain_freed_memory()
    for cb in callbacks:
        cb.on_loop_start(state)
    try:
        while state.step < state.total and state.stop is None:
            t0 = time.perf_counter()
            logs = step(state.step) or {}
            state.algo_time_s += time.perf_counter() - t0
            state.step += 1
            state.logs = logs
            for cb in callbacks:
                cb.on_step_end(state, logs)
    finally:
        for cb in callbacks:
            cb.on_loop_end(state)
    return state


class Every(Callback):
    """Call ``fn(state, logs)`` every ``every`` steps and (``at_end``) after the last one."""

    def __init__(self, every: int, fn: Callable[[LoopState, dict[str, float]], None], *, at_end: bool = True):
        self.every, self.fn, self.at_end = max(1, int(every)), fn, at_end

    def on_step_end(self, state: LoopState, logs: dict[str, float]) -> None:
        last = state.step == state.total
        if (state.step % self.every == 0 and not last) or (last and self.at_end):
            self.fn(state, logs)


class StepLimit(Callback):
    """Pause (``state.stop = "paused"``) after ``max_steps`` steps in this call (None: no limit)."""

    def __init__(self, max_steps: int | None):
        self.max_steps = max_steps

    def _check(self, state: LoopState) -> None:
        if self.max_steps is not None and state.step - state.start_step >= self.max_steps and state.step < state.total:
            state.stop = state.stop or "paused"

    def on_loop_start(self, state: LoopState) -> None:
        self._check(state)

    def on_step_end(self, state: LoopState, logs: dict[str, float]) -> None:
        self._check(state)
