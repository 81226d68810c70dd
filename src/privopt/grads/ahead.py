"""Privacy noise drawn ahead, in a background thread, while the gradient engine runs.

A Gaussian release needs ``d`` fresh normals per step (``d`` = number of parameters). Drawing
them is data-independent work that, on a small model, costs a third of a non-private step.
:class:`NoiseAhead` wraps the run's noise source: right after a normal draw is handed out, the
next draw of the same shape is started in a background thread, so it overlaps the next
forward/backward pass instead of following it.

It changes nothing else (``docs/engines.md``, "Noise drawn ahead"):

* **Same values, same order.** The wrapped source is the only generator; a draw made ahead is
  exactly the draw the next synchronous call would have made. Any other request (another shape,
  a uniform, a checkpoint of the state) first cancels the pending draw — it rewinds the source to
  the state before it and discards the values — so the stream of values a run consumes is
  identical to the unwrapped source's, for every interleaving of calls.
* **Same secrecy.** Values drawn ahead live only in this object until handed out once; a
  discarded draw is never used (after a rewind the source re-generates the same values for the
  next request, which is then their only use). ``state_dict`` is the state *before* any pending
  draw, so a checkpoint never skips or repeats noise.

Example:
    >>> from privopt.rng import TorchSource
    >>> ahead, plain = NoiseAhead(TorchSource(seed=0)), TorchSource(seed=0)
    >>> a = [ahead.normal((3,)), ahead.uniform((2,)), ahead.normal((3,))]
    >>> b = [plain.normal((3,)), plain.uniform((2,)), plain.normal((3,))]
    >>> all(bool((x == y).all()) for x, y in zip(a, b))
    True
    >>> ahead.close()
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from privopt.errors import ConfigError
from privopt.rng import RandomSource

__all__ = ["NoiseAhead", "run_noise_source", "set_draw_ahead"]

_PROCESS = {"ahead": True}  # whether the runs this process starts draw ahead (set_draw_ahead)


def set_draw_ahead(*, enabled: bool) -> None:
    """Whether the runs this process starts draw their noise ahead (default ``True``).

    The worker processes of parallel runs (``--jobs N``, :class:`privopt.experiments.jobs.Workers`)
    turn it off when there are no more usable cores than workers: every core then runs a training
    thread already, and a noise thread only competes with them (``docs/engines.md``, "Noise drawn
    ahead"). The values, their order and the checkpoints are the same either way.

    Args:
        enabled: ``True`` to wrap each run's noise source in :class:`NoiseAhead`, ``False`` to draw
            synchronously.
    """
    if not isinstance(enabled, bool):
        raise ConfigError(f"set_draw_ahead(enabled=...) takes True or False, got {enabled!r}")
    _PROCESS["ahead"] = enabled


def run_noise_source(source: RandomSource) -> RandomSource:
    """A run's noise source: ``source`` wrapped in :class:`NoiseAhead`, or ``source`` itself when this
    process draws synchronously (:func:`set_draw_ahead`).

    Example:
        >>> from privopt.rng import TorchSource
        >>> type(run_noise_source(TorchSource(seed=0))).__name__
        'NoiseAhead'
    """
    return NoiseAhead(source) if _PROCESS["ahead"] else source


class NoiseAhead(RandomSource):
    """A :class:`~privopt.rng.RandomSource` that draws the next normal of the last requested
    shape in a background thread (values and order identical to ``source``'s).

    Args:
        source: the run's noise source (secure or seeded); it must not be used directly while
            wrapped.
    """

    def __init__(self, source: RandomSource):
        if not isinstance(source, RandomSource) or isinstance(source, NoiseAhead):
            raise ConfigError(f"NoiseAhead wraps a privopt.rng.RandomSource, got {type(source).__name__}")
        self.source = source
        self._lock = threading.Lock()  # serialises every use of the wrapped source
        self._pending: tuple[tuple, dict[str, Any], Future] | None = None  # (spec, state before, draw)
        self._pool: ThreadPoolExecutor | None = None
        self._finalizer = None

    @property
    def secure(self) -> bool:  # type: ignore[override]
        return self.source.secure

    # -- the pending draw ------------------------------------------------------------------

    def _draw(self, spec: tuple) -> torch.Tensor:
        shape, dtype, device = spec
        with self._lock:
            return self.source.normal(shape, dtype=dtype, device=device)

    def _start(self, spec: tuple) -> None:
        if self._pool is None:
            # torch.set_num_threads holds only in the thread that called it: without this the draws
            # ran on one OpenMP thread per core beside the caller's, and two runs on two cores (a
            # reproduction's --jobs 2) spun on each other (docs/engines.md, "Noise drawn ahead").
            self._pool = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="privopt-noise",
                initializer=torch.set_num_threads,
                initargs=(torch.get_num_threads(),),
            )
            self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False)
        with self._lock:
            before = self.source.state_dict()
        self._pending = (spec, before, self._pool.submit(self._draw, spec))

    def _cancel(self) -> None:
        """Discard the pending draw and rewind the source to the state before it."""
        if self._pending is None:
            return
        _spec, before, fut = self._pending
        self._pending = None
        try:
            fut.result()
        finally:
            with self._lock:
                self.source.load_state_dict(before)

    def close(self) -> None:
        """Cancel the pending draw and stop the background thread (also done at garbage collection)."""
        self._cancel()
        if self._finalizer is not None:
            self._finalizer()

    # -- RandomSource ----------------------------------------------------------------------

    def normal(self, shape, *, dtype=torch.float32, device=None):
        dims = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
        spec = (dims, dtype, torch.device(device) if device is not None else None)
        if self._pending is not None and self._pending[0] == spec:
            out = self._pending[2].result()
            self._pending = None
        else:
            self._cancel()
            out = self._draw(spec)
        self._start(spec)
        return out

    def _sync(self, method: str, *args):
        self._cancel()
        with self._lock:
            return getattr(self.source, method)(*args)

    def uniform(self, shape):
        return self._sync("uniform", shape)

    def randint(self, high, shape):
        return self._sync("randint", high, shape)

    def randperm(self, n):
        return self._sync("randperm", n)

    def binomial(self, count, prob, size):
        return self._sync("binomial", count, prob, size)

    def state_dict(self):
        """The wrapped source's state before any pending draw (SECRET for a secure source)."""
        if self._pending is not None:
            self._pending[2].result()  # let the draw finish before the state is read
            return self._pending[1]
        with self._lock:
            return self.source.state_dict()

    def load_state_dict(self, state):
        if self._pending is not None:  # its values belong to the state being replaced: dropped
            fut, self._pending = self._pending[2], None
            fut.result()
        with self._lock:
            self.source.load_state_dict(state)
