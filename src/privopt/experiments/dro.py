"""Paper A's experiments: DP DRO methods compared on imbalanced image tasks (the public entry point).

``privopt reproduce dro-table3`` / ``dro-mia`` and :func:`run_dro_table3` / :func:`run_dro_mia`.
The code is split by responsibility:

* :mod:`privopt.experiments.dro_protocol` — methods, budgets, datasets, tuning grids, the paper's
  tables and how a grid point becomes each method's hyper-parameters;
* :mod:`privopt.experiments.dro_runner` — one run through the shared training loop, the tuning
  search and the grid of final runs (secret randomness by default, ``insecure_seed`` opt-in);
* :mod:`privopt.experiments.dro_report` — tables, figures, the two reproductions and the CLI.

Python API: :func:`run_dro_table3` and :func:`run_dro_mia` accept a dataset name or your own
:class:`privopt.data.Dataset`, and a model name or a zero-argument factory returning your own
``nn.Module`` (see ``examples/own_model.py``). Protocol and results: ``docs/algorithms/dro.md``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from privopt.cliargs import DEVICES, add_plugin_option, add_run_outputs, float_list, positive_float, positive_int
from privopt.errors import ConfigError
from privopt.experiments.dro_protocol import (
    BUDGETS,
    DRO_DATASETS,
    METHOD_LABELS,
    MIA_EPSILONS,
    MIA_METHODS,
    NONPRIVATE_METHOD,
    PAPER_TABLE2,
    PAPER_TABLE3,
    TABLE3_EPSILONS,
    TABLE3_METHODS,
    Budget,
    load_dro_dataset,
    method_params,
)
from privopt.experiments.dro_report import format_table, run_dro_mia, run_dro_table3

__all__ = [
    "BUDGETS",
    "DRO_DATASETS",
    "METHOD_LABELS",
    "MIA_EPSILONS",
    "MIA_METHODS",
    "NONPRIVATE_METHOD",
    "PAPER_TABLE2",
    "PAPER_TABLE3",
    "TABLE3_EPSILONS",
    "TABLE3_METHODS",
    "Budget",
    "add_arguments",
    "format_table",
    "load_dro_dataset",
    "main",
    "method_params",
    "run_dro_mia",
    "run_dro_table3",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``dro-table3`` and ``dro-mia`` (defaults depend on the command)."""
    parser.add_argument(
        "--dataset", choices=sorted(DRO_DATASETS), help="dataset (dro-table3: required; dro-mia: default cifar10-st)"
    )
    parser.add_argument("--data-dir", help="folder with one sub-folder per dataset (default $PRIVOPT_DATA)")
    parser.add_argument(
        "--epsilons", type=float_list, help="comma-separated ε (dro-table3: 0.5,1,5,10; dro-mia: 0.1,1,3,5,8,10)"
    )
    parser.add_argument("--seeds", type=positive_int, help="runs per setting (dro-table3: 3, dro-mia: 5)")
    parser.add_argument(
        "--budget",
        choices=sorted(BUDGETS),
        default="quick",
        help="quick (default): CPU-sized model and schedule; paper: ResNet20-GN, batch 128, the project's grid",
    )
    parser.add_argument(
        "--model", help="model of every method, replacing the budget's and any per-method one (a registered model name)"
    )
    parser.add_argument("--methods", help="comma-separated algorithm names (default: the paper's)")
    stated = "every run's record states it"
    add_plugin_option(parser, what="--methods and --model can name", kinds="an algorithm, a model", stated=stated)
    parser.add_argument("--no-tune", action="store_true", help="skip tuning (budget-default lr/clip)")
    parser.add_argument(
        "--tune-at", type=tune_at_value, metavar="EACH|EPS",
        help="tune every method at each ε ('each') or at one ε whose best setting every ε reuses "
        "(default: the budget's, each for quick and paper)",
    )  # fmt: skip
    parser.add_argument(
        "--tune-repeats", type=positive_int, metavar="N",
        help="runs per tuning grid point, scored by their mean (each draws its own noise; default: the "
        "budget's, 1 for quick and paper)",
    )  # fmt: skip
    parser.add_argument(
        "--device", choices=DEVICES, default="cpu", help="run every training on cpu or cuda (default cpu)"
    )
    add_run_outputs(parser, jobs=True)


def tune_at_value(text: str) -> str | float:
    """``--tune-at``: ``"each"`` or one ε > 0.

    Example:
        >>> tune_at_value("each"), tune_at_value("2")
        ('each', 2.0)
    """
    return "each" if text.strip().lower() == "each" else positive_float(text)


def _budget(name: str, tune_at: str | float | None, tune_repeats: int | None = None) -> str | Budget:
    """The named budget, tuned at ``tune_at`` and with ``tune_repeats`` instead of its own settings when given."""
    if tune_at is None and tune_repeats is None:
        return name
    budget = BUDGETS[name]
    if tune_at is not None:
        where = "each" if tune_at == "each" else f"ε = {tune_at:g}"
        budget = replace(budget, name=f"{budget.name}, tuned at {where}", tune_at=tune_at)
    if tune_repeats is not None:
        budget = replace(budget, name=f"{budget.name}, {tune_repeats} run(s) per grid point", tune_repeats=tune_repeats)
    return budget


def main(args: argparse.Namespace) -> int:
    """Entry point of ``privopt reproduce dro-table3`` / ``dro-mia``."""
    from privopt.models import available_models
    from privopt.plugins import import_plugins

    import_plugins(args.plugin)  # before any name is checked: --methods and --model may name what they register
    mia = getattr(args, "experiment", "dro-table3") == "dro-mia"
    dataset = args.dataset or ("cifar10-st" if mia else None)
    if dataset is None:
        raise ConfigError("dro-table3 needs --dataset (one of " + ", ".join(sorted(DRO_DATASETS)) + ")")
    if args.model is not None and args.model not in available_models():  # before any training
        raise ConfigError(f"unknown model {args.model!r}; available: {', '.join(available_models())}")
    default_methods = MIA_METHODS if mia else TABLE3_METHODS
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else list(default_methods)
    quiet = args.quiet or args.json
    common = dict(
        dataset=dataset,
        data_dir=args.data_dir,
        budget=_budget(args.budget, getattr(args, "tune_at", None), getattr(args, "tune_repeats", None)),
        methods=methods,
        model=args.model,
        out_dir=args.out,
        tune=not args.no_tune,
        log=(lambda s: None) if quiet else None,
        insecure_seed=getattr(args, "insecure_seed", None),
        device=getattr(args, "device", "cpu"),
        jobs=getattr(args, "jobs", 1),
        plugins=args.plugin,
    )
    if mia:
        res = run_dro_mia(epsilons=args.epsilons or MIA_EPSILONS, seeds=args.seeds or 5, **common)
    else:
        res = run_dro_table3(epsilons=args.epsilons or TABLE3_EPSILONS, seeds=args.seeds or 3, **common)
    if args.json:
        print(json.dumps(res["summary"], default=str))
    elif not args.quiet:
        print("\n" + res["markdown"])
        print(f"outputs in {res['out_dir']}")
    if res["mia_violations"]:
        n_bad = len(res["mia_violations"])
        print(
            f"privopt: {n_bad} DP run(s) exceed the membership-inference cap — this is a privacy bug, see "
            "table/summary",
            flush=True,
        )
        return 1
    return 0
