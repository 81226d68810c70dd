"""Paper reproductions. Each module provides ``add_arguments(parser)`` and ``main(args) -> int``
and is listed here under its ``privopt reproduce NAME`` name."""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> (module, one-line help). Modules are imported only when the CLI is built.
_EXPERIMENTS: dict[str, tuple[str, str]] = {}


def register_experiment(name: str, module: str, help_text: str) -> None:
    _EXPERIMENTS[name] = (module, help_text)


def available_experiments() -> dict[str, str]:
    return {name: help_text for name, (_, help_text) in sorted(_EXPERIMENTS.items())}


def experiment_modules() -> dict[str, tuple[ModuleType, str]]:
    return {name: (importlib.import_module(mod), h) for name, (mod, h) in sorted(_EXPERIMENTS.items())}


register_experiment(
    "dpsgd-vs-opacus", "privopt.experiments.dpsgd_opacus", "DP-SGD beside Opacus on MNIST (MLP-128, same setting)"
)
register_experiment(
    "dro-table3",
    "privopt.experiments.dro",
    "Paper A Table 3 / Figs 1-3: DP DRO methods, accuracy, AUC, F1, gradient norm, MIA",
)
register_experiment(
    "dro-mia",
    "privopt.experiments.dro",
    "Paper A Table 2: membership-inference AUC of the DP SPIDER methods vs the DP cap",
)
register_experiment(
    "sosp",
    "privopt.experiments.sosp",
    "Paper C Figs 1-2: Gauss-PSGD vs the Liu et al. baseline and DP-SGD on 1-10 clients (MNIST / CIFAR-10)",
)
register_experiment(
    "erm-covertype",
    "privopt.experiments.erm_covertype",
    "Paper B Figs 1-2: DP-SVRG / DP-SVRG++ vs DP-GD optimality gap on Covertype",
)
