"""Step-time and memory benchmark of the per-sample clipping engines (``privopt bench``).

Every timed method performs one full optimiser step on the same model, batch and thread count,
in one process, interleaved (``repeats`` rounds, one step of each method per round, after one
warm-up step each) so that machine noise hits all methods alike; the median is reported.

Methods:
    nonprivate: forward, mean loss, backward, SGD update.
    dp-sgd: ``get_engine("auto")`` clipped sum + Gaussian noise + update.
    dp-sgd-vmap: the same with the reference ``vmap`` engine.
    clipped-difference: auto engine, clipped sum of per-sample gradient *differences* between the
        current point and a fixed second point (the SPIDER/SVRG query) + noise + update.
    dp-sgd-secure: dp-sgd with the noise from privopt.rng's secret ``SecureSource`` (AES-CTR), the
        default of every run; the other private methods use a seeded ``TorchSource``. Both are
        wrapped in :class:`~privopt.grads.ahead.NoiseAhead`, as in ``privopt train``: the next
        step's noise is drawn in a background thread while the engine runs.
    dp-sgd-sync: dp-sgd with the seeded noise drawn synchronously after the engine (what drawing
        ahead saves).
    opacus-hooks / opacus-ghost: Opacus DP-SGD (hooks mode, and ghost clipping), when importable.
    noise-only / noise-only-secure: just the Gaussian noise draw (``d`` values, synchronous: the
        cost that drawing ahead hides) and the update, from the seeded or the secure source.

Peak memory (``peak_mb``) is measured for CPU tensors, which ``tracemalloc`` cannot see: each
(model, batch, method) runs in a fresh subprocess that builds the model, data and optimiser state,
performs one warm-up step, reads its resident set size (``VmRSS``), resets the kernel's peak-RSS
mark (``/proc/self/clear_refs``), performs two steps and reports the peak (``VmHWM``) minus that
baseline: the extra memory one step needs. glibc runs with a fixed mmap threshold so that freed
tensors leave the RSS at once (otherwise the allocator's caching hides or inflates peaks). The
model, optimiser state and batch are in the baseline, so the number is dominated by activations
and per-step buffers.
"""

from __future__ import annotations

import copy
import gc
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from privopt.bench_breakdown import nonprivate_backward, nonprivate_forward, step_breakdowns
from privopt.bench_opacus import opacus_step
from privopt.config import resolve_device
from privopt.errors import ConfigError
from privopt.grads.alloc import retain_freed_memory

__all__ = ["METHODS", "MODELS", "format_table", "run_bench"]

METHODS = (
    "nonprivate",
    "dp-sgd",
    "dp-sgd-vmap",
    "clipped-difference",
    "dp-sgd-secure",
    "dp-sgd-sync",
    "opacus-hooks",
    "opacus-ghost",
    "noise-only",
    "noise-only-secure",
)
MODELS = ("mlp", "cnn", "resnet20", "tiny")
_INPUT = {
    "mlp": (1, 28, 28),
    "cnn": (1, 28, 28),
    "resnet20": (3, 32, 32),
    "tiny": (1, 4, 4),
}
_NUM_CLASSES = 10
_LR, _CLIP, _SIGMA = 0.05, 1.0, 1.0


# ------------------------------------------------------------------------------------------
# Models (local builders; privopt.models is used when it provides the name).
# ------------------------------------------------------------------------------------------


def build_bench_model(name: str, *, seed: int = 0) -> nn.Module:
    """The benchmark model ``name`` from :mod:`privopt.models` (``tiny``: a toy MLP), initialised."""
    if name not in _INPUT:
        raise ConfigError(f"unknown benchmark model {name!r}; choose from {', '.join(MODELS)}")
    torch.manual_seed(seed)
    if name == "tiny":  # smoke tests only
        c, h, w = _INPUT[name]
        model = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 8), nn.ReLU(), nn.Linear(8, _NUM_CLASSES))
    else:
        from privopt.models import build_model

        model = build_model(name, input_shape=_INPUT[name], num_classes=_NUM_CLASSES)
    with torch.no_grad():  # materialise lazy layers
        model(torch.zeros(1, *_INPUT[name]))
    return model


# ------------------------------------------------------------------------------------------
# Step functions.
# ------------------------------------------------------------------------------------------


def _per_sample_ce(out, y):
    return nn.functional.cross_entropy(out, y, reduction="none")


class _FlatUpdate:
    """``p -= lr * flat[slice of p]`` for every trainable parameter, in one fused call."""

    def __init__(self, model: nn.Module):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.numels = [p.numel() for p in self.params]
        self.dim = sum(self.numels)

    def __call__(self, flat: torch.Tensor, lr: float) -> None:
        with torch.no_grad():
            views = [v.view_as(p) for v, p in zip(flat.split(self.numels), self.params)]
            torch._foreach_add_(self.params, views, alpha=-lr)


def _noise_source(method: str):
    from privopt.grads.ahead import NoiseAhead
    from privopt.rng import SecureSource, TorchSource

    src = SecureSource() if method.endswith("-secure") else TorchSource(seed=2)
    return src if method.startswith("noise-only") or method.endswith("-sync") else NoiseAhead(src)


def _make_step(method: str, base: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None] | None:
    """A closure performing one step of ``method`` on a private copy of ``base`` (None: unavailable)."""
    # the noise draw is looked up in its module per step, so that --breakdown can time it
    from privopt.grads import get_engine, release

    model = copy.deepcopy(base)
    B = x.shape[0]
    if method == "nonprivate":
        opt = torch.optim.SGD(model.parameters(), lr=_LR)

        def step():
            opt.zero_grad(set_to_none=True)
            nonprivate_backward(nonprivate_forward(model, x, y))
            opt.step()

        return step
    update = _FlatUpdate(model)
    if method in ("dp-sgd", "dp-sgd-vmap", "clipped-difference", "dp-sgd-secure", "dp-sgd-sync"):
        engine = get_engine("vmap" if method == "dp-sgd-vmap" else "auto")
        prev = None
        if method == "clipped-difference":
            g = torch.Generator().manual_seed(1)
            prev = {
                n: p.detach() + 0.01 * torch.randn(p.shape, generator=g).to(p.device)
                for n, p in model.named_parameters()
            }
        rng = _noise_source(method)

        def step():
            res = engine.clipped_sum(model, _per_sample_ce, x, y, clip=_CLIP, params_prev=prev)
            noise = release.draw_gaussian_noise(update.dim, std=_SIGMA * _CLIP, rng=rng, device=x.device)
            update(res.total.add_(noise), _LR / B)

        return step
    if method in ("noise-only", "noise-only-secure"):
        rng = _noise_source(method)

        def step():
            update(release.draw_gaussian_noise(update.dim, std=_SIGMA * _CLIP, rng=rng, device=x.device), _LR / B)

        return step
    if method in ("opacus-hooks", "opacus-ghost"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return opacus_step(method, model, x, y, lr=_LR, clip=_CLIP, sigma=_SIGMA)
        except ImportError:
            return None
    raise ConfigError(f"unknown benchmark method {method!r}; choose from {', '.join(METHODS)}")


def _data(name: str, batch_size: int):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(batch_size, *_INPUT[name], generator=g)
    y = torch.randint(0, _NUM_CLASSES, (batch_size,), generator=g)
    return x, y


# ------------------------------------------------------------------------------------------
# Memory probe (runs in a child process).
# ------------------------------------------------------------------------------------------


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0), so setup/import peaks are not counted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _probe(model_name: str, batch_size: int, method: str, threads: int | None) -> float | None:
    if threads:
        torch.set_num_threads(threads)
    base = build_bench_model(model_name)
    x, y = _data(model_name, batch_size)
    step = _make_step(method, base, x, y)
    if step is None:
        return None
    del base
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step()  # warm-up: one-off lazy initialisation is not per-step memory
        gc.collect()
        baseline = _status_mb("VmRSS")
        reset = _reset_peak()
        for _ in range(2):
            step()
    # VmHWM is the peak RSS since the reset; without a reset, ru_maxrss (lifetime peak) is the
    # best available and may include import-time peaks.
    peak = _status_mb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if baseline is None or peak is None:
        return None
    return max(0.0, peak - baseline)


def _peak_mb(model_name: str, batch_size: int, method: str, threads: int | None) -> float | None:
    code = (
        "import json,sys; from privopt.bench import _probe; "
        f"print(json.dumps(_probe({model_name!r}, {batch_size}, {method!r}, {threads!r})))"
    )
    # A fixed mmap threshold makes glibc return every large block to the OS when freed, so RSS
    # follows the live tensors instead of whatever the allocator chose to keep.
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "MALLOC_TRIM_THRESHOLD_": "131072",
    }
    try:
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
            env=env,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


# ------------------------------------------------------------------------------------------
# Public API.
# ------------------------------------------------------------------------------------------


def _check_count(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def _check_args(*, models, batch_sizes, repeats, threads, methods) -> None:
    """Every argument is checked before the first model is built (nothing runs on a bad one)."""
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ConfigError(f"unknown benchmark method(s) {bad}; choose from {', '.join(METHODS)}")
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        raise ConfigError(f"unknown benchmark model(s) {bad or list(models)}; choose from {', '.join(MODELS)}")
    if not batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch_sizes):
        raise ConfigError(f"batch sizes must be integers >= 1, got {list(batch_sizes)}")
    _check_count(repeats, "repeats")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be an integer >= 1 (or None: PyTorch's setting), got {threads!r}")


def run_bench(
    *,
    models: Sequence[str] = ("mlp", "cnn", "resnet20"),
    batch_sizes: Sequence[int] = (128, 512),
    repeats: int = 5,
    threads: int | None = None,
    progress: bool = True,
    methods: Iterable[str] = METHODS,
    memory: bool = True,
    device: str = "cpu",
    processes: int = 1,
    breakdown: bool = False,
) -> list[dict]:
    """Time one optimiser step of each method (median of ``repeats``) and measure its peak memory.

    Args:
        models: benchmark model names (``mlp``, ``cnn``, ``resnet20``; ``tiny`` for smoke tests).
        batch_sizes: batch sizes to time.
        repeats: timed rounds per (model, batch); the median is reported.
        threads: ``torch.set_num_threads`` value (``None``: leave PyTorch's setting).
        progress: print one line per finished row to stderr.
        methods: subset of :data:`METHODS`.
        memory: also measure ``peak_mb`` (one subprocess per row; ``None`` when off; CPU only).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (model, batch and noise on that device).
        processes: time each (model, batch size) in this many fresh processes, one after the other
            (:mod:`privopt.bench_procs`): the median of their ratios, and ``ratio_range``.
        breakdown: also time each method's step by component in this process (``repeats`` more
            rounds; :mod:`privopt.bench_breakdown`): each row gets ``breakdown``, seconds per step.

    Returns:
        One dict per (model, batch size, method): ``model``, ``batch_size``, ``method``, ``mode`` ("step"),
        ``median_s``, ``min_s``, ``peak_mb``, ``ratio_to_nonprivate``, ``mem_ratio_to_nonprivate``, ``threads``,
        ``repeats``, ``processes``, ``ratio_range``, ``load_avg`` (before, after) and ``note`` (why skipped).

    Example:
        >>> rows = run_bench(models=("tiny",), batch_sizes=(4,), repeats=1, progress=False,
        ...                  methods=("nonprivate", "dp-sgd"), memory=False)
        >>> [r["method"] for r in rows]
        ['nonprivate', 'dp-sgd']
    """
    dev = resolve_device(device)
    memory, methods = memory and dev.type == "cpu", list(methods)  # the peak-RSS probe measures host memory
    _check_args(models=models, batch_sizes=batch_sizes, repeats=repeats, threads=threads, methods=methods)
    _check_count(processes, "processes")
    methods = [*([] if "nonprivate" in methods else ["nonprivate"]), *methods]  # every ratio needs the baseline
    old_threads, rows, load0 = torch.get_num_threads(), [], os.getloadavg()[0]
    if threads:
        torch.set_num_threads(int(threads))
    try:
        kw = dict(repeats=repeats, memory=memory, dev=dev, processes=processes, breakdown=breakdown)
        for name, bs in itertools.product(models, batch_sizes):
            block = _bench_block(name, int(bs), methods, **kw)
            if progress:
                print("\n".join(map(_fmt_row, block)), file=sys.stderr, flush=True)
            rows.extend(block)
    finally:
        torch.set_num_threads(old_threads)
    load = [load0, os.getloadavg()[0]]  # 1-minute load average before and after: how busy the machine was
    return [{**row, "load_avg": load} for row in rows]


def _time_steps(
    name: str, bs: int, methods: list[str], *, repeats: int, dev, breakdown=False, timed=True
) -> tuple[dict, dict]:
    """Per-method step times, the methods interleaved round by round (a load change hits them all;
    none with ``timed=False``), and with ``breakdown`` each method's median seconds per step by component."""
    retain_freed_memory()  # the same allocator policy as privopt's training runs (docs/engines.md)
    base = build_bench_model(name).to(dev)
    x, y = (t.to(dev) for t in _data(name, bs))
    steps = {m: _make_step(m, base, x, y) for m in methods}
    times: dict[str, list[float]] = {m: [] for m in methods if steps[m] is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns on every step about its hooks
        for s in steps.values():  # warm-up (lazy init, allocator)
            if s is not None:
                s()
        for _ in range(repeats if timed else 0):
            for m, ts in times.items():
                t0 = time.perf_counter()
                steps[m]()
                ts.append(time.perf_counter() - t0)
        parts = step_breakdowns({m: steps[m] for m in times}, repeats=repeats) if breakdown else {}
    return times, parts


def _bench_block(name, bs, methods, *, repeats: int, memory: bool, dev, processes=1, breakdown=False) -> list[dict]:
    """The rows of one (model, batch size); ratios against the first method (non-private). With
    ``processes > 1`` timed in that many fresh processes (:mod:`privopt.bench_procs`)."""
    ratios: dict[str, list[float]] = {}
    parts: dict[str, dict[str, float]] = {}
    if processes > 1:
        from privopt.bench_procs import times_in_processes

        threads = torch.get_num_threads()
        times, ratios = times_in_processes(
            name, bs, methods, repeats=repeats, processes=processes, threads=threads, device=str(dev)
        )
    if processes == 1 or breakdown:  # with fresh processes, only the breakdown is measured here
        got, parts = _time_steps(name, bs, methods, repeats=repeats, dev=dev, breakdown=breakdown, timed=processes == 1)
        times = got if processes == 1 else times
    block = []
    for m in methods:
        row = {
            "model": name,
            "batch_size": bs,
            "method": m,
            "mode": "step",
            "threads": torch.get_num_threads(),
            "repeats": repeats,
            "median_s": None,
            "min_s": None,
            "peak_mb": None,
            "ratio_to_nonprivate": None,
            "mem_ratio_to_nonprivate": None,
            "note": "",
            "processes": processes,
            "ratio_range": [min(ratios[m]), max(ratios[m])] if m in ratios else None,
            "breakdown": parts.get(m),
        }
        if m not in times:
            row["note"] = "opacus not importable (pip install 'privopt[bench]', or make bench)"
        else:
            row["median_s"] = statistics.median(times[m])
            row["min_s"] = min(times[m])
            if memory:
                row["peak_mb"] = _peak_mb(name, bs, m, torch.get_num_threads())
        block.append(row)
    ref = block[0]
    for row in block:
        if row["median_s"] is not None:  # several processes: the median of their own ratios
            own = ratios.get(row["method"])
            row["ratio_to_nonprivate"] = statistics.median(own) if own else row["median_s"] / ref["median_s"]
        # below ~1 MB the baseline is allocator noise and a ratio would mean nothing
        if row["peak_mb"] is not None and ref["peak_mb"] is not None and ref["peak_mb"] >= 1.0:
            row["mem_ratio_to_nonprivate"] = row["peak_mb"] / ref["peak_mb"]
    return block


def _num(v, fmt):
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _fmt_row(r: dict) -> str:
    return (
        f"{r['model']} B={r['batch_size']} {r['method']}: {_num(r['median_s'], '.4f')} s "
        f"(x{_num(r['ratio_to_nonprivate'], '.2f')}), peak {_num(r['peak_mb'], '.0f')} MB {r['note']}"
    )


def format_table(rows: Sequence[dict]) -> str:
    """Render :func:`run_bench` rows as a Markdown table.

    Example:
        >>> print(format_table([{"model": "mlp", "batch_size": 8, "method": "nonprivate", "median_s": 0.001,
        ...                      "peak_mb": 1.0, "ratio_to_nonprivate": 1.0}]).splitlines()[2])
        | mlp | 8 | nonprivate | 1.00 | 1.00 | 1.0 | – |  |
    """
    head = (
        "| model | batch | method | median ms | × non-private | peak MB | × non-private mem | note |\n"
        "|---|---:|---|---:|---:|---:|---:|---|"
    )
    lines = [head]
    for r in rows:
        ms = None if r.get("median_s") is None else 1000 * r["median_s"]
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {r['method']} | {_num(ms, '.2f')} | "
            f"{_num(r.get('ratio_to_nonprivate'), '.2f')} | {_num(r.get('peak_mb'), '.1f')} | "
            f"{_num(r.get('mem_ratio_to_nonprivate'), '.2f')} | {r.get('note', '')} |"
        )
    return "\n".join(lines)
