"""Per-step timings over several fresh processes (``privopt bench --processes N``).

One process's step times depend on where its allocations landed: on the reference machine a fresh
process moved the cnn's DP-SGD ratio by about ±0.035 (``docs/results/performance.md``, phase 20),
more than the rounds within one process. With ``--processes N`` each (model, batch size) is timed
in ``N`` fresh processes one after the other (the methods interleaved in each, as in one process);
a row's time is the median of all their steps and its ratio the median of the processes' ratios,
with their range beside it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from privopt.errors import RunFailed
from privopt.quiet import public_tail

__all__ = ["times_in_processes"]

_CHILD = (
    "import json, torch\n"
    "from privopt.bench import _time_steps\n"
    "from privopt.config import resolve_device\n"
    "if {threads!r}: torch.set_num_threads({threads!r})\n"
    "times, _ = _time_steps({name!r}, {bs!r}, {methods!r}, repeats={repeats!r}, dev=resolve_device({device!r}))\n"
    "print(json.dumps(times))\n"
)


def times_in_processes(
    name: str, bs: int, methods: list[str], *, repeats: int, processes: int, threads: int | None, device: str
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``(every step's time by method, each process's median ratio to nonprivate by method)``.

    Raises:
        RunFailed: a timing process failed (its own error is shown under ``privopt --debug``).
    """
    pooled: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    code = _CHILD.format(name=name, bs=bs, methods=methods, repeats=repeats, threads=threads, device=device)
    for k in range(processes):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RunFailed(
                f"benchmark process {k + 1} of {processes} ({name}, batch {bs}) failed: {public_tail(proc.stderr)}"
            )
        times: dict[str, list[float]] = json.loads(proc.stdout.strip().splitlines()[-1])
        base = statistics.median(times["nonprivate"])
        for method, ts in times.items():
            pooled.setdefault(method, []).extend(ts)
            ratios.setdefault(method, []).append(statistics.median(ts) / base)
    return pooled, ratios
