"""Keep freed heap memory mapped between steps, so that per-step tensors do not page-fault.

By default glibc serves every allocation above its mmap threshold (128 KiB at start, raised
dynamically to at most 32 MiB) with a fresh ``mmap`` and returns it to the kernel when it is freed,
and it trims freed memory at the top of the heap. A training step allocates the same large tensors
every time (per-sample gradient blocks, their convolution kernels' scratch, activations), so each
step faults all of those pages in again. On the 2-core VM where issue 13 is measured, a resnet20
DP step (B = 128) page-faulted about 9,200 pages per per-sample weight-gradient call of a
64-channel 8x8 layer, 17 ms against 5.6 ms without the faults (``docs/results/performance-history.md``,
"Phase 10"). Raising both thresholds keeps freed memory in the process for the next step, as a
caching GPU allocator does. It is not given back to the system until the process ends, and heap
fragmentation raises the process's peak resident memory (resnet20, B = 512: by 14-17 %).

:func:`retain_freed_memory` does this once per process. privopt's own runs call it: every training
loop (private or not, so that ``privopt bench --end-to-end`` compares runs under one policy) and
``privopt bench``. The engines do not: in your own training loop (``PrivacyEngine``) the process is
yours, so call it yourself if the trade suits you. It does nothing when the process already chose
its allocator policy (any of the ``MALLOC_*_`` variables or ``GLIBC_TUNABLES`` set; ``privopt
bench`` sets them in its memory probes so that RSS follows the live tensors), when
``PRIVOPT_RETAIN_FREED_MEMORY=0``, or where glibc's ``mallopt`` is not available (macOS,
Windows, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["retain_freed_memory"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Allocations up to 1 GiB come from the heap; freed heap memory up to 2 GiB - 1 stays mapped.
_MMAP_THRESHOLD = 1 << 30
_TRIM_THRESHOLD = 2**31 - 1
_POLICY_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

_state: dict[str, bool] = {}


def retain_freed_memory() -> bool:
    """Ask glibc to keep freed memory mapped (once per process); whether the policy is in effect.

    Example:
        >>> from privopt.grads.alloc import retain_freed_memory
        >>> retain_freed_memory() in (True, False)
        True
    """
    if "applied" not in _state:
        _state["applied"] = _apply()
    return _state["applied"]


def _apply() -> bool:
    if os.environ.get("PRIVOPT_RETAIN_FREED_MEMORY", "1") == "0" or any(k in os.environ for k in _POLICY_ENV):
        return False  # the user's (or the memory probe's) allocator policy wins
    if not sys.platform.startswith("linux"):
        return False
    return _mallopt()


def _mallopt() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # Order matters: setting the mmap threshold explicitly also stops glibc from adjusting the
    # trim threshold dynamically.
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
