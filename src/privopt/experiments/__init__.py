"""Paper reproductions. Each module provides ``add_arguments(parser)`` and ``main(args) -> int``
and is listed here under its ``privopt reproduce NAME`` name.

Registration names the module without importing it: the CLI imports an experiment only when
its command is run (so ``privopt --help`` does not load torch), and checks the experiment's
optional dependencies (``requires``) before any work starts.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from types import ModuleType

from privopt.errors import ConfigError
from privopt.registry import Registry


@dataclass(frozen=True)
class Experiment:
    """A registered reproduction: its module (imported on use), one-line help, and optional
    dependencies as ``{import name: what to install}``."""

    name: str
    module: str
    help_text: str
    requires: dict[str, str] = field(default_factory=dict)

    def load(self) -> ModuleType:
        try:
            return importlib.import_module(self.module)
        except ModuleNotFoundError as e:  # a plugin's registration naming a module that is not there
            if not (e.name and (self.module == e.name or self.module.startswith(e.name + "."))):
                raise
            raise ConfigError(
                f"experiment {self.name!r}: no module named {self.module!r} (register_experiment names the module "
                "that provides add_arguments(parser) and main(args); in a plugin file, its __name__)"
            ) from None

    def check_requirements(self) -> None:
        """Raise :class:`ConfigError` naming what to install when an optional dependency is missing."""
        missing = [(mod, hint) for mod, hint in self.requires.items() if importlib.util.find_spec(mod) is None]
        if missing:
            what = ", ".join(mod for mod, _ in missing)
            install = " ".join(sorted({f"'{hint}'" for _, hint in missing}))
            raise ConfigError(
                f"privopt reproduce {self.name} needs {what}, which is not installed: pip install {install}"
            )


_EXPERIMENTS: Registry[Experiment] = Registry("experiment")


def register_experiment(name: str, module: str, help_text: str, *, requires: dict[str, str] | None = None) -> None:
    """Make ``privopt reproduce NAME`` run ``module`` (a module name, imported when the command runs:
    its ``add_arguments(parser)`` adds the options and ``main(args) -> int`` runs it); a plugin file
    registers itself with ``__name__`` and is named with ``privopt reproduce --plugin FILE NAME``.
    ``requires`` maps optional import names to what to install, checked before any work."""
    _EXPERIMENTS.add(name, Experiment(name, module, help_text, dict(requires or {})))


def experiment_entries() -> dict[str, Experiment]:
    """The registered experiments by name (nothing is imported)."""
    return _EXPERIMENTS.entries()


def available_experiments() -> dict[str, str]:
    return {name: e.help_text for name, e in experiment_entries().items()}


def experiment_modules() -> dict[str, tuple[ModuleType, str]]:
    """Every experiment's module, imported (slow: prefer :func:`experiment_entries`)."""
    return {name: (e.load(), e.help_text) for name, e in experiment_entries().items()}


register_experiment(
    "dpsgd-vs-opacus",
    "privopt.experiments.dpsgd_opacus",
    "DP-SGD beside Opacus on MNIST (MLP-128, same setting)",
    requires={"opacus": "privopt[bench]"},
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
    "Paper B Figs 1-2 + l1: DP-SVRG / DP-SVRG++ / DP-AMD vs DP-GD on Covertype, tuned schedules",
)
register_experiment(
    "worst-group",
    "privopt.experiments.worst_group",
    "Paper D: DP worst-group risk minimisation (phased ERM, DP-OCO+EXP3, Noisy-SGD-MGR/AGS) vs DP-SGD",
)
