"""privopt: differentially private optimization of robust and non-convex objectives on PyTorch.

``privopt.PrivacyEngine`` (DP-SGD in your own training loop) and ``privopt.fit`` (any algorithm in
one call) are imported on first use, so ``import privopt`` (and the CLI's ``--help``) stays fast.
See ``docs/api.md``.
"""

__version__ = "0.1.0"

_LAZY = {"PrivacyEngine": "privopt.api", "fit": "privopt.api"}

__all__ = ["PrivacyEngine", "__version__", "fit"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'privopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
