"""Loop callbacks of a training run: progress, signals and the divergence check.

Progress shows only public values (step, ε spent, test metrics): a bar on a terminal, plain
periodic lines otherwise (logs, CI), nothing when disabled.
"""

from __future__ import annotations

import math
import signal
import sys
from collections.abc import Callable
from typing import Any, TextIO

import torch
from torch import nn

from privopt.errors import RunDiverged
from privopt.training.loop import Callback, LoopState

__all__ = ["AlgorithmDone", "DivergenceGuard", "ProgressCallback", "RunDiverged", "SignalGuard"]


class AlgorithmDone(Callback):
    """End the loop (``state.stop = "done"``) once the algorithm says it has returned (``algo.done``:
    e.g. Gauss-PSGD certified its point, or its oracle's budget is spent) before the step schedule."""

    def __init__(self, algo: Any):
        self.algo = algo

    def on_step_end(self, state: LoopState, logs: dict[str, float]) -> None:
        if getattr(self.algo, "done", False) and state.step < state.total:
            state.stop = state.stop or "done"


class DivergenceGuard(Callback):
    """Stop with :class:`RunDiverged` as soon as a logged loss or a parameter is non-finite.

    One reduction per step: a NaN or inf anywhere makes the sum non-finite.
    """

    def __init__(self, model: nn.Module):
        self.params = list(model.parameters())

    def on_step_end(self, state: LoopState, logs: dict[str, float]) -> None:
        # Other logged values may be infinite on purpose (e.g. an unbounded clip when a step is skipped).
        bad = sorted(k for k, v in logs.items() if "loss" in k and isinstance(v, (int, float)) and not math.isfinite(v))
        if bad:
            raise RunDiverged(f"diverged at step {state.step}: non-finite {', '.join(bad)} (try a smaller lr)")
        with torch.no_grad():
            total = torch.stack([p.detach().sum(dtype=torch.float64) for p in self.params]).sum() if self.params else 0
        if not math.isfinite(float(total)):
            raise RunDiverged(f"diverged at step {state.step}: non-finite model parameters (try a smaller lr)")


class SignalGuard(Callback):
    """Turn SIGINT/SIGTERM into ``state.stop = "interrupted"``: the current step finishes and the
    run saves a checkpoint before stopping. Also a context manager, so a signal that arrives while
    outputs are being written is deferred instead of cutting the write short, then delivered again
    when the guard exits (a run that completed while the signal waited is saved, and its caller,
    e.g. a reproduction's next run, still sees the interrupt)."""

    def __init__(self) -> None:
        self.hit = False
        self._signum: int | None = None
        self._old: dict[int, Any] = {}
        self._state: LoopState | None = None

    def _handler(self, signum, frame) -> None:
        self.hit, self._signum = True, signum
        if self._state is not None:
            self._state.stop = "interrupted"

    def __enter__(self) -> SignalGuard:
        try:
            self._old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread: signals stay with whoever runs the thread
            self._old = {}
        return self

    def __exit__(self, exc_type, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        if self._signum is not None and exc_type is None and self._old:
            # The loop did not turn the signal into RunInterrupted (it came while outputs were
            # written): hand it to the restored handler instead of dropping it.
            signal.raise_signal(self._signum)

    def on_loop_start(self, state: LoopState) -> None:
        self._state = state
        if self.hit:
            state.stop = "interrupted"

    def on_loop_end(self, state: LoopState) -> None:
        self._state = None


class ProgressCallback(Callback):
    """A tqdm bar on a terminal, else one plain line about every 10 % of the run.

    Args:
        desc: label (the algorithm name).
        summary: returns the public values to show (e.g. ``{"eps": "0.52", "acc": "0.91"}``).
        enabled: True shows progress, False prints nothing, None ("auto") shows a bar only on a
            terminal and only once the run has lasted :data:`AUTO_DELAY_S` seconds, else nothing.
        stream: where to write (default ``sys.stderr``); a bar only if it is a terminal.
    """

    AUTO_DELAY_S = 3.0

    def __init__(
        self, *, desc: str, summary: Callable[[], dict[str, str]], enabled: bool | None, stream: TextIO | None = None
    ):
        self.desc, self.summary = desc, summary
        self.stream = stream if stream is not None else sys.stderr
        # Auto: silent in tests, notebooks and logs, where a bar or periodic lines would be noise.
        self.enabled = self._isatty() if enabled is None else bool(enabled)
        self._delay = self.AUTO_DELAY_S if enabled is None else 0.0
        self._bar = None
        self._every = 1

    def _isatty(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except (AttributeError, ValueError):
            return False

    def on_loop_start(self, state: LoopState) -> None:
        if not self.enabled:
            return
        if self._isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=state.total,
                initial=state.step,
                desc=self.desc,
                unit="step",
                leave=False,
                file=self.stream,
                delay=self._delay,  # a short auto run finishes before its bar would appear
            )
        self._every = max(1, math.ceil(state.total / 10))

    def on_step_end(self, state: LoopState, logs: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(self.summary(), refresh=False)
        elif state.step % self._every == 0 or state.step == state.total:
            self._line(state, f"({100 * state.step / max(1, state.total):.0f}%)")

    def _line(self, state: LoopState, where: str) -> None:
        extra = " ".join(f"{k}={v}" for k, v in self.summary().items())
        print(f"{self.desc}: step {state.step}/{state.total} {where} {extra}".rstrip(), file=self.stream)
        self.stream.flush()

    def on_loop_end(self, state: LoopState) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and state.stop == "done":
            # The schedule's total is a public upper bound; the method returned before it.
            self._line(state, "(done before the step bound)")
