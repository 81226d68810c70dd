"""privopt: differentially private optimization of robust and non-convex objectives on PyTorch.

``privopt.PrivacyEngine`` (DP-SGD in your own training loop), ``privopt.fit`` (any algorithm in
one call), ``privopt.load_run`` (a finished run's released model, to predict with) and
``privopt.compare_runs`` (a sweep's runs side by side) are imported on first use, so
``import privopt`` (and the CLI's ``--help``) stays fast.
See ``docs/api.md``.
"""

__version__ = "0.1.0"

_LAZY = dict.fromkeys(("PrivacyEngine", "compare_runs", "fit", "load_run"), "privopt.api")

__all__ = ["PrivacyEngine", "__version__", "compare_runs", "fit", "load_run"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'privopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
