"""privopt: differentially private optimization of robust and non-convex objectives on PyTorch.

``privopt.PrivacyEngine`` (DP-SGD in your own training loop), ``privopt.fit`` (any algorithm in
one call), ``privopt.load_run`` (a finished run's released model, to predict with) and
``privopt.compare_runs`` (a sweep's runs side by side) are imported on first use, so
``import privopt`` (and the CLI's ``--help``) stays fast.
See ``docs/api.md``.
"""

from privopt.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = dict.fromkeys(("PrivacyEngine", "compare_runs", "fit", "load_run"), "privopt.api")

__all__ = ["PrivacyEngine", "__version__", "compare_runs", "fit", "load_run"]


__getattr__, __dir__ = lazy_exports("privopt", _LAZY, globals())
