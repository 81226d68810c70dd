"""Process-level parallelism over the independent runs of a reproduction (``--jobs N``).

A reproduction is many small training runs, each with one torch intra-op thread
(:func:`single_threaded`): two threads per run are much slower than one on a shared 2-core
machine, so a serial reproduction leaves every other core idle. :class:`Workers` runs the
independent calls in a pool of ``N`` *spawned* worker processes (never forked: forking after
torch has started its thread pools can deadlock), one torch thread each, and yields their
results in the order of the calls, whatever order they finish in, so outputs are identical for
every ``N``.

Datasets never travel to the workers by pickling (scattering features of mnist-st are hundreds
of MB): a call names its data with a :class:`DataRef` (a module-level loader and its arguments)
and every worker loads it itself, keeping one dataset at a time. An in-memory object shared by
every call (e.g. a user's own :class:`privopt.data.Dataset`) is pickled once per worker, not
once per call. Plugins (:mod:`privopt.plugins`) given to :class:`Workers` are imported by every
worker before its first call, so the names they register are known there too.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from privopt.config import plugin_target
from privopt.cores import pool_jobs, set_pool_jobs, usable_cores
from privopt.errors import ConfigError, PrivoptError
from privopt.plugins import import_plugins

__all__ = [
    "SHARED",
    "Call",
    "DataRef",
    "Workers",
    "picklable",
    "pool_jobs",
    "resolve_jobs",
    "run_ordered",
    "single_threaded",
    "usable_cores",
]

SHARED = "shared"  # Call.data: the object given to run_ordered(shared=...)
_GRACE_S = 2.0  # how long a stopped worker may take to exit before it is killed


@dataclass(frozen=True)
class DataRef:
    """Data a worker loads itself: ``load(**kwargs)``, ``load`` a module-level (importable) function.

    Attributes:
        load: the loader, e.g. :func:`privopt.experiments.dro_protocol.load_dro_dataset`.
        kwargs: its keyword arguments (JSON-serialisable: they are the cache key).
    """

    load: Callable[..., Any]
    kwargs: dict = field(default_factory=dict)

    def key(self) -> str:
        return f"{self.load.__module__}.{self.load.__qualname__}:{json.dumps(self.kwargs, sort_keys=True, default=str)}"


@dataclass(frozen=True)
class Call:
    """One independent call ``fn(*args, **kwargs)`` of :func:`run_ordered`.

    Attributes:
        args: positional arguments. kwargs: keyword arguments (both picklable when ``jobs > 1``).
        data: ``None``; a :class:`DataRef` (``fn`` gets ``data=`` the loaded dataset); or
            :data:`SHARED` (``fn`` gets ``data=`` the ``shared`` object of :func:`run_ordered`).
    """

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    data: DataRef | str | None = None


class _Slot:
    """The dataset of the latest :class:`DataRef` (one at a time: two mnist-st copies per worker
    would double its memory; the calls come in data order, so a worker rarely reloads)."""

    def __init__(self, shared: Any = None):
        self.shared, self.key, self.value = shared, None, None
        self.error: PrivoptError | None = None  # a plugin the worker could not import

    def resolve(self, data: DataRef | str | None) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        if data is None:
            return {}
        if data == SHARED:
            return {"data": self.shared}
        key = data.key()
        if key != self.key:
            self.key, self.value = None, None  # free the previous dataset before loading the next
            self.value, self.key = data.load(**data.kwargs), key
        return {"data": self.value}


_WORKER_SLOT = _Slot()  # a worker process's own dataset


def _init_worker(shared_blob: bytes | None, draw_ahead: bool, jobs: int = 1, plugins: tuple[str, ...] = ()) -> None:
    """Every worker: one torch intra-op thread (one run per core), noise drawn ahead only if
    ``draw_ahead``, its pool's size (:func:`pool_jobs`), the ``plugins`` (before the shared object,
    whose classes they may define), the shared object, foreign warnings without their text
    (``privopt.quiet``), and no SIGINT of its own: on Ctrl-C the parent cancels the pool (an active
    run still turns the signal into a checkpoint through its own handler)."""
    import signal

    import torch

    from privopt.grads.ahead import set_draw_ahead
    from privopt.quiet import hide_foreign_warnings

    set_pool_jobs(jobs)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    set_draw_ahead(enabled=draw_ahead)
    hide_foreign_warnings()  # its stderr is the CLI's: another library's warning text may quote a record
    try:
        import_plugins(list(plugins))
    except PrivoptError as e:  # raised by the first call: a clear error, not a broken pool
        _WORKER_SLOT.error = e
        return
    _WORKER_SLOT.shared = None if shared_blob is None else pickle.loads(shared_blob)


def _call_in_worker(fn: Callable, call: Call) -> Any:
    return fn(*call.args, **call.kwargs, **_WORKER_SLOT.resolve(call.data))


def resolve_jobs(jobs: Any) -> int:
    """The number of worker processes for ``jobs``: an integer ≥ 1, or 0 for every usable core.

    Example:
        >>> resolve_jobs(2)
        2
        >>> resolve_jobs(0) >= 1
        True
        >>> resolve_jobs(-1)
        Traceback (most recent call last):
        ...
        privopt.errors.ConfigError: jobs must be an integer >= 1 (or 0 for every CPU core), got -1
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
        raise ConfigError(f"jobs must be an integer >= 1 (or 0 for every CPU core), got {jobs!r}")
    return usable_cores() if jobs == 0 else jobs


def picklable(obj: Any, what: str) -> bytes:
    """``obj`` pickled, or a ConfigError saying why ``jobs > 1`` needs it picklable.

    Example:
        >>> len(picklable(max, "a model factory")) > 0
        True
        >>> picklable(lambda: None, "a model factory")
        Traceback (most recent call last):
        ...
        privopt.errors.ConfigError: jobs > 1 runs in separate processes and needs a model factory ...
    """
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # lambdas, local functions, open handles: each names its own problem
        raise ConfigError(
            f"jobs > 1 runs in separate processes and needs {what} that can be pickled "
            f"(a module-level function or class, or a registered name); use jobs=1 instead ({type(e).__name__}: {e})"
        ) from None


class Workers:
    """``jobs`` worker processes (started at the first call that needs them) for one or more
    :meth:`map` s, e.g. a reproduction's tuning and then its final runs; a context manager.

    ``jobs=1`` runs every call in this process. ``jobs > 1`` runs them in a pool of spawned
    workers, one torch thread each, whose runs draw their noise synchronously when there are no
    more usable cores than workers (:func:`privopt.grads.ahead.set_draw_ahead`); ``fn`` must then
    be a module-level function and the calls picklable. As with any spawned process, a script
    using ``jobs > 1`` needs the ``if __name__ == "__main__":`` guard.

    Args:
        jobs: worker processes (:func:`resolve_jobs`; 0: one per CPU core).
        shared: the object a call with ``data=SHARED`` receives (pickled once per worker).
        plugins: module names and ``.py`` files (from the current directory) to import, now in this
            process and in every worker before its first call (:func:`privopt.plugins.import_plugins`).

    Example:
        >>> with Workers(2) as workers:
        ...     list(workers.map(pow, [Call(args=(2, k)) for k in range(5)]))
        [1, 2, 4, 8, 16]
    """

    def __init__(self, jobs: int = 1, *, shared: Any = None, plugins: Sequence[str] = ()):
        self.jobs, self.shared = resolve_jobs(jobs), shared
        import_plugins(plugins)  # fails here, naming the plugin, before any worker starts
        self._plugins = tuple(plugin_target(p) for p in plugins)  # a worker imports the same files
        self._slot, self._pool = _Slot(shared), None  # this process's dataset: freed by close()
        # pickled now, so an unpicklable object fails before any run (the pool keeps it to start workers)
        parallel = shared is not None and self.jobs > 1
        self._blob = picklable(shared, "the dataset (or other shared object)") if parallel else None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)

    def close(self, *, failed: bool = False) -> None:
        """Shut the workers down (``failed``: stop the calls in flight instead of waiting for them)."""
        pool, self._pool, self._slot = self._pool, None, _Slot(self.shared)
        if pool is not None:
            _stop(pool) if failed else pool.shutdown(wait=True)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # With every core running a training thread, a noise thread per run only competes with
            # them: privopt demo --jobs 2 took longer with noise drawn ahead (docs/results/performance.md).
            draw_ahead = usable_cores() > self.jobs
            self._pool = ProcessPoolExecutor(
                max_workers=self.jobs,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(self._blob, draw_ahead, self.jobs, self._plugins),
            )
        return self._pool

    def map(self, fn: Callable, calls: Iterable[Call]) -> Iterator[Any]:
        """Results of ``fn`` over the calls, in call order, each as soon as every earlier one is done
        (a consumer that writes each as it comes leaves a valid prefix if it stops). An exception
        of any call propagates as soon as it happens and stops the workers (queued calls
        cancelled, running ones ended)."""
        calls = list(calls)
        if self.jobs == 1:
            for call in calls:
                yield fn(*call.args, **call.kwargs, **self._slot.resolve(call.data))
            return
        try:
            pool = self._executor()
            futures: list[Future] = [pool.submit(_call_in_worker, fn, call) for call in calls]
            order, pending = {f: i for i, f in enumerate(futures)}, set(futures)
            for future in futures:
                while not future.done():  # fail fast: a later call's error need not wait for this one
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in sorted(done, key=order.__getitem__):
                        if f.exception() is not None:
                            f.result()
                yield future.result()
        except BaseException:
            self.close(failed=True)
            raise


def run_ordered(
    fn: Callable, calls: Iterable[Call], *, jobs: int = 1, shared: Any = None, plugins: Sequence[str] = ()
) -> Iterator[Any]:
    """:meth:`Workers.map` with workers of its own: results of ``fn`` over independent calls, in
    the order of ``calls``, computed by ``jobs`` processes.

    Example:
        >>> from privopt.experiments.jobs import Call, run_ordered
        >>> list(run_ordered(pow, [Call(args=(2, k)) for k in range(5)], jobs=2))
        [1, 2, 4, 8, 16]
    """
    with Workers(jobs, shared=shared, plugins=plugins) as workers:
        yield from workers.map(fn, calls)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued calls and stop the workers now: a failed (or interrupted) reproduction
    must not wait minutes for the runs still in flight, nor leave processes behind."""
    # Python 3.11 has no public handle on the workers (3.14 adds terminate_workers()).
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    # A training run inside a worker installs its own SIGTERM handler, which only checkpoints at the
    # next step boundary: in a long evaluation it keeps running (and the interpreter's exit would wait
    # for it). Whatever outlives a short grace period is killed.
    for p in procs:
        p.join(timeout=_GRACE_S)
        if p.is_alive():
            p.kill()
    if manager is not None:  # it reaps the workers too: joining it first avoids racing it for their exit
        manager.join(timeout=30)
    for p in procs:
        p.join(timeout=30)


def single_threaded(fn: Callable) -> Callable:
    """Run ``fn`` with one torch intra-op thread (restored afterwards).

    Why: these runs are many small, sequential jobs. With 2 intra-op threads on a 2-core machine
    that is also busy with anything else, every small kernel waits for both threads to be
    scheduled; a per-sample-gradient call of the quick MLP measured 0.5 s with 2 threads vs 5 ms
    with 1 thread under load (100×). One thread is never much slower for models this size.
    """
    import torch

    def wrapped(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapped
